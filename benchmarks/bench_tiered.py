"""Tiered tables on CPU: an SSD-backed table behind a DRAM cache against the same table in memory.

Three measurements, each printing its figures with the machine's load average next to them (the
machine is shared: rerun when the 1-minute load is high)::

    python benchmarks/bench_tiered.py                       # steps/s at cache load factors 1%, 5%, 20%, 30%
    python benchmarks/bench_tiered.py --stores              # direct row file vs a key-value store
    python benchmarks/bench_tiered.py --larger-than-memory  # 64M x 64 fp32 inside a 4 GiB memory cgroup

**Speed** (default): one table of ``--rows`` x ``--dim`` fp32 trained with the fused row-wise
Adagrad on a Zipf id stream (``--alpha``; hot ids scattered over the table by a multiplicative
hash, as real ids are). The in-memory ``BatchedEmbeddingBag`` is the baseline; the SSD-backed one
(``TieringConfig("ssd", cache_load_factor)``, row files under ``--dir``) prefetches the next batch
during the current backward, as ``SparseDistPrefetch`` does in training. Each configuration runs
``--warmup`` steps (the cache reaches its steady state), then both take turns on ``--repeats``
chunks of ``--steps`` steps (medians printed); the hit rate is the kernel's own counter over the
timed steps. The load factors are the issue's 1%, 5% and 20% plus 30%, the smallest of that series
at which LRU reaches a 90% hit rate on this stream (Zipf 1.05 over 1M rows: 87.9% at 20%, 90.9%
at 30%; the cache's decisions are deterministic, so these are the same on every run); the last line
says whether the target -- at least 50% of the in-memory speed at a hit rate of 90% or more -- is met. The table fits in RAM here, so its row file is mostly page cache:
this measures the cache machinery; ``--larger-than-memory`` measures the disk.

**Stores** (``--stores``): why the SSD tier is a direct row file. The same rows (``--store-rows`` x
``--dim`` fp32, plus one fp32 of optimizer state) in (a) lightrec's ``SsdRowStore`` (row ``r`` at
byte ``r * row_bytes``, mmap'd, misses announced with ``POSIX_FADV_WILLNEED``) and (b) a
key-value store (sqlite3, a B-tree keyed by row id -- the stand-in for an LSM store such as RocksDB,
which fbgemm's SSD TBE uses; not installed here), both run in a child process inside a memory
cgroup of ``--stores-memory`` (so reads reach the disk): rows/s read and written back at random in
batches of ``--store-batch``.

**Larger than memory** (``--larger-than-memory``): a child process in a new cgroup-v1 memory cgroup
(limit ``--memory-limit``) trains a table of ``--big-rows`` x ``--dim`` fp32 with row-wise Adagrad
(``16.25 GiB`` at 64M x 64) on SSD with a cache of ``--big-clf`` of its rows. The parent samples
the cgroup's memory (anonymous memory vs page cache) and prints its peak, the steps/s and hit rate.
The row files are unlinked at creation (they vanish when the process ends); ``df`` is printed
before and after. Needs a writable ``/sys/fs/cgroup/memory`` and free disk for every row.

Results of one run are in ``docs/tiered-tables.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightrec.kernels import BatchedEmbeddingBag, EmbOptimType, FusedOptimizerSpec, TieringConfig
from lightrec.kernels.tiered.backend import TieredBatchedLookup
from lightrec.kernels.tiered.store import SsdRowStore
from lightrec.modules import PoolingType

_SPEC = FusedOptimizerSpec(EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.05, eps=1e-8)
_HASH = 2654435761  # odd multiplier: rank -> row is a bijection modulo any power of two; near one otherwise


def load() -> str:
    """The 1/5/15-minute load averages, as printed next to every figure."""
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def zipf_batches(rows: int, alpha: float, batch: int, pooling: int, count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of ``batch`` bags of ``pooling`` ids: ranks from a Zipf law over ``[1, rows]``
    (the continuous inverse CDF, floored), mapped to rows by a multiplicative hash."""
    rng = np.random.default_rng(seed)
    out = []
    top = rows ** (1.0 - alpha)
    offsets = torch.arange(0, batch * pooling + 1, pooling, dtype=torch.long)
    for _ in range(count):
        u = rng.random(batch * pooling)
        ranks = np.floor((1.0 + u * (top - 1.0)) ** (1.0 / (1.0 - alpha))).astype(np.int64) - 1
        ids = (np.clip(ranks, 0, rows - 1) * _HASH) % rows
        out.append((torch.from_numpy(ids), offsets))
    return out


