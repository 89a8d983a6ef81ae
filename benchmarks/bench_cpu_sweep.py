"""lightrec against torchrec over a grid of CPU training cases: where is lightrec slower, and by how much?

Every cell trains embedding tables only (no dense compute: ``bench_dmp.py --mode embedding``'s fixed
projection of the pooled embeddings, BCE loss) with the optimizer fused into backward, and times
lightrec's and torchrec's steps in *alternating windows in the same processes*, so a burst of load
from other jobs hits both alike. The grid:

* ``--threads``: intra-op threads per process (``torch.set_num_threads``), default 1 and 2;
* ``--dims``: embedding dim, default 16, 64, 128;
* ``--ids``: ids per bag (pooling factor), default 1, 8, 40;
* ``--optimizers``: ``sgd``, ``rowwise_adagrad``, ``adam`` (fused, learning rate 0.01);
* ``--modes``: ``single`` -- one process, lightrec's ``FusedEmbeddingBagCollection`` against
  torchrec's ``DistributedModelParallel`` of one gloo rank (its fused TBE path, as
  ``bench_embedding.py``'s ``torchrec_dmp_fused_1rank``); ``ranks`` -- 2 gloo ranks, both libraries'
  ``DistributedModelParallel`` with their planners' plans (``bench_dmp.py --mode embedding``).

fbgemm's CPU TBE has no Adam ("Optimizer adam is not supported in CPU mode"), so torchrec's Adam cells
run what torchrec offers on CPU: its dense compute kernel with ``torch.optim.Adam`` on the tables'
dense gradients (lightrec's Adam is fused, in its torch kernel).

The model, batches, windows and CPU clocks are ``bench_dmp.py``'s (imported, not copied: its
``_Contender``, ``_batches``, ``_SparseOnly``, sized per cell through its module constants); this
file adds the optimizer, the one-process lightrec model and the grid.

Per cell it prints and records each side's median samples/s, the median of the per-pair ratios
(lightrec / torchrec; above 1 is lightrec faster), rank 0's training-thread CPU ratio (less disturbed
by other jobs), the lightrec kernel that ``kernel_backend="auto"`` picked, and the 1-minute load
average before and after the cell; then, per mode, per optimizer and overall, the minimum ratio (and
its cell) and the geometric mean. Figures from a loaded machine are noise: read the load average
beside each.

Run::

    python benchmarks/bench_cpu_sweep.py --out sweep.json                  # the whole grid (long)
    python benchmarks/bench_cpu_sweep.py --threads 1 --dims 64 --ids 1 \\
        --optimizers rowwise_adagrad --modes single                          # one cell
    python benchmarks/bench_cpu_sweep.py --tables 4 --rows 10000 --batch 256 --windows 2 --steps 2  # smoke

torchrec is measured when ``import torchrec`` works in the running interpreter (it is never a lightrec
dependency; install torchrec 1.8.0 with ``--no-deps`` in a separate venv and run this file there with
``PYTHONPATH`` at the lightrec checkout); otherwise the script says so and reports lightrec alone.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import traceback
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_dmp, beside this file
import bench_dmp  # noqa: E402

OPTIMIZERS = ("sgd", "rowwise_adagrad", "adam")
MODES = {"single": 1, "ranks": 2}  # mode -> gloo ranks
LEARNING_RATE = 0.01


@dataclass(frozen=True)
class Cell:
    """One case of the grid."""

    mode: str
    threads: int
    dim: int
    ids: int
    optimizer: str

    def label(self) -> str:
        return f"{self.mode:<6} threads={self.threads} dim={self.dim:<3} ids={self.ids:<2} {self.optimizer}"


@dataclass(frozen=True)
class Size:
    """How big each cell is: the tables, the batch, and how long it is timed."""

    tables: int
    rows: int
    batch: int
    windows: int
    steps: int
    warmup: int
    num_batches: int


def _fused_params(library: str, optimizer: str) -> dict[str, Any]:
    if library == "lightrec":
        from lightrec.optim import EmbOptimType
    else:  # pragma: no cover - needs torchrec
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
    kind = {"sgd": EmbOptimType.EXACT_SGD, "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            "adam": EmbOptimType.ADAM}[optimizer]  # fmt: skip
    return {"optimizer": kind, "learning_rate": LEARNING_RATE}


def _lightrec_builder(mode: str) -> Any:
    """``bench_dmp``'s model builder for lightrec: (model, optimizer, KJT class) from its args."""

    def build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
        from lightrec.distributed import DistributedModelParallel, EmbeddingBagCollectionSharder
        from lightrec.kernels import FusedEmbeddingBagCollection
        from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig
        from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter
        from lightrec.sparse import KeyedJaggedTensor

        tables = [EmbeddingBagConfig(num_embeddings=bench_dmp.ROWS, embedding_dim=bench_dmp.DIM, name=f"t{t}",
                                     feature_names=[f"f{t}"]) for t in range(bench_dmp.NUM_TABLES)]  # fmt: skip
        params = _fused_params("lightrec", args.optimizer)
        if mode == "single":  # the fused collection, no sharding at all
            ebc = FusedEmbeddingBagCollection(tables, fused_params=params)
            return bench_dmp._SparseOnly(ebc), ebc.fused_optimizer, KeyedJaggedTensor
        model = bench_dmp._SparseOnly(EmbeddingBagCollection(tables, device="meta"))
        dmp = DistributedModelParallel(model, device=torch.device("cpu"),
                                       sharders=[EmbeddingBagCollectionSharder(params)])  # fmt: skip
        opt = bench_dmp._optimizer(
            dmp, CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter
        )
        return dmp, opt, KeyedJaggedTensor

    return build


