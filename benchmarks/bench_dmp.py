"""Sharded DLRM training throughput on gloo ranks: lightrec's DistributedModelParallel vs torchrec's.

Model (the issue's benchmark): 13 dense features, 26 tables x 100k rows x dim 64 (one feature each),
bottom MLP 512-256-64, top MLP 512-256-1, fused row-wise Adagrad for the tables, Adagrad for the
dense part, batch 2048 per rank, 2 gloo ranks with one intra-op thread each. Every rank trains on
pre-generated synthetic batches (ids uniform, ``--pooling-factor`` ids per bag), so the numbers
measure the training step, not data loading.

``--mode embedding`` drops the dense compute (no MLPs, no interaction): the logit is a fixed
projection of the pooled embeddings (a buffer, not trained), so the step is input dist, lookup,
output dist forward and backward and the fused update alone -- the embedding system's own speed.

Every run also reports, for both libraries, every rank's **per-phase breakdown** of a step (input dist,
lookup, output dist forward / backward, fused update, dense forward, dense backward, dense
all-reduce, optimizer, other), from one extra window per library with the phase timers of
``dmp_phases.py`` switched on (the throughput windows run without them), and which all-reduce
lightrec's dense part took (``dense_allreduce``: shared memory on CPU gloo ranks of one host;
``LIGHTREC_SHM_ALLREDUCE=0 python benchmarks/bench_dmp.py`` measures it with gloo's). ``--against
gloo-allreduce`` runs lightrec against itself with DDP's gloo all-reduce instead of torchrec (alternating
windows in the same processes, as below): the before / after of that all-reduce alone. ``--against
fbgemm-kernel`` runs lightrec with the torch kernel (``LIGHTREC_CPU_KERNEL=torch``) against lightrec with
fbgemm's TBE (``=fbgemm``), the rest alike: what the fused CPU kernel choice is worth in this model.
``--against unplaced`` runs lightrec against itself with its lookups not writing into the shared-memory
exchange (``PooledOutputDist.prepare`` off; the torch kernel on both sides): what that is worth.

Run::

    python benchmarks/bench_dmp.py                      # 2 ranks, JSON to stdout
    python benchmarks/bench_dmp.py --mode embedding --repeats 8
    python benchmarks/bench_dmp.py --out results.json --repeats 9 --plan row_wise

torchrec is measured in the same run when ``import torchrec`` works (it is not a lightrec
dependency; install torchrec 1.8.0 with ``--no-deps`` in a separate venv to compare); otherwise
the script says so and reports lightrec alone.

Fairness on a shared machine:

* Both models live in the same rank processes and their timed windows *alternate* (lightrec,
  torchrec, torchrec, lightrec, ...), so a burst of load from other jobs hits both alike; the
  report gives each side's median window and the median of the per-pair ratios.
* ``--malloc-tuning`` (default on) starts the rank processes with a fixed glibc malloc policy
  (``MALLOC_MMAP_THRESHOLD_=32 MiB``, ``MALLOC_TRIM_THRESHOLD_=1 GiB``). With glibc's default
  adaptive policy a rank re-faults freshly mapped pages for its multi-MiB activations at random
  steps: measured 0 to 17k minor page faults per step (10-25 ms of CPU), different per rank and
  per run, for both frameworks. The fixed policy keeps freed memory in the heap, so neither side
  pays it; ``--no-malloc-tuning`` measures with the default.
* Besides wall-clock throughput, rank 0's CPU time per step is reported for its training thread
  and for the whole process (gloo's communication threads included), which other jobs on the
  machine disturb much less than wall-clock time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # dmp_phases, beside this file
import dmp_phases  # noqa: E402

NUM_TABLES, ROWS, DIM, DENSE_IN = 26, 100_000, 64, 13
BOTTOM, TOP = [512, 256, 64], [512, 256, 1]


def _batches(
    rank: int, args: argparse.Namespace, kjt_cls: Any
) -> list[tuple[torch.Tensor, Any, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234 + rank)
    out = []
    keys = [f"f{t}" for t in range(NUM_TABLES)]
    for _ in range(args.num_batches):
        lengths = torch.full((NUM_TABLES * args.batch_size,), args.pooling_factor, dtype=torch.int64)
        values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
        kjt = kjt_cls(keys=keys, values=values, lengths=lengths)
        dense = torch.randn(args.batch_size, DENSE_IN, generator=g)
        labels = torch.randint(0, 2, (args.batch_size,), generator=g).float()
        out.append((dense, kjt, labels))
    return out


class _SparseOnly(torch.nn.Module):
    """``--mode embedding``: a fixed projection of the pooled embeddings (no dense compute)."""

    def __init__(self, ebc: torch.nn.Module) -> None:
        super().__init__()
        self.ebc = ebc
        proj = (
            torch.randn(NUM_TABLES * DIM, generator=torch.Generator().manual_seed(0))
            / (NUM_TABLES * DIM) ** 0.5
        )
        self.register_buffer("proj", proj)

    def forward(self, dense: torch.Tensor, kjt: Any) -> torch.Tensor:
        return (self.ebc(kjt).values() @ self.proj).unsqueeze(-1)


def _optimizer(dmp: Any, combined: Any, wrapper: Any, dense_filter: Any) -> Any:
    dense = dict(dense_filter(dmp.named_parameters()))
    if not dense:  # embedding-only: the fused optimizer alone
        return combined([dmp.fused_optimizer])
    return combined([dmp.fused_optimizer, wrapper(dense, lambda ps: torch.optim.Adagrad(ps, lr=0.01))])


def _lightrec_model(args: argparse.Namespace, shm_allreduce: bool = True) -> tuple[Any, Any, Any]:
    from lightrec.distributed import DistributedModelParallel, EmbeddingBagCollectionSharder
    from lightrec.distributed.model_parallel import DefaultDataParallelWrapper
    from lightrec.distributed.planner import construct_module_sharding_plan, row_wise, table_wise
    from lightrec.distributed.types import ShardingPlan
    from lightrec.models import DLRM
    from lightrec.modules.embedding_configs import EmbeddingBagConfig
    from lightrec.modules.embedding_modules import EmbeddingBagCollection
    from lightrec.optim import (
        CombinedOptimizer,
        EmbOptimType,
        KeyedOptimizerWrapper,
        in_backward_optimizer_filter,
    )
    from lightrec.sparse import KeyedJaggedTensor

    tables = [EmbeddingBagConfig(num_embeddings=ROWS, embedding_dim=DIM, name=f"t{t}", feature_names=[f"f{t}"])
              for t in range(NUM_TABLES)]  # fmt: skip
    ebc = EmbeddingBagCollection(tables, device="meta")
    model = DLRM(ebc, DENSE_IN, BOTTOM, TOP) if args.mode == "dlrm" else _SparseOnly(ebc)
    sharder = EmbeddingBagCollectionSharder(
        {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01}
    )
    world = dist.get_world_size()
    plan = None
    if args.plan in ("table_wise", "row_wise"):
        per = max(1, NUM_TABLES // world)
        gens = {t.name: (row_wise() if args.plan == "row_wise" else table_wise(rank=min(i // per, world - 1)))
                for i, t in enumerate(tables)}  # fmt: skip
        path = "sparse_arch.embedding_bag_collection" if args.mode == "dlrm" else "ebc"
        plan = ShardingPlan({path: construct_module_sharding_plan(ebc, gens, world_size=world)})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[sharder],
                                   data_parallel_wrapper=DefaultDataParallelWrapper(shm_allreduce=shm_allreduce))  # fmt: skip
    return (
        dmp,
        _optimizer(dmp, CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter),
        KeyedJaggedTensor,
    )


def _lightrec_gloo_allreduce_model(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """``--against gloo-allreduce``: lightrec with DDP's own (gloo) all-reduce of the dense gradients."""
    return _lightrec_model(args, shm_allreduce=False)