def train(module: BatchedEmbeddingBag, batches: list[tuple[torch.Tensor, torch.Tensor]], prefetch: bool) -> float:
    """Seconds to train on ``batches`` (forward, the next batch's prefetch, backward with the fused update)."""
    start = time.perf_counter()
    for i, (ids, offsets) in enumerate(batches):
        out = module(ids, offsets)
        if prefetch and i + 1 < len(batches):
            module.prefetch(*batches[i + 1])  # its misses are read on the worker thread during backward
        out.square().sum().backward()
    if prefetch:
        tiered_kernel(module).queue.join()  # the last prefetch's reads are part of the time
    return time.perf_counter() - start


def tiered_kernel(module: BatchedEmbeddingBag) -> TieredBatchedLookup:
    kernel = module.kernel
    assert isinstance(kernel, TieredBatchedLookup), type(kernel)
    return kernel


def tiered_stats(module: BatchedEmbeddingBag) -> tuple[int, int, int]:
    stats = tiered_kernel(module).stats()
    return stats.requested_ids, stats.missed_ids, stats.rows_fetched


def bench_speed(args: argparse.Namespace) -> dict[str, Any]:
    """In memory vs SSD-backed at each cache load factor: steps/s, the ratio and the hit rate.

    Both tables train on the same batches; after the warm-up (long enough for the cache to reach
    its steady state: many more ids than the table has rows) they take turns on ``--repeats``
    chunks of ``--steps`` steps, so a load spike hits both; the medians are printed.
    """
    rows, dim, chunks = args.rows, args.dim, args.repeats
    batches = zipf_batches(rows, args.alpha, args.batch, args.pooling, args.warmup + chunks * args.steps, seed=0)
    print(f"table {rows:,} x {dim} fp32 + row-wise Adagrad ({rows * (dim + 1) * 4 / 2**30:.2f} GiB), Zipf alpha "
          f"{args.alpha}, {args.batch} bags x {args.pooling} ids per step, {args.warmup} warm-up steps, then "
          f"{chunks} x {args.steps} steps taken in turns; {args.algorithm.upper()}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {load()}")  # fmt: skip
    results: dict[str, Any] = {"rows": rows, "dim": dim, "alpha": args.alpha, "configs": []}
    for clf in args.clf:
        directory = tempfile.mkdtemp(prefix="lightrec-bench-tiered-", dir=args.dir)
        try:
            memory = BatchedEmbeddingBag([(rows, dim)], [0], PoolingType.SUM, _SPEC, kernel_backend="torch")
            tiering = TieringConfig("ssd", cache_load_factor=clf, algorithm=args.algorithm,
                                    ssd_storage_directory=directory, min_cache_rows=1)  # fmt: skip
            tiered = BatchedEmbeddingBag([(rows, dim)], [0], PoolingType.SUM, _SPEC, kernel_backend="torch", tiering=tiering)
            train(memory, batches[: args.warmup], prefetch=False)
            train(tiered, batches[: args.warmup], prefetch=True)
            before = tiered_stats(tiered)
            memory_s, tiered_s = [], []
            for c in range(chunks):
                part = batches[args.warmup + c * args.steps : args.warmup + (c + 1) * args.steps]
                memory_s.append(train(memory, part, prefetch=False))
                tiered_s.append(train(tiered, part, prefetch=True))
            requested, missed, fetched = (a - b for a, b in zip(tiered_stats(tiered), before, strict=True))
            del tiered, memory
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        row = {
            "cache_load_factor": clf,
            "memory_steps_per_s": args.steps / statistics.median(memory_s),
            "ssd_steps_per_s": args.steps / statistics.median(tiered_s),
            "ratio": statistics.median(m / t for m, t in zip(memory_s, tiered_s, strict=True)),
            "hit_rate": 1.0 - missed / max(requested, 1),
            "rows_fetched_per_step": fetched / (chunks * args.steps),
            "load": load(),
        }
        results["configs"].append(row)
        print(f"  clf {clf:4.0%}: in memory {row['memory_steps_per_s']:6.1f} steps/s | SSD-backed "
              f"{row['ssd_steps_per_s']:6.1f} steps/s = {row['ratio']:4.0%} of in memory | hit rate "
              f"{row['hit_rate']:.1%}, {row['rows_fetched_per_step']:.0f} rows fetched/step | {row['load']}")  # fmt: skip
    high = [r for r in results["configs"] if r["hit_rate"] >= 0.9]
    met = [r for r in high if r["ratio"] >= 0.5]
    results["target_met"] = bool(met)
    if not high:
        print("  target (>= 50% of in memory at a hit rate >= 90%): no load factor here reaches a 90% hit rate")
    else:
        shown = ", ".join(f"clf {r['cache_load_factor']:.0%}: {r['ratio']:.0%} at {r['hit_rate']:.1%}" for r in high)
        print(f"  target (>= 50% of in memory at a hit rate >= 90%): {'met' if met else 'NOT met'} ({shown})")
    return results


