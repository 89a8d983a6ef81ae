"""The cost of online publishing on the 2-rank DLRM: tracking the changed rows, and publishing them.

Model and batches: ``bench_dmp.py``'s (13 dense features, 26 tables x ``--rows`` rows x dim 64,
fused row-wise Adagrad, ``--batch-size`` per rank, 2 gloo ranks, one intra-op thread each). Four
kinds of timed window of ``--steps`` training steps each (default 100), alternated
(plain, tracked, published, published_sync, published_sync, published, tracked, plain, ...) so
that load from other jobs hits all alike:

* ``plain``: no tracker;
* ``tracked``: a ``ModelDeltaTrackerTrec`` (``ID_ONLY``) records every lookup, read once per window;
* ``published_sync``: as ``tracked``, plus one ``publish_changes`` at the window's end (a delta of
  the rows the window changed, in ``--row-format``, fp32 by default, into a folder under
  ``--dir``): the step waits for the gather and the write;
* ``published``: the same through ``BackgroundPublisher`` (what ``DeltaPublisher`` does by
  default), in steady state: an untimed window of ``--steps`` steps ends with a publish whose
  background part (send, write) runs during the timed window, which ends with the next publish's
  read (and any wait for the one before). Each timed window thus holds one publish's step part and
  one publish's background part; all of it is counted.

Reported (rank 0): median step time of each kind; the overheads ``tracked / plain - 1``,
``published / plain - 1`` (the issue's target: < 5 % at one publish per 100 steps) and
``published_sync / plain - 1``; the median time a publish held the step (``publish_latency_ms``,
the background one; ``publish_sync_latency_ms``), its background part's wall time, the rows and
bytes of a delta against the tables' size.

Run::

    python benchmarks/bench_online.py                              # JSON to stdout
    python benchmarks/bench_online.py --rows 20000 --steps 20 --repeats 1   # a smoke run

Figures from a shared machine are noisy; take the final ones on a quiet machine.
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
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_dmp, beside this file
import bench_dmp  # noqa: E402

KINDS = ("plain", "tracked", "published", "published_sync")


def _window(contender: Any, args: argparse.Namespace, kind: str, folder: Path, start: int,
            publisher: Any) -> dict[str, float]:  # fmt: skip
    from lightrec.distributed.deltas import DeltaReader, publish_changes
    from lightrec.distributed.model_tracker import ModelDeltaTrackerTrec

    tracker = ModelDeltaTrackerTrec(contender.model) if kind != "plain" else None
    publish = {"snapshot": False, "retention": 1, "row_format": args.row_format}
    if kind == "published":  # the untimed window before: its publish's background part runs in the timed one
        for i in range(args.steps):
            contender.step(start - args.steps + i)
        publisher.publish(folder, tracker, global_step=start, **publish)
    dist.barrier()
    begin = time.perf_counter()
    for i in range(args.steps):
        contender.step(start + i)
    out: dict[str, float] = {}
    version = None
    t0 = time.perf_counter()
    if kind == "tracked":
        assert tracker is not None
        tracker.get_unique_ids()
    elif kind == "published_sync":
        version = publish_changes(contender.model, folder, tracker, global_step=start, **publish)
    elif kind == "published":
        pending = publisher.publish(folder, tracker, global_step=start + args.steps, **publish)
    publish_s = time.perf_counter() - t0
    dist.barrier()
    elapsed = time.perf_counter() - begin
    if kind == "published":  # untimed: this one's background part belongs to the next window in steady state
        version = pending.result()
        out["background_s"] = pending.finish_seconds or 0.0
    if version is not None and dist.get_rank() == 0:  # outside the timed window: the bench's own reading
        manifest = DeltaReader(folder).manifest(version)
        out["rows"] = float(sum(manifest.rows.values()))
        out["bytes"] = float(sum(f.bytes for f in manifest.files.values()))
    dist.barrier()
    if tracker is not None:
        tracker.close()
    return {**out, "step_s": elapsed / args.steps, "publish_s": publish_s}


def _measure(rank: int, args: argparse.Namespace) -> dict[str, Any]:
    from lightrec.distributed.deltas import BackgroundPublisher, publish_changes

    bench_dmp.ROWS = args.rows
    contender = bench_dmp._Contender(bench_dmp._lightrec_model, rank, args, "lightrec")
    folder = Path(args.dir) / "publish"
    for i in range(args.warmup):
        contender.step(i)
    publish_changes(contender.model, folder, None, snapshot=True, retention=1, row_format=args.row_format)  # the base
    publisher = BackgroundPublisher(contender.model, priority=args.publish_priority)
    results: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
    order = list(KINDS) + list(reversed(KINDS))
    step = args.warmup + args.steps  # the background kind's untimed window trains the steps before its start
    for _ in range(args.repeats):
        for kind in order:
            results[kind].append(_window(contender, args, kind, folder, step, publisher))
            step += 2 * args.steps
    publisher.close()
    step_s = {k: statistics.median(w["step_s"] for w in v) for k, v in results.items()}

    def median(kind: str, key: str) -> float:
        return statistics.median(w.get(key, 0.0) for w in results[kind])

    return {
        "step_ms": {k: 1e3 * v for k, v in step_s.items()},
        "tracking_overhead_pct": 100 * (step_s["tracked"] / step_s["plain"] - 1),
        "publish_overhead_pct": 100 * (step_s["published"] / step_s["plain"] - 1),
        "publish_sync_overhead_pct": 100 * (step_s["published_sync"] / step_s["plain"] - 1),
        "publish_latency_ms": 1e3 * median("published", "publish_s"),
        "publish_background_ms": 1e3 * median("published", "background_s"),
        "publish_sync_latency_ms": 1e3 * median("published_sync", "publish_s"),
        "delta_rows": median("published", "rows"),
        "delta_bytes": median("published", "bytes"),
        "tables_bytes": bench_dmp.NUM_TABLES * args.rows * bench_dmp.DIM * 4,
        "windows_per_kind": len(results["published"]),
    }


def _worker(rank: int, world: int, init: str, args: argparse.Namespace, queue: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))  # fmt: skip
    try:
        result = _measure(rank, args)
        if rank == 0:
            queue.put(result)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows per table (26 tables, dim 64)")
    parser.add_argument("--batch-size", type=int, default=2048, help="samples per rank per step")
    parser.add_argument("--pooling-factor", type=int, default=1, help="ids per bag")
    parser.add_argument("--steps", type=int, default=100, help="steps per window (one publish per window)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the 8 alternating windows")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--num-batches", type=int, default=16, help="distinct pre-generated batches per rank")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--row-format", default="fp32", choices=["fp32", "fp16", "int8", "int4"],
                        help="the published rows' format (the serving artifact's)")
    parser.add_argument("--publish-priority", default="idle", choices=["idle", "low", "normal"],
                        help="the background publisher thread's CPU priority")
    parser.add_argument("--malloc-tuning", action=argparse.BooleanOptionalAction, default=True,
                        help="lightrec's default glibc malloc policy in the ranks, as RecStrategy and "
                             "`lightrec run` apply it (bench_dmp.py's docstring)")  # fmt: skip
    parser.add_argument("--dir", default=None, help="where the publish folder goes (default: a temp folder)")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    args = parser.parse_args(argv)
    args.mode, args.plan = "dlrm", "auto"  # bench_dmp's model options
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        args.dir = args.dir or tmp
        procs = [ctx.Process(target=_worker, args=(r, args.world_size, f"{tmp}/pg", args, queue))
                 for r in range(args.world_size)]  # fmt: skip
        with bench_dmp.rank_malloc_policy(args.malloc_tuning):
            for p in procs:
                p.start()
        report = queue.get(timeout=3600)
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.kill()
    report["config"] = {k: v for k, v in vars(args).items() if k not in ("dir", "out")}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