def _torchrec_build(args: argparse.Namespace) -> tuple[Any, Any, Any]:  # pragma: no cover - needs torchrec
    """torchrec's DistributedModelParallel over the same model, on every mode's group: its fused TBE, except
    for Adam, which fbgemm's CPU TBE refuses ("Optimizer adam is not supported in CPU mode"): there torchrec's
    CPU path is the dense compute kernel with ``torch.optim.Adam`` on the tables' dense gradients."""
    import torchrec
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    tables = [torchrec.EmbeddingBagConfig(num_embeddings=bench_dmp.ROWS, embedding_dim=bench_dmp.DIM, name=f"t{t}",
                                          feature_names=[f"f{t}"]) for t in range(bench_dmp.NUM_TABLES)]  # fmt: skip
    model = bench_dmp._SparseOnly(torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta")))
    if args.optimizer != "adam":
        sharder = EmbeddingBagCollectionSharder(fused_params=_fused_params("torchrec", args.optimizer))
        dmp = DistributedModelParallel(model, device=torch.device("cpu"), sharders=[sharder])
        opt = bench_dmp._optimizer(
            dmp, CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter
        )
        return dmp, opt, torchrec.KeyedJaggedTensor
    dense = [EmbeddingComputeKernel.DENSE.value]
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=dist.get_world_size(), compute_device="cpu"),
        constraints={t.name: ParameterConstraints(compute_kernels=dense) for t in tables},
    )
    sharder = EmbeddingBagCollectionSharder()
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    params = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    adam = KeyedOptimizerWrapper(params, lambda ps: torch.optim.Adam(ps, lr=LEARNING_RATE))
    return dmp, CombinedOptimizer([adam]), torchrec.KeyedJaggedTensor


def torchrec_missing() -> str | None:
    """Why torchrec cannot be measured here, or None when it imports."""
    try:
        import torchrec  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not measured"
        return f"torchrec is not importable ({type(exc).__name__}: {exc})"
    return None


_installed_phase_timers: set[str] = set()


def _install_once(clock: Any, library: str) -> None:
    """``bench_dmp._Contender`` installs phase timers per model; the sweep builds one model per cell and
    never reads phases, so install them once per library instead of stacking a wrapper per cell."""
    if library not in _installed_phase_timers:
        _installed_phase_timers.add(library)
        _original_install(clock, library)


_original_install = bench_dmp.dmp_phases.install