# ---- --stores: direct row file vs key-value store ------------------------------------------------
def _store_child(args: argparse.Namespace) -> dict[str, Any]:
    """Inside the memory cgroup: random batched reads and write-backs of both stores, rows/s."""
    rows, dim, batch = args.store_rows, args.dim, args.store_batch
    rng = np.random.default_rng(1)
    batches = [np.unique(rng.integers(0, rows, batch)) for _ in range(args.store_batches)]
    out: dict[str, Any] = {}
    directory = tempfile.mkdtemp(prefix="lightrec-bench-stores-", dir=args.dir)
    try:
        store = SsdRowStore([rows], [dim], torch.float32, [{"momentum1": ((), torch.float32)}], ["t"], directory=directory)
        chunk = 1 << 20
        for lo in range(0, rows, chunk):  # written once, as the table's initialisation is
            store.weights[0][lo : lo + chunk].uniform_(-0.01, 0.01)
        os.sync()  # written back, then dropped from the page cache: the reads go to the disk
        for fd in store._fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        start, n = time.perf_counter(), 0
        for b in batches:
            r = torch.from_numpy(b)
            store.advise(0, r)
            state = store.read(0, r)
            state.weights.add_(1e-3)
            store.write(0, r, state)
            n += len(b)
        out["row_file_rows_per_s"] = n / (time.perf_counter() - start)
        del store
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    directory = tempfile.mkdtemp(prefix="lightrec-bench-stores-", dir=args.dir)
    try:
        db = sqlite3.connect(os.path.join(directory, "rows.sqlite"), isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, row BLOB)")
        init = np.random.default_rng(2)
        db.execute("BEGIN")
        for lo in range(0, rows, 1 << 16):
            hi = min(rows, lo + (1 << 16))
            values = init.uniform(-0.01, 0.01, (hi - lo, dim + 1)).astype(np.float32)
            db.executemany("INSERT INTO rows VALUES (?, ?)", ((lo + i, values[i].tobytes()) for i in range(hi - lo)))
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        os.sync()
        fd = os.open(os.path.join(directory, "rows.sqlite"), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        start, n = time.perf_counter(), 0
        for b in batches:
            ids = b.tolist()
            fetched: dict[int, bytes] = {}
            for lo in range(0, len(ids), 900):  # sqlite's bound-parameter limit
                part = ids[lo : lo + 900]
                sql = f"SELECT id, row FROM rows WHERE id IN ({','.join('?' * len(part))})"
                fetched.update(db.execute(sql, part).fetchall())
            rows_ = np.stack([np.frombuffer(fetched[i], dtype=np.float32) for i in ids]) + 1e-3
            db.execute("BEGIN")
            db.executemany("UPDATE rows SET row = ? WHERE id = ?", ((rows_[k].tobytes(), i) for k, i in enumerate(ids)))
            db.execute("COMMIT")
            n += len(ids)
        out["key_value_rows_per_s"] = n / (time.perf_counter() - start)
        db.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return out


def bench_stores(args: argparse.Namespace) -> dict[str, Any]:
    gib = args.store_rows * (args.dim + 1) * 4 / 2**30
    print(f"stores: {args.store_rows:,} rows x ({args.dim} + 1) fp32 = {gib:.2f} GiB, random batches of "
          f"{args.store_batch} rows read + written back, inside a {args.stores_memory} memory cgroup; {load()}")  # fmt: skip
    result = _in_cgroup(args, "--_stores-child", args.stores_memory)
    child = result["child"]
    print(f"  direct row file (SsdRowStore): {child['row_file_rows_per_s']:10,.0f} rows/s")
    print(f"  key-value (sqlite3 B-tree):    {child['key_value_rows_per_s']:10,.0f} rows/s   "
          f"(row file {child['row_file_rows_per_s'] / child['key_value_rows_per_s']:.1f}x; {load()})")  # fmt: skip
    return result


# ---- --larger-than-memory -----------------------------------------------------------------------
def _big_child(args: argparse.Namespace) -> dict[str, Any]:
    """Inside the memory cgroup: build the big SSD-backed table, then train on a Zipf stream."""
    rows, dim = args.big_rows, args.dim
    t0 = time.perf_counter()
    tiering = TieringConfig("ssd", cache_load_factor=args.big_clf, ssd_storage_directory=args.dir, min_cache_rows=1)
    table = BatchedEmbeddingBag([(rows, dim)], [0], PoolingType.SUM, _SPEC, kernel_backend="torch", tiering=tiering)
    build_s = time.perf_counter() - t0
    batches = zipf_batches(rows, args.alpha, args.batch, args.pooling, args.big_warmup + args.big_steps, seed=3)
    train(table, batches[: args.big_warmup], prefetch=True)
    before = tiered_stats(table)
    seconds = train(table, batches[args.big_warmup :], prefetch=True)
    requested, missed, fetched = (a - b for a, b in zip(tiered_stats(table), before, strict=True))
    weights = table.split_embedding_weights()[0]
    return {
        "rows": rows,
        "dim": dim,
        "store_gib": tiered_kernel(table).store.nbytes / 2**30,
        "cache_rows": tiered_kernel(table).stats().cache_rows,
        "build_s": build_s,
        "steps_per_s": args.big_steps / seconds,
        "hit_rate": 1.0 - missed / max(requested, 1),
        "rows_fetched_per_step": fetched / args.big_steps,
        "finite": bool(torch.isfinite(weights[batches[-1][0][:64]]).all()),
        "load": load(),
    }


def bench_larger_than_memory(args: argparse.Namespace) -> dict[str, Any]:
    need = args.big_rows * (args.dim + 1) * 4
    free = shutil.disk_usage(args.dir).free
    print(f"larger than memory: {args.big_rows:,} x {args.dim} fp32 + row-wise Adagrad = {need / 2**30:.2f} GiB on "
          f"{args.dir} ({free / 2**30:.1f} GiB free), cache {args.big_clf:.1%} of the rows, memory cgroup limit "
          f"{args.memory_limit}; {load()}")  # fmt: skip
    if need > free - 2 * 2**30:
        raise SystemExit(f"--dir {args.dir!r} has {free / 2**30:.1f} GiB free; the table needs {need / 2**30:.1f} GiB + 2")
    print(subprocess.run(["df", "-h", args.dir], capture_output=True, text=True).stdout.rstrip())
    result = _in_cgroup(args, "--_big-child", args.memory_limit)
    child = result["child"]
    print(f"  built in {child['build_s']:.0f} s; {child['steps_per_s']:.2f} steps/s, hit rate {child['hit_rate']:.1%}, "
          f"{child['rows_fetched_per_step']:.0f} rows fetched/step ({child['load']})")  # fmt: skip
    print(f"  peak cgroup memory {result['peak_gib']:.2f} GiB of {args.memory_limit} (anonymous memory peak "
          f"{result['peak_anon_gib']:.2f} GiB; the rest is reclaimable page cache of the row files)")  # fmt: skip
    print(subprocess.run(["df", "-h", args.dir], capture_output=True, text=True).stdout.rstrip())
    return result


# ---- the memory cgroup --------------------------------------------------------------------------
def _bytes(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def _in_cgroup(args: argparse.Namespace, child_flag: str, limit: str) -> dict[str, Any]:
    """Run this script with ``child_flag`` in a fresh cgroup-v1 memory cgroup limited to ``limit``;
    sample its memory until it ends. Returns the child's JSON result and the peaks."""
    own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
               if line.split(":", 2)[1] == "memory")  # fmt: skip
    group = Path("/sys/fs/cgroup/memory") / own.lstrip("/") / f"lightrec-bench-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(_bytes(limit)))
        out_file = tempfile.NamedTemporaryFile(prefix="lightrec-bench-", suffix=".json", delete=False)
        out_file.close()
        cmd = [sys.executable, __file__, child_flag, "--_out", out_file.name, *sys.argv[1:]]
        peak_anon, stop = [0], threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                with open(group / "memory.stat") as f:
                    stat = dict(line.split() for line in f)
                peak_anon[0] = max(peak_anon[0], int(stat.get("rss", 0)))  # anonymous memory, no page cache

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        procs = group / "cgroup.procs"
        proc = subprocess.Popen(cmd, preexec_fn=lambda: procs.write_text(str(os.getpid())))  # noqa: PLW1509
        rc = proc.wait()
        stop.set()
        sampler.join()
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        failcnt = int((group / "memory.failcnt").read_text())
        if rc != 0:
            raise SystemExit(f"the child in the {limit} cgroup failed with exit code {rc}")
        child = json.loads(Path(out_file.name).read_text())
        os.unlink(out_file.name)
        return {"child": child, "limit": limit, "peak_gib": peak / 2**30, "peak_anon_gib": peak_anon[0] / 2**30,
                "limit_hits": failcnt}  # fmt: skip
    finally:
        group.rmdir()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stores", action="store_true", help="direct row file vs key-value store")
    p.add_argument("--larger-than-memory", action="store_true", help="a table bigger than a memory cgroup")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the row files go (a local disk)")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent of the id stream")
    p.add_argument("--batch", type=int, default=2048, help="bags per step")
    p.add_argument("--pooling", type=int, default=4, help="ids per bag")
    p.add_argument("--warmup", type=int, default=400, help="steps before timing (the cache's steady state)")
    p.add_argument("--steps", type=int, default=20, help="steps per timed chunk")
    p.add_argument("--repeats", type=int, default=5, help="timed chunks of each table, in turns")
    p.add_argument("--algorithm", choices=["lru", "lfu"], default="lru")
    p.add_argument("--clf", type=float, nargs="+", default=[0.01, 0.05, 0.2, 0.3])
    p.add_argument("--store-rows", type=int, default=16_000_000)
    p.add_argument("--store-batch", type=int, default=4096)
    p.add_argument("--store-batches", type=int, default=20)
    p.add_argument("--stores-memory", default="1G")
    p.add_argument("--big-rows", type=int, default=64 * 2**20)
    p.add_argument("--big-clf", type=float, default=0.01)
    p.add_argument("--big-warmup", type=int, default=100)
    p.add_argument("--big-steps", type=int, default=100)
    p.add_argument("--memory-limit", default="4G")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for both tables (default: torch's, one per core; with fewer threads "
                        "than cores the tiered table runs its prefetch's bookkeeping on its worker thread)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    p.add_argument("--_stores-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--_big-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--_out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args._stores_child or args._big_child:
        result = _store_child(args) if args._stores_child else _big_child(args)
        Path(args._out).write_text(json.dumps(result))
        return
    if args.stores:
        result = bench_stores(args)
    elif args.larger_than_memory:
        result = bench_larger_than_memory(args)
    else:
        result = bench_speed(args)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
