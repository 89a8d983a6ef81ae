"""Lightning's overhead and SparseDistPrefetch's speed-up on the sharded DLRM of bench_dmp.py.

Model and data: the configuration of ``benchmarks/bench_dmp.py`` -- 13 dense features, 26 tables x
100k rows x dim 64 (one feature each), bottom MLP 512-256-64, top MLP 512-256-1, fused row-wise
Adagrad (lr 0.01) for the tables, Adagrad (lr 0.01) for the dense part, batch 2048 per rank, 2 gloo
ranks with one intra-op thread each, pre-generated in-memory batches (so data loading does not
dominate). Three contenders, in the same processes, on the same plan and the same batches:

* ``bare``: the plain ``DistributedModelParallel`` loop (``model(dense, kjt)``, BCE, ``zero_grad``,
  ``backward``, ``step``) with the optimizer ``RecModule.configure_optimizers`` builds;
* ``lightning``: ``Trainer.fit`` + ``RecStrategy`` of a ``RecModule`` (its own ``training_step``,
  logging and optimizer), reading the batches through a ``DataLoader(batch_size=None)``; progress
  bar, logger, checkpointing and model summary are off;
* ``lightning+prefetch``: the same with the ``SparseDistPrefetch`` callback.

After ``--warmup`` steps, ``--repeats`` cycles each time one window of ``--steps`` steps per
contender, in an order that rotates from cycle to cycle. One ``Trainer.fit`` runs both Lightning
contenders (the callback is switched on for the windows of the second); a callback runs the bare
windows on a second model at the window boundaries. Neighbouring windows thus share the machine's
load of the moment (the machine is shared; its load drifts). Ranks meet at a barrier at every
window boundary. The median window gives each contender's global samples/s; overhead and speed-up
are medians of per-cycle ratios. Also printed: the CPU time of rank 0's training thread per step
(less sensitive to other jobs' load than wall time), and the serial latency of one input dist,
which is what ``SparseDistPrefetch`` takes off the critical path (so the most it can save).

Run::

    python benchmarks/bench_lightning.py                                  # full size, 2 ranks
    python benchmarks/bench_lightning.py --rows 20000 --batch-size 512 --steps 5 --repeats 3   # quick
    python benchmarks/bench_lightning.py --out bench_lightning.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

NUM_TABLES, DIM, DENSE_IN = 26, 64, 13
BOTTOM, TOP = [512, 256, 64], [512, 256, 1]
LR = 0.01
CONTENDERS = ("bare", "lightning", "lightning+prefetch")


# ---------------------------------------------------------------------------------------------
# model, plan, data


def _module(args: argparse.Namespace) -> Any:
    from lightrec.lightning import RecModule
    from lightrec.models import DLRM
    from lightrec.modules.embedding_configs import EmbeddingBagConfig
    from lightrec.modules.embedding_modules import EmbeddingBagCollection

    class BenchDLRM(RecModule):
        def __init__(self) -> None:
            super().__init__(dense_optimizer="adagrad", dense_lr=LR)
            torch.manual_seed(0)
            tables = [EmbeddingBagConfig(num_embeddings=args.rows, embedding_dim=DIM, name=f"t{t}",
                                         feature_names=[f"f{t}"]) for t in range(NUM_TABLES)]  # fmt: skip
            self.model = DLRM(EmbeddingBagCollection(tables, device="meta"), DENSE_IN, BOTTOM, TOP)

        def forward(self, dense: torch.Tensor, sparse: Any) -> torch.Tensor:
            return self.model(dense, sparse)

    return BenchDLRM()


def _fused_params() -> dict[str, Any]:
    return {"optimizer": "exact_row_wise_adagrad", "learning_rate": LR}


def _plan(args: argparse.Namespace) -> Any:
    """One plan for every contender (collective: rank 0 plans, every rank receives it)."""
    from lightrec.distributed import EmbeddingBagCollectionSharder
    from lightrec.distributed.planner import (
        EmbeddingShardingPlanner,
        Topology,
        construct_module_sharding_plan,
        row_wise,
        table_wise,
    )
    from lightrec.distributed.types import ShardingPlan

    module = _module(args)
    ebc = module.model.sparse_arch.embedding_bag_collection
    path = "model.sparse_arch.embedding_bag_collection"
    world = dist.get_world_size()
    if args.plan == "planner":
        sharder = EmbeddingBagCollectionSharder(fused_params=_fused_params())
        planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"))
        return planner.collective_plan(module, [sharder], dist.group.WORLD)
    per = max(1, NUM_TABLES // world)
    gens = {c.name: (row_wise() if args.plan == "row_wise" else table_wise(rank=min(i // per, world - 1)))
            for i, c in enumerate(ebc.embedding_bag_configs())}  # fmt: skip
    return ShardingPlan({path: construct_module_sharding_plan(ebc, gens, world_size=world)})


def _batches(rank: int, args: argparse.Namespace) -> list[Any]:
    from lightrec.data import Batch
    from lightrec.sparse import KeyedJaggedTensor

    g = torch.Generator().manual_seed(1234 + rank)
    keys = [f"f{t}" for t in range(NUM_TABLES)]
    out = []
    for _ in range(args.num_batches):
        lengths = torch.full((NUM_TABLES * args.batch_size,), args.pooling_factor, dtype=torch.int64)
        values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
        out.append(Batch(
            dense_features=torch.randn(args.batch_size, DENSE_IN, generator=g),
            sparse_features=KeyedJaggedTensor(keys=keys, values=values, lengths=lengths),
            labels=torch.randint(0, 2, (args.batch_size,), generator=g).float(),
        ))  # fmt: skip
    return out


class _Cycle(torch.utils.data.Dataset):
    """``length`` items cycling over the pre-generated batches (read with ``batch_size=None``)."""

    def __init__(self, batches: list[Any], length: int) -> None:
        self.batches, self.length = batches, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        return self.batches[i % len(self.batches)]


# ---------------------------------------------------------------------------------------------
# timing: one Trainer.fit, bare-loop windows run in between its windows


class _Clock:
    """Barrier, then wall and thread-CPU clocks; ``lap`` records the time since the previous mark."""

    def __init__(self) -> None:
        self._mark: tuple[float, float] | None = None

    def mark(self) -> None:
        dist.barrier()
        self._mark = (time.perf_counter(), time.thread_time())

    def lap(self) -> tuple[float, float]:
        assert self._mark is not None
        start = self._mark
        self.mark()
        return self._mark[0] - start[0], self._mark[1] - start[1]


class _Bare:
    """The plain DMP loop on its own copy of the model (same plan, data and optimizer set-up)."""

    def __init__(self, args: argparse.Namespace, plan: Any, batches: list[Any]) -> None:
        from lightrec.distributed import DistributedModelParallel, EmbeddingBagCollectionSharder

        module = _module(args)
        sharders = [EmbeddingBagCollectionSharder(fused_params=_fused_params())]
        self.dmp = DistributedModelParallel(module, device=torch.device("cpu"), plan=plan, sharders=sharders)
        self.optimizer = module.configure_optimizers()  # RecModule's CombinedOptimizer (constant LR)
        self.batches = batches
        self.step = 0

    def input_dist_ms(self, steps: int) -> list[float]:
        """Wall ms of one whole input dist (both exchanges), serial, per step of ``steps`` extra steps:
        the latency ``SparseDistPrefetch`` takes off the critical path, so the most it can save."""
        pipeline = self.dmp.pipeline
        out = []
        for _ in range(steps):
            kjt = self.batches[self.step % len(self.batches)].sparse_features
            dist.barrier()
            start = time.perf_counter()
            pipeline.start(kjt)
            pipeline.progress()
            pipeline.cancel(wait=True)  # waits for the lengths/values exchange
            out.append(1000 * (time.perf_counter() - start))
            self.run(1)
        return out

    def run(self, steps: int) -> None:
        for _ in range(steps):
            batch = self.batches[self.step % len(self.batches)]
            self.step += 1
            logits = self.dmp(batch.dense_features, batch.sparse_features).reshape(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()


def _measure(args: argparse.Namespace, plan: Any, batches: list[Any]) -> dict[str, Any]:
    """``repeats`` cycles of one window (``steps`` steps) per contender, the order rotating per cycle.

    One ``Trainer.fit`` runs both Lightning contenders: the prefetch callback is switched on for
    the steps of ``lightning+prefetch`` windows (its decision at the start of step k concerns
    batch k+1, so it follows the window of step k+1: every step of a window is in the steady state
    of its mode). Bare windows run on a second model, from a callback at the window boundaries.
    Close interleaving makes the comparison robust to drifting machine load; the rotation spreads
    the cost of switching models (cold caches) over both Lightning contenders.
    """
    import lightning.pytorch as pl

    from lightrec.lightning import RecStrategy
    from lightrec.lightning.callbacks.sparse_dist_prefetch import SparseDistPrefetch

    bare = _Bare(args, plan, batches)
    clock = _Clock()
    seconds: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    cpu: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    warmup, steps = args.warmup, args.steps
    order = [c for r in range(args.repeats) for c in CONTENDERS[r % 3 :] + CONTENDERS[: r % 3]]
    lightning_windows = [c for c in order if c != CONTENDERS[0]]
    # bare windows due before Lightning window j (j == len: at the end)
    bare_before = [order[:i].count(CONTENDERS[0]) for i, c in enumerate(order) if c != CONTENDERS[0]]
    bare_before.append(args.repeats)
    bare_done = 0

    def label(step: int) -> str | None:
        """The Lightning contender timed at ``step`` (warm-up: prefetch on; after the last window: None)."""
        if step < warmup:
            return CONTENDERS[2]
        j = (step - warmup) // steps
        return lightning_windows[j] if j < len(lightning_windows) else None

    def time_window(name: str) -> None:
        wall, thread = clock.lap()
        seconds[name].append(wall)
        cpu[name].append(thread / steps)

    class Switchable(SparseDistPrefetch):
        on = True

        def on_train_batch_start(self, *a: Any, **k: Any) -> None:
            if self.on:
                super().on_train_batch_start(*a, **k)

    prefetch = Switchable()

    class Scheduler(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, *_: Any) -> None:
            nonlocal bare_done
            k = trainer.global_step
            if k == 0:
                bare.run(warmup)
            if k >= warmup and (k - warmup) % steps == 0:
                j = (k - warmup) // steps
                if j > 0:  # close the Lightning window that ends here
                    time_window(lightning_windows[j - 1])
                while bare_done < bare_before[min(j, len(lightning_windows))]:
                    clock.mark()
                    bare.run(steps)
                    time_window(CONTENDERS[0])
                    bare_done += 1
                clock.mark()
            prefetch.on = label(k + 1) == CONTENDERS[2]

    windows = len(lightning_windows)
    total = warmup + windows * steps + 1  # the last step only closes the last window
    loader = torch.utils.data.DataLoader(_Cycle(batches, total), batch_size=None)
    trainer = pl.Trainer(
        accelerator="cpu", devices=dist.get_world_size(), max_steps=total,
        strategy=RecStrategy(plan=plan, fused_params=_fused_params()),
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, use_distributed_sampler=False,
        callbacks=[Scheduler(), prefetch],  # the scheduler first: it switches the prefetch for this step
        default_root_dir=tempfile.gettempdir(),
    )  # fmt: skip
    trainer.fit(_module(args), train_dataloaders=loader)
    input_dist = bare.input_dist_ms(2 * steps)
    world = dist.get_world_size()
    out: dict[str, Any] = {"input_dist_ms": input_dist, "world_batch": world * args.batch_size}
    for name in CONTENDERS:
        wall = torch.tensor(seconds[name], dtype=torch.float64)
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)  # a window lasts until the slowest rank is done
        out[name] = {
            "windows_samples_per_s": [world * args.batch_size * steps / s for s in wall.tolist()],
            "rank0_thread_cpu_ms_per_step": [1000 * c for c in cpu[name]],
        }
    return out


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), NODE_RANK="0", OMP_NUM_THREADS="1",
    )  # fmt: skip
    torch.set_num_threads(1)
    # Lightning's set-up chatter (device info, tips, "no val_dataloader", worker advice) is not the result
    # (its logger's level is set when lightning is imported: import it first).
    import lightning.pytorch  # noqa: F401

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module=r"lightning\..*")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=900))
    try:
        plan = _plan(args)
        runs = _measure(args, plan, _batches(rank, args))
        if rank == 0:
            queue.put({"plan": str(plan), "runs": runs})
    finally:
        dist.destroy_process_group()


def _summary(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in CONTENDERS:
        out[name] = {
            "global_samples_per_s": statistics.median(runs[name]["windows_samples_per_s"]),
            "rank0_thread_cpu_ms_per_step": statistics.median(runs[name]["rank0_thread_cpu_ms_per_step"]),
        }
    bare, light, pre = (runs[c]["windows_samples_per_s"] for c in CONTENDERS)
    # paired per cycle (neighbouring windows share the machine's load of the moment)
    out["lightning_overhead_pct_per_cycle"] = [100.0 * (b / x - 1.0) for b, x in zip(bare, light)]
    out["prefetch_speedup_per_cycle"] = [p / x for p, x in zip(pre, light)]
    out["lightning_overhead_pct"] = statistics.median(out["lightning_overhead_pct_per_cycle"])
    out["prefetch_speedup"] = statistics.median(out["prefetch_speedup_per_cycle"])
    out["prefetch_vs_bare"] = statistics.median(p / b for p, b in zip(pre, bare))
    out["input_dist_ms_median"] = statistics.median(runs["input_dist_ms"])
    out["bare_step_ms_median"] = 1000 * statistics.median(
        runs["world_batch"] / r for r in runs["bare"]["windows_samples_per_s"]
    )
    cb, cl = (out[c]["rank0_thread_cpu_ms_per_step"] for c in CONTENDERS[:2])
    out["lightning_overhead_cpu_pct"] = 100.0 * (cl / cb - 1.0)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--rows", type=int, default=100_000, help="rows per table")
    parser.add_argument("--batch-size", type=int, default=2048, help="samples per rank and step")
    parser.add_argument("--pooling-factor", type=int, default=1, help="ids per bag")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed window")
    parser.add_argument("--repeats", type=int, default=6, help="cycles: timed windows per contender")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--num-batches", type=int, default=4, help="distinct pre-generated batches per rank")
    parser.add_argument("--plan", choices=["planner", "table_wise", "row_wise"], default="planner")
    parser.add_argument("--out", help="write the JSON result here as well")
    args = parser.parse_args(argv)
    if min(args.steps, args.repeats, args.warmup) < 1:
        parser.error("--steps, --repeats and --warmup must be >= 1")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, args.world_size, port, args, queue))
        for r in range(args.world_size)
    ]
    for p in procs:
        p.start()
    result = queue.get(timeout=7200)
    for p in procs:
        p.join()
    summary = _summary(result["runs"])
    report = {
        "benchmark": "bench_lightning",
        "config": vars(args)
        | {
            "tables": NUM_TABLES,
            "dim": DIM,
            "bottom": BOTTOM,
            "top": TOP,
            "threads_per_rank": 1,
            "backend": "gloo",
        },
        "lightning_trainer": "progress bar, logger, checkpointing and model summary disabled; "
        "RecModule training_step (self.log calls kept) and configure_optimizers",
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "platform": platform.platform(),
        },
        "plan": result["plan"],
        "runs": result["runs"],
        "summary": summary,
    }
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(report, indent=2) + "\n")
    print(f"bench_lightning: {args.world_size} gloo ranks x 1 thread, {NUM_TABLES} tables x {args.rows} x {DIM}, "
          f"batch {args.batch_size}/rank, {args.repeats} cycles of windows of {args.steps} steps")  # fmt: skip
    print(
        "Lightning runs: progress bar, logger, checkpointing, model summary disabled (RecModule's logging kept)"
    )
    for name in CONTENDERS:
        s = summary[name]
        spread = ", ".join(f"{x / 1000:.1f}k" for x in result["runs"][name]["windows_samples_per_s"])
        print(f"  {name:<20} {s['global_samples_per_s']:>9,.0f} samples/s (median; windows {spread}); "
              f"rank-0 thread CPU {s['rank0_thread_cpu_ms_per_step']:.1f} ms/step")  # fmt: skip
    print(f"Lightning overhead vs bare DMP loop: {summary['lightning_overhead_pct']:+.1f}% wall (median of "
          f"per-cycle ratios), {summary['lightning_overhead_cpu_pct']:+.1f}% thread CPU; target <= 5%")  # fmt: skip
    print(f"SparseDistPrefetch speed-up: {summary['prefetch_speedup']:.3f}x over Lightning without it "
          f"(median of per-cycle ratios), {summary['prefetch_vs_bare']:.3f}x the bare loop")  # fmt: skip
    print(
        f"Input dist (what the prefetch takes off the critical path): {summary['input_dist_ms_median']:.1f} ms "
        f"of a {summary['bare_step_ms_median']:.0f} ms bare step (rank 0, serial)"
    )
    return report


if __name__ == "__main__":
    main()