def measure_cell(rank: int, cell: Cell, size: Size, with_torchrec: bool) -> dict[str, Any]:
    """Both libraries' alternating windows for ``cell`` on this rank (collective over the group)."""
    torch.set_num_threads(cell.threads)
    bench_dmp.NUM_TABLES, bench_dmp.ROWS, bench_dmp.DIM = size.tables, size.rows, cell.dim
    args = argparse.Namespace(mode="embedding", batch_size=size.batch, pooling_factor=cell.ids,
                              num_batches=size.num_batches, steps=size.steps, optimizer=cell.optimizer)  # fmt: skip
    load_before = os.getloadavg()[0]
    sides = {"lightrec": bench_dmp._Contender(_lightrec_builder(cell.mode), rank, args, "lightrec")}
    if with_torchrec:
        sides["torchrec"] = bench_dmp._Contender(_torchrec_build, rank, args, "torchrec")
    for side in sides.values():
        for i in range(size.warmup):
            side.step(i)
    order = list(sides.values())
    pairs: list[float] = []
    cpu_pairs: list[float] = []
    for window in range(size.windows):
        first = order if window % 2 == 0 else order[::-1]  # neither side always runs right after the other
        rates = {id(side): side.window(args) for side in first}
        if len(order) == 2:
            pairs.append(rates[id(order[0])] / rates[id(order[1])])
            cpu_pairs.append(order[1].thread_cpu[-1] / order[0].thread_cpu[-1])
    result: dict[str, Any] = asdict(cell)
    for name, side in sides.items():
        result[name] = {
            "samples_per_s": statistics.median(side.rates),
            "windows_samples_per_s": side.rates,
            "rank0_thread_cpu_ms_per_step": 1000.0 * statistics.median(side.thread_cpu),
            "kernels": side.kernels(),
        }
    if "torchrec" in result and cell.optimizer == "adam":  # see _torchrec_build
        result["torchrec"]["kernels"] = ["dense + torch.optim.Adam"]
    if pairs:
        result["ratio"] = statistics.median(pairs)  # lightrec / torchrec samples/s; > 1: lightrec faster
        result["paired_ratios"] = pairs
        result["cpu_ratio"] = statistics.median(cpu_pairs)  # torchrec / lightrec rank-0 thread CPU per step
    result["load_average_1min"] = {"before": load_before, "after": os.getloadavg()[0]}
    del sides, order
    gc.collect()
    return result


def _worker(rank: int, world: int, init: str, cells: list[Cell], size: Size, queue: Any) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=1800))  # fmt: skip
    bench_dmp.dmp_phases.install = _install_once
    try:
        with_torchrec = torchrec_missing() is None
        for cell in cells:
            result = measure_cell(rank, cell, size, with_torchrec)
            if rank == 0:
                queue.put(("cell", result))
    except BaseException:
        queue.put(("error", f"rank {rank}: {traceback.format_exc()}"))
        raise
    finally:
        dist.destroy_process_group()
    if rank == 0:
        queue.put(("done", None))


def run_mode(mode: str, cells: list[Cell], size: Size, cell_timeout_s: float) -> list[dict[str, Any]]:
    """Run ``cells`` (all of ``mode``) in fresh spawned rank processes; print each cell as it ends."""
    world = MODES[mode]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'init')}"
        procs = [ctx.Process(target=_worker, args=(r, world, init, cells, size, queue)) for r in range(world)]
        with bench_dmp.rank_malloc_policy():  # bench_dmp.py's fixed policy: no page re-faults
            for p in procs:
                p.start()
        try:
            while True:
                kind, payload = queue.get(timeout=cell_timeout_s)
                if kind == "done":
                    break
                if kind == "error":
                    raise RuntimeError(f"a {mode} rank failed:\n{payload}")
                results.append(payload)
                print(format_cell(payload), flush=True)
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():  # bounded: never leave a rank behind
                    p.terminate()
                    p.join(timeout=10)
    return results


