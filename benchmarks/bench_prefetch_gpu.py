"""SparseDistPrefetch on GPUs: training step time with and without the side-stream pipeline.

Needs CUDA (it exits with status 2 and a message otherwise). Run once so far, on one H200 with
``--gpus 1 --steps 50 --repeats 3``: 0.95x (docs/gpu.md); never on several GPUs.

Model and data: the sharded DLRM of ``benchmarks/bench_lightning.py`` (13 dense features,
26 tables x ``--rows`` x 64, bottom MLP 512-256-64, top MLP 512-256-1, fused row-wise Adagrad,
Adagrad for the dense part), ``--batch-size`` samples per rank, pre-generated batches in pinned host
memory (so the host-to-device copy is a real asynchronous copy, as with a pinned ``DataLoader``).
One process per GPU (``--gpus``, default: every visible GPU), NCCL, ``Trainer`` + ``RecStrategy``
with a plan from the planner for ``compute_device="cuda"`` (the same plan for every fit).

Contenders, alternating for ``--repeats`` rounds (the order flips every round):

* ``plain``: ``Trainer.fit`` without the callback: batch i's copy, input dist (with its host sync
  for the receive sizes), lookup and the rest all on the main stream, in series;
* ``prefetch``: with ``SparseDistPrefetch``: batch i+1's copy and input dist on a side stream,
  overlapping step i.

Each fit runs ``--warmup`` steps, then ``--steps`` timed steps (the GPU is synchronised at both ends
of the window; the slowest rank's time counts). Printed (JSON, also to ``--out``): median global
samples/s and step time of each contender, the median per-round speed-up, and the *exposed*
input-dist latency -- one input dist run alone (start, progress, wait; synchronised), the most the
pipeline can take off a step. ``--profile DIR`` also writes a ``torch.profiler`` trace of a few
pipelined steps on rank 0 (open it in Perfetto: the side stream's copies and all-to-alls should lie
under the main stream's kernels).

Run::

    python benchmarks/bench_prefetch_gpu.py                                   # every visible GPU
    python benchmarks/bench_prefetch_gpu.py --gpus 1 --steps 50 --repeats 3   # one GPU, quick
    python benchmarks/bench_prefetch_gpu.py --out bench_prefetch_gpu.json --profile traces/
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_lightning as base  # noqa: E402  (the same model and batches)

CONTENDERS = ("plain", "prefetch")


def _plan(args: argparse.Namespace) -> Any:
    """The planner's plan for GPUs (collective: rank 0 plans, every rank receives it)."""
    from lightrec.distributed import EmbeddingBagCollectionSharder
    from lightrec.distributed.planner import EmbeddingShardingPlanner, Topology

    world = dist.get_world_size()
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cuda"))
    sharder = EmbeddingBagCollectionSharder(fused_params=base._fused_params())
    return planner.collective_plan(base._module(args), [sharder], dist.group.WORLD)


class _Window:
    """Times steps ``[warmup, warmup + steps)`` of one fit, the GPU synchronised at both ends."""

    def __init__(self, warmup: int) -> None:
        import lightning.pytorch as pl

        outer = self

        class Callback(pl.Callback):
            def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
                if trainer.global_step == warmup:
                    torch.cuda.synchronize()
                    outer.started = time.perf_counter()

            def on_train_end(self, trainer: Any, module: Any) -> None:
                torch.cuda.synchronize()
                outer.seconds = time.perf_counter() - outer.started

        self.callback = Callback()
        self.started = self.seconds = 0.0