def _with_cpu_kernel(kernel: str) -> Any:
    """A builder of lightrec's model whose fused CPU groups run ``kernel`` (``LIGHTREC_CPU_KERNEL``, read
    when the kernels are built)."""

    def build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
        before = os.environ.get("LIGHTREC_CPU_KERNEL")
        os.environ["LIGHTREC_CPU_KERNEL"] = kernel
        try:
            return _lightrec_model(args)
        finally:
            if before is None:
                os.environ.pop("LIGHTREC_CPU_KERNEL")
            else:
                os.environ["LIGHTREC_CPU_KERNEL"] = before

    return build


def _unplaced(build: Any) -> Any:
    """A builder of ``build``'s model whose sharded lookups do not write into the shared-memory exchange:
    every ``PooledOutputDist`` of it declines to prepare (the exchange copies the lookup's output, as
    before ``prepare`` existed)."""

    def unplaced(args: argparse.Namespace) -> tuple[Any, Any, Any]:
        from lightrec.distributed.sharding.common import PooledOutputDist

        model, opt, kjt_cls = build(args)
        for module in model.modules():
            if isinstance(module, PooledOutputDist):
                module.prepare = lambda *_: None  # type: ignore[method-assign] # this instance only
        return model, opt, kjt_cls

    return unplaced