def format_cell(r: dict[str, Any]) -> str:
    cell = Cell(r["mode"], r["threads"], r["dim"], r["ids"], r["optimizer"])
    light = r["lightrec"]
    text = f"{cell.label():<58} lightrec {light['samples_per_s']:>11,.0f}/s ({','.join(light['kernels'])})"
    if "ratio" in r:
        pairs = r["paired_ratios"]
        text += (f"  torchrec {r['torchrec']['samples_per_s']:>11,.0f}/s  ratio {r['ratio']:.2f}x "
                 f"(pairs {min(pairs):.2f}-{max(pairs):.2f}, cpu {r['cpu_ratio']:.2f}x)")  # fmt: skip
    load = r["load_average_1min"]
    return text + f"  load {load['before']:.1f}->{load['after']:.1f}"


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode, per optimizer and overall: the minimum ratio, its cell, the geometric mean, the load
    average range."""
    out: dict[str, Any] = {}
    groups = {mode: [r for r in results if r["mode"] == mode] for mode in MODES}
    # per optimizer too: torchrec's CPU Adam is dense, so its huge ratios would swamp an overall mean
    groups |= {opt: [r for r in results if r["optimizer"] == opt] for opt in OPTIMIZERS}
    groups["all"] = results
    for name, rs in groups.items():
        rated = [r for r in rs if "ratio" in r]
        if not rated:
            continue
        worst = min(rated, key=lambda r: r["ratio"])
        loads = [v for r in rated for v in r["load_average_1min"].values()]
        out[name] = {
            "cells": len(rated),
            "min_ratio": worst["ratio"],
            "min_cell": Cell(
                worst["mode"], worst["threads"], worst["dim"], worst["ids"], worst["optimizer"]
            ).label(),
            "geomean_ratio": math.exp(statistics.fmean(math.log(r["ratio"]) for r in rated)),
            "cells_below_1": sum(r["ratio"] < 1.0 for r in rated),
            "load_average_1min_range": [min(loads), max(loads)],
        }
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="intra-op threads per process")
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--ids", type=int, nargs="+", default=[1, 8, 40], help="ids per bag")
    parser.add_argument("--optimizers", nargs="+", choices=OPTIMIZERS, default=list(OPTIMIZERS))
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--tables", type=int, default=26, help="tables (one feature each)")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per table")
    parser.add_argument("--batch", type=int, default=2048, help="samples per rank and step")
    parser.add_argument(
        "--windows", type=int, default=5, help="timed windows per side and cell (alternating)"
    )
    parser.add_argument("--steps", type=int, default=5, help="steps per window")
    parser.add_argument("--warmup", type=int, default=100,
                        help="untimed steps per side and cell (lightrec's auto kernel times its first 86 training steps)")  # fmt: skip
    parser.add_argument("--num-batches", type=int, default=4, help="distinct pre-generated batches per rank")
    parser.add_argument("--cell-timeout", type=float, default=1800.0, help="seconds to wait for one cell")
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    for name in ("threads", "dims", "ids"):
        bad = [v for v in getattr(args, name) if v < 1]
        if bad:
            parser.error(f"--{name} takes positive integers, got {bad}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    size = Size(args.tables, args.rows, args.batch, args.windows, args.steps, args.warmup, args.num_batches)
    missing = torchrec_missing()
    if missing:
        print(f"{missing}: reporting lightrec alone", file=sys.stderr)
    load_start = list(os.getloadavg())
    results: list[dict[str, Any]] = []
    for mode in args.modes:
        cells = [
            Cell(mode, *c) for c in itertools.product(args.threads, args.dims, args.ids, args.optimizers)
        ]
        results += run_mode(mode, cells, size, args.cell_timeout)
    summary = summarize(results)
    for name, s in summary.items():
        print(f"{name:<15} {s['cells']} cells: min {s['min_ratio']:.2f}x ({s['min_cell'].strip()}), geomean "
              f"{s['geomean_ratio']:.2f}x, {s['cells_below_1']} below 1.0x, load average (1 min) "
              f"{s['load_average_1min_range'][0]:.1f}-{s['load_average_1min_range'][1]:.1f}")  # fmt: skip
    report = {
        "benchmark": "bench_cpu_sweep",
        "config": vars(args) | {"learning_rate": LEARNING_RATE, "backend": "gloo"},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "torch": torch.__version__,
                    "platform": platform.platform()},  # fmt: skip
        "torchrec": missing or "measured",
        "load_average_1_5_15": {"start": load_start, "end": list(os.getloadavg())},
        "cells": results,
        "summary": summary,
    }
    if args.out:
        tmp = f"{args.out}.tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=2)
        os.replace(tmp, args.out)  # atomic: no half-written report
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