def _fit(
    args: argparse.Namespace, plan: Any, batches: list[Any], prefetch: bool, profile: str | None
) -> float:
    """One fit; returns the slowest rank's seconds for the timed window."""
    import lightning.pytorch as pl

    from lightrec.lightning import RecStrategy, SparseDistPrefetch

    window = _Window(args.warmup)
    callbacks: list[Any] = [window.callback] + ([SparseDistPrefetch()] if prefetch else [])
    total = args.warmup + args.steps
    trainer = pl.Trainer(
        accelerator="gpu", devices=dist.get_world_size(), max_steps=total, num_sanity_val_steps=0,
        limit_val_batches=0, strategy=RecStrategy(plan=plan, fused_params=base._fused_params()), logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(base._Cycle(batches, total), batch_size=None)
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            trainer.fit(base._module(args), loader)
        prof.export_chrome_trace(os.path.join(profile, f"prefetch_rank{dist.get_rank()}.json"))
    else:
        trainer.fit(base._module(args), loader)
    seconds = torch.tensor([window.seconds], device="cuda")
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return float(seconds)


def _exposed_input_dist_ms(
    args: argparse.Namespace, plan: Any, batches: list[Any], rounds: int = 20
) -> float:
    """One input dist alone (start, progress, wait; synchronised), median of ``rounds``, in ms."""
    from lightrec.distributed import DistributedModelParallel, EmbeddingBagCollectionSharder

    model = DistributedModelParallel(
        base._module(args), device=torch.device("cuda", torch.cuda.current_device()), plan=plan,
        sharders=[EmbeddingBagCollectionSharder(fused_params=base._fused_params())], init_data_parallel=False,
    )  # fmt: skip
    pipeline = model.pipeline
    kjt = batches[0].sparse_features.to(torch.device("cuda", torch.cuda.current_device()))
    times = []
    for _ in range(rounds):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pipeline.start(kjt)
        pipeline.progress()
        pipeline.cancel(wait=True)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _worker(rank: int, world: int, init: str, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), NODE_RANK="0")  # fmt: skip
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(minutes=10))  # fmt: skip
    try:
        plan = _plan(args)
        batches = [b.pin_memory() for b in base._batches(rank, args)]
        seconds: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        for r in range(args.repeats):
            order = CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]
            for name in order:
                seconds[name].append(_fit(args, plan, batches, name == "prefetch", None))
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
            _fit(
                argparse.Namespace(**{**vars(args), "warmup": 2, "steps": 6}),
                plan,
                batches,
                True,
                args.profile,
            )
        exposed = _exposed_input_dist_ms(args, plan, batches)
        if rank == 0:
            queue.put({"seconds": seconds, "exposed_input_dist_ms": exposed, "world": world})
    finally:
        dist.destroy_process_group()


def _summary(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    samples = args.steps * args.batch_size * raw["world"]
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
        "gpus": raw["world"], "rows": args.rows, "batch_size_per_rank": args.batch_size, "steps": args.steps,
        "repeats": args.repeats, "exposed_input_dist_ms": round(raw["exposed_input_dist_ms"], 3),
    }  # fmt: skip
    for name in CONTENDERS:
        median = statistics.median(raw["seconds"][name])
        out[name] = {
            "samples_per_sec": round(samples / median),
            "step_ms": round(median / args.steps * 1e3, 3),
        }
    ratios = [p / q for p, q in zip(raw["seconds"]["plain"], raw["seconds"]["prefetch"], strict=True)]
    out["speedup"] = round(statistics.median(ratios), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gpus", type=int, default=None, help="processes, one per GPU (default: every visible GPU)"
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--pooling-factor", type=int, default=1)
    parser.add_argument("--num-batches", type=int, default=8, help="distinct pre-generated batches per rank")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="also write the JSON summary here")
    parser.add_argument(
        "--profile", default=None, help="write a torch.profiler trace of pipelined steps here"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "bench_prefetch_gpu: no CUDA device is visible; this benchmark measures GPU streams only",
            file=sys.stderr,
        )
        return 2
    world = args.gpus or torch.cuda.device_count()
    if not 1 <= world <= torch.cuda.device_count():
        parser.error(f"--gpus must be between 1 and {torch.cuda.device_count()}, got {world}")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "pg")
        procs = [ctx.Process(target=_worker, args=(r, world, init, args, queue)) for r in range(world)]
        for p in procs:
            p.start()
        raw = queue.get(timeout=3600)  # a rank that died leaves the queue empty
        for p in procs:
            p.join()
    summary = _summary(raw, args)
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