def _torchrec_model(args: argparse.Namespace) -> tuple[Any, Any, Any]:  # pragma: no cover - needs torchrec
    import torchrec
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.models.dlrm import DLRM
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    tables = [torchrec.EmbeddingBagConfig(num_embeddings=ROWS, embedding_dim=DIM, name=f"t{t}", feature_names=[f"f{t}"])
              for t in range(NUM_TABLES)]  # fmt: skip
    ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    if args.mode == "dlrm":
        model: torch.nn.Module = DLRM(embedding_bag_collection=ebc, dense_in_features=DENSE_IN,
                                      dense_arch_layer_sizes=BOTTOM, over_arch_layer_sizes=TOP)  # fmt: skip
    else:
        model = _SparseOnly(ebc)
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01}
    )
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), sharders=[sharder])
    return (
        dmp,
        _optimizer(dmp, CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter),
        torchrec.KeyedJaggedTensor,
    )


class _Contender:
    """One framework's model, optimizer and batches on this rank, and its timed windows."""

    def __init__(self, build: Any, rank: int, args: argparse.Namespace, library: str) -> None:
        self.model, self.opt, kjt_cls = build(args)
        self.clock = dmp_phases.PhaseClock()
        dmp_phases.install(self.clock, library)
        self.breakdown: dict[str, float] = {}
        self.batches = _batches(rank, args, kjt_cls)
        self.loss_fn = torch.nn.BCEWithLogitsLoss()
        self.rates: list[float] = []
        self.thread_cpu: list[float] = []
        self.process_cpu: list[float] = []

    def step(self, i: int) -> None:
        dense, kjt, labels = self.batches[i % len(self.batches)]
        with self.clock.phase("dense_fwd"):  # the embedding phases inside it are timed on their own
            loss = self.loss_fn(self.model(dense, kjt).squeeze(-1), labels)
        with self.clock.phase("optimizer"):
            self.opt.zero_grad()
        self.clock.backward(loss)
        with self.clock.phase("optimizer"):
            self.opt.step()

    def window(self, args: argparse.Namespace) -> float:
        """Time ``args.steps`` steps (collective); returns the global samples/s of the window."""
        world = dist.get_world_size()
        dist.barrier()
        start, start_cpu, start_proc = time.perf_counter(), time.thread_time(), _process_cpu()
        for i in range(args.steps):
            self.step(i)
        self.thread_cpu.append((time.thread_time() - start_cpu) / args.steps)
        self.process_cpu.append((_process_cpu() - start_proc) / args.steps)
        dist.barrier()
        seconds = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        rate = world * args.batch_size * args.steps / float(seconds)
        self.rates.append(rate)
        return rate

    def measure_phases(self, args: argparse.Namespace) -> None:
        """One more window with the phase timers on: rank 0's ms per step by phase."""
        dist.barrier()
        self.clock.reset()
        self.clock.enabled = True
        start = time.perf_counter()
        for i in range(args.steps):
            self.step(i)
        elapsed = time.perf_counter() - start
        self.clock.enabled = False
        self.breakdown = self.clock.per_step_ms(elapsed, args.steps)
        # Every rank's breakdown: a rank that waits long in an exchange is waiting for a peer, and
        # the peer's phases say which of its own phases that was.
        self.breakdown_by_rank: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(self.breakdown_by_rank, self.breakdown)

    def kernels(self) -> list[str]:
        """The lookup kernels this model runs (lightrec's ``backend_name``, with the kernel ``auto``'s trial
        chose where it built both, e.g. ``fbgemm|torch -> torch``; torchrec: fbgemm TBE)."""
        names = set()
        for m in self.model.modules():
            name = getattr(m, "backend_name", None)
            verdicts = getattr(getattr(m, "_backend", None), "verdicts", None) or {}
            if name:
                names.add(name + "".join(f" -> {v.kernel}" for v in verdicts.values()))
        return sorted(names) or ["fbgemm"]

    def report(self, args: argparse.Namespace) -> dict[str, Any]:
        median = statistics.median(self.rates)
        return {
            "steps_per_window": args.steps,
            "windows_samples_per_s": self.rates,
            "global_samples_per_s": median,
            "best_samples_per_s": max(self.rates),
            "ms_per_step_median": 1000.0 * dist.get_world_size() * args.batch_size / median,
            # CPU time per step on rank 0: robust to other load on the machine
            "rank0_thread_cpu_ms_per_step": 1000.0 * statistics.median(self.thread_cpu),
            "rank0_process_cpu_ms_per_step": 1000.0 * statistics.median(self.process_cpu),
            "phase_ms_per_step_by_rank": [{k: round(v, 2) for k, v in b.items()} for b in self.breakdown_by_rank],
            "kernels": self.kernels(),
            # lightrec's DistributedModelParallel says which all-reduce its dense part takes, and why
            "dense_allreduce": getattr(self.model, "dense_allreduce", "DDP's own (gloo)"),
        }


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _measure_all(rank: int, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if args.against == "fbgemm-kernel":  # lightrec with the torch kernel against lightrec with fbgemm's TBE
        contenders = {"lightrec": _Contender(_with_cpu_kernel("torch"), rank, args, "lightrec"),
                      args.against: _Contender(_with_cpu_kernel("fbgemm"), rank, args, "lightrec")}  # fmt: skip
        return _alternate(contenders, result, args)
    if args.against == "unplaced":  # the lookups writing into the exchange, or not (torch kernel both)
        contenders = {"lightrec": _Contender(_with_cpu_kernel("torch"), rank, args, "lightrec"),
                      args.against: _Contender(_unplaced(_with_cpu_kernel("torch")), rank, args, "lightrec")}  # fmt: skip
        return _alternate(contenders, result, args)
    contenders = {"lightrec": _Contender(_lightrec_model, rank, args, "lightrec")}
    if args.against == "gloo-allreduce":
        contenders[args.against] = _Contender(_lightrec_gloo_allreduce_model, rank, args, "lightrec")
        return _alternate(contenders, result, args)
    try:
        import torchrec  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not measured"
        result["torchrec"] = {"skipped": f"torchrec is not importable ({type(exc).__name__}: {exc})"}
    else:
        contenders["torchrec"] = _Contender(_torchrec_model, rank, args, "torchrec")
    return _alternate(contenders, result, args)


def _alternate(contenders: dict[str, _Contender], result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, then alternating timed windows, then one phase window each; ``result`` completed."""
    for c in contenders.values():
        for i in range(args.warmup):
            c.step(i)
    order = list(contenders.values())
    ratios = []
    for repeat in range(args.repeats):
        # Alternate which side goes first, so neither always runs right after the other.
        rates = {id(c): c.window(args) for c in (order if repeat % 2 == 0 else order[::-1])}
        if len(order) == 2:
            ratios.append(rates[id(order[0])] / rates[id(order[1])])
    for c in order:
        c.measure_phases(args)
    for name, c in contenders.items():
        result[name] = c.report(args)
    if ratios:
        result["paired_ratios"] = ratios
    return result


def _worker(rank: int, world: int, init: str, args: argparse.Namespace, queue: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=600)
    )
    try:
        result = _measure_all(rank, args)
        if rank == 0:
            queue.put(result)
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def rank_malloc_policy(enabled: bool = True) -> Iterator[None]:
    """Processes started inside read lightrec's default glibc malloc policy (``"tuned"``, what
    ``RecStrategy`` and ``lightrec run`` give every rank) from the environment as they start;
    the caller's environment is restored after. ``enabled=False``: glibc's adaptive default (the
    caller's own ``MALLOC_*`` thresholds are removed for them too)."""
    from lightrec._malloc_policy import MALLOC_POLICIES

    tuned = {k: str(v) for k, v in MALLOC_POLICIES["tuned"].items()}
    saved = {k: os.environ.get(k) for k in tuned}
    for k, v in tuned.items():
        if enabled:
            os.environ[k] = v
        else:
            os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=["dlrm", "embedding"], default="dlrm",
                        help="dlrm: the whole model; embedding: no dense compute (a fixed projection)")  # fmt: skip
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2048, help="samples per rank and step")
    parser.add_argument("--pooling-factor", type=int, default=1, help="ids per bag")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed window")
    parser.add_argument("--repeats", type=int, default=5, help="timed windows (the median is reported)")
    parser.add_argument("--warmup", type=int, default=100,
                        help="untimed steps per side (lightrec's auto CPU kernel times its first 86 training steps)")  # fmt: skip
    parser.add_argument("--num-batches", type=int, default=4, help="distinct pre-generated batches per rank")
    parser.add_argument("--plan", choices=["planner", "table_wise", "row_wise"], default="planner",
                        help="lightrec plan: its planner (default), contiguous table-wise, or all row-wise")  # fmt: skip
    parser.add_argument("--malloc-tuning", action=argparse.BooleanOptionalAction, default=True,
                        help="fixed glibc malloc thresholds in the rank processes (see above)")  # fmt: skip
    parser.add_argument("--against", choices=["torchrec", "gloo-allreduce", "fbgemm-kernel", "unplaced"], default="torchrec",
                        help="the other side: torchrec, lightrec with DDP's gloo all-reduce, lightrec with "
                             "fbgemm's TBE (then lightrec's side runs the torch kernel), or lightrec with its lookups "
                             "not writing into the shared-memory exchange (torch kernel on both sides)")  # fmt: skip
    parser.add_argument("--out", help="write the JSON result here as well")
    args = parser.parse_args(argv)
    load_start = list(os.getloadavg())
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'init')}"
        procs = [
            ctx.Process(target=_worker, args=(r, args.world_size, init, args, queue))
            for r in range(args.world_size)
        ]
        with rank_malloc_policy(args.malloc_tuning):  # both frameworks run in these processes
            for p in procs:
                p.start()
        result = queue.get(timeout=3600)
        for p in procs:
            p.join()
    report = {
        "benchmark": "bench_dmp",
        "config": vars(args)
        | {
            "tables": NUM_TABLES,
            "rows": ROWS,
            "dim": DIM,
            "bottom": BOTTOM,
            "top": TOP,
            "threads_per_rank": 1,
            "backend": "gloo",
        },  # fmt: skip
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "platform": platform.platform(),
        },  # fmt: skip
        **result,
    }
    report["load_average_1_5_15"] = {"start": load_start, "end": list(os.getloadavg())}
    other = result.get(args.against, {})
    if "global_samples_per_s" in other:
        report[f"speedup_vs_{args.against}"] = (
            result["lightrec"]["global_samples_per_s"] / other["global_samples_per_s"]
        )
        report[f"speedup_vs_{args.against}_paired_median"] = statistics.median(result["paired_ratios"])
    else:
        print(f"{args.against} not measured: {other.get('skipped')}", file=sys.stderr)
    text = json.dumps(report, indent=2)
    print(text)
    _print_summary(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return report


def _print_summary(report: dict[str, Any]) -> None:
    """The ratio and every rank's per-phase breakdown as a table, on stderr (the JSON is on stdout)."""
    against = report["config"]["against"]
    sides = [k for k in ("lightrec", against) if "phase_ms_per_step_by_rank" in report.get(k, {})]
    lines = [f"mode={report['config']['mode']} load average (1/5/15 min) {report['load_average_1_5_15']}"]
    if f"speedup_vs_{against}" in report:
        lines.append(
            f"lightrec / {against}: {report[f'speedup_vs_{against}']:.2f}x (median windows), "
            f"{report[f'speedup_vs_{against}_paired_median']:.2f}x (median of paired windows)"
        )
    lines.append("kernels: " + " | ".join(f"{s} ({', '.join(report[s]['kernels'])})" for s in sides))
    lines.append("dense all-reduce: " + " | ".join(f"{s}: {report[s]['dense_allreduce']}" for s in sides))
    columns = [(s, r) for s in sides for r in range(len(report[s]["phase_ms_per_step_by_rank"]))]
    lines.append("ms per step".ljust(18) + "".join(f"{s[:8]} r{r}".rjust(13) for s, r in columns))
    for phase in (*dmp_phases.PHASES, "step"):
        lines.append(
            f"  {phase:<16}"
            + "".join(f"{report[s]['phase_ms_per_step_by_rank'][r][phase]:>13.1f}" for s, r in columns)
        )
    print("\n".join(lines), file=sys.stderr)


if __name__ == "__main__":
    main()
