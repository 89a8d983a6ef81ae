"""Event data loading: the Parquet source vs lightrec's memory-mapped Criteo chunks vs torchrec's in-memory reader.

Criteo-shaped rows (label, 13 dense float32 counts, 26 single-id int64 categoricals of skewed ids
below 100k) are generated once into ``--workdir`` and written in every contender's format from the
same arrays:

* **parquet**: 4 Parquet files, row groups of ``--row-group-size`` rows (``--compression``), read by
  ``lightrec.data.parquet.ParquetLoader`` -- streaming from disk, bounded memory; also with its
  worker kept across epochs (``persistent_workers``: ``parquet_1_worker_kept_later_epochs`` is the
  median of the epochs after the first, which is reported beside them);
* **criteo_memmap**: lightrec's preprocessed Criteo chunks (``CriteoMemmapDataset``: ``.npy`` files
  memory-mapped, batch indices through ``rank_dataloader``);
* **torchrec_in_memory**: torchrec 1.8.0's ``InMemoryBinaryCriteoIterDataPipe`` over ``.npy`` files
  (every row of the rank loaded into RAM first; its load time is included). Measured in this process
  when ``import torchrec`` works, else in a child process of ``--torchrec-python`` (default
  ``/tmp/trvenv/bin/python`` where it exists: a separate venv with torch, fbgemm-gpu-cpu, pyarrow and
  ``torchrec==1.8.0 --no-deps``; never installed into lightrec's venv) on the same files, in the
  same run, between the lightrec contenders' measurements.

Each contender reads the whole data once per repeat (``--batch-size`` rows a batch, one rank) with **one
loader worker** (``*_1_worker``: the worker reads, the training process takes the batches) and in the
training process alone (``*_in_process``: one core does everything). Python imports (lightning,
pyarrow, torchrec) happen before any timing -- they are not the loader's work; nothing is read ahead.
Reported per contender: median samples/s of the whole pass over the repeats (wall clock, the loader
built, the worker started and torchrec's load included), the latency of the first batch, the rate
after the first batch (steady state: without the worker's start and torchrec's load), and samples per
CPU second of all processes together (the training process plus its workers: ``getrusage``), which a
busy machine disturbs far less than wall time. A multi-hot variant (``--multi-hot-ids`` ids per
feature on average, lists of 1 to 2x that) is read by the Parquet source.

``--step``: the loader against the training step of the 2-rank ``lightrec run dlrm`` on the same
Parquet data (``monitor/step_time_ms`` of ``RecThroughputMonitor``, median over the run's windows
after the first), both as samples/s of one rank: the step's ``batch / step time`` against the loader
alone for rank 0 of 2 at the same batch size, one worker (``loader_headroom``: how many times faster
the loader is).

``--convert-mb N``: conversion of a generated Criteo TSV of ``N`` MB (``lightrec data convert`` in a
child process): rows/s, MB/s and the child's peak RSS.

Run::

    python benchmarks/bench_data.py --out bench_data.json                     # the loader table
    python benchmarks/bench_data.py --rows 262144 --repeats 1                 # a smoke run
    python benchmarks/bench_data.py --step --convert-mb 4096                  # + step and conversion
    python benchmarks/bench_data.py --torchrec-python /tmp/trvenv/bin/python  # torchrec from its venv

Figures taken on a shared machine are noisy; the CPU-second figures and the ratios within one run
are the ones to compare. JSON goes to stdout (and ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

CARDINALITY = 100_000
FILES = 4


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (loader workers)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _measure(make: Callable[[], Iterable[Any]], repeats: int) -> dict[str, Any]:
    """Median samples/s (wall) and samples per CPU second of reading everything ``make()`` yields."""
    walls, cpus, firsts, samples = [], [], [], 0
    for _ in range(repeats):
        cpu, start = _cpu(), time.perf_counter()
        samples, first = 0, 0.0
        for batch in make():
            samples += int(batch.labels.shape[0])
            first = first or time.perf_counter() - start
        walls.append(time.perf_counter() - start)
        cpus.append(_cpu() - cpu)
        firsts.append(first)
    wall, first = statistics.median(walls), statistics.median(firsts)
    return {
        "samples": samples,
        "samples_per_s": samples / wall,
        "samples_per_cpu_s": samples / statistics.median(cpus),
        # after the first batch: without starting the worker and, for torchrec, loading the data
        "steady_samples_per_s": samples / max(wall - first, 1e-9),
        "first_batch_s": first,
        "wall_s": walls,
        "cpu_s": cpus,
    }


# ----------------------------------------------------------------------------- data
def _arrays(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = (rng.random(rows) < 0.25).astype(np.int8)
    dense = np.floor(rng.lognormal(1.5, 1.5, (rows, 13))).astype(np.float32)
    ids = (rng.pareto(1.1, (rows, 26)) * 50).astype(np.int64) % CARDINALITY
    return labels, dense, ids


def write_single_id(folder: Path, rows: int, row_group: int, compression: str) -> dict[str, Path]:
    """The same rows as Parquet files, lightrec Criteo chunks and torchrec ``.npy`` files (cached)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = folder / "done.json"
    paths = {"parquet": folder / "parquet", "memmap": folder / "memmap", "npy": folder / "npy"}
    if done.exists() and json.loads(done.read_text()) == [rows, row_group, compression]:
        return paths
    for p in paths.values():
        p.mkdir(parents=True, exist_ok=True)
    (paths["memmap"] / "chunks").mkdir(exist_ok=True)
    chunks = []
    per_file = rows // FILES
    for k in range(FILES):
        labels, dense, ids = _arrays(per_file, k)
        columns: dict[str, Any] = {"label": pa.array(labels)}
        columns.update({f"int_{i}": pa.array(dense[:, i]) for i in range(13)})
        columns.update({f"cat_{i}": pa.array(ids[:, i]) for i in range(26)})
        pq.write_table(pa.table(columns), paths["parquet"] / f"part-{k:05d}.parquet", row_group_size=row_group,
                       compression=compression)  # fmt: skip
        stem = paths["memmap"] / "chunks" / f"day-{k:05d}"
        np.save(f"{stem}.dense.npy", np.log1p(dense))
        np.save(f"{stem}.sparse.npy", ids.astype(np.int32))
        np.save(f"{stem}.labels.npy", labels.astype(np.float32))
        chunks.append({"name": f"day-{k:05d}", "rows": per_file, "skipped_lines": 0})
        np.save(paths["npy"] / f"day_{k}_dense.npy", np.log1p(dense))
        np.save(paths["npy"] / f"day_{k}_sparse.npy", ids.astype(np.int32))
        np.save(paths["npy"] / f"day_{k}_labels.npy", labels.astype(np.int32).reshape(-1, 1))
    from lightrec.data import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
    from lightrec.data.criteo.preprocess import FORMAT

    meta = {"format": FORMAT, "int_names": DEFAULT_INT_NAMES, "cat_names": DEFAULT_CAT_NAMES,
            "num_embeddings_per_feature": [CARDINALITY] * 26,
            "parts": [{"name": "day", "rows": per_file * FILES, "skipped_lines": 0, "chunks": chunks}],
            "rows": per_file * FILES, "skipped_lines": 0}  # fmt: skip
    (paths["memmap"] / "meta.json").write_text(json.dumps(meta))
    done.write_text(json.dumps([rows, row_group, compression]))
    return paths


def write_multi_hot(folder: Path, rows: int, ids: int, row_group: int, compression: str) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = folder / "_done.json"  # '_': not a data file
    if done.exists() and json.loads(done.read_text()) == [rows, ids, row_group, compression]:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    per_file = rows // FILES
    for k in range(FILES):
        columns: dict[str, Any] = {"label": pa.array((rng.random(per_file) < 0.25).astype(np.int8))}
        columns.update({f"int_{i}": pa.array(rng.random(per_file).astype(np.float32)) for i in range(13)})
        for f in range(26):
            lengths = rng.integers(1, 2 * ids, per_file)
            offsets = np.zeros(per_file + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            values = (rng.pareto(1.1, int(offsets[-1])) * 50).astype(np.int64) % CARDINALITY
            columns[f"cat_{f}"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        pq.write_table(pa.table(columns), folder / f"part-{k:05d}.parquet", row_group_size=row_group,
                       compression=compression)  # fmt: skip
    done.write_text(json.dumps([rows, ids, row_group, compression]))
    return folder


# ----------------------------------------------------------------------------- contenders
def parquet_loader(
    folder: Path, batch_size: int, workers: int, rank: int = 0, world: int = 1, persistent: bool = False
) -> Any:
    from lightrec.data.parquet import ParquetLoader, ParquetSource, build_spec, size_tables, slices_of

    source = ParquetSource(str(folder))
    spec = size_tables(source, build_spec(source.schema, str(folder), "label", ["int_*"], ["cat_*"]))
    return ParquetLoader(source, spec, slices_of(source.files), batch_size, rank, world, num_workers=workers,
                         persistent_workers=persistent)  # fmt: skip


def kept_worker_epochs(folder: Path, batch_size: int, epochs: int) -> dict[str, Any]:
    """One loader with its worker kept (``persistent_workers``): the first epoch and the later ones."""
    loader = parquet_loader(folder, batch_size, 1, persistent=True)
    state = {"epoch": 0}

    def next_epoch() -> Any:
        loader.sampler.set_epoch(state["epoch"])
        state["epoch"] += 1
        return loader

    first = _measure(next_epoch, 1)
    later = _measure(next_epoch, max(epochs - 1, 1))
    loader.close()
    for row in (first, later):  # getrusage sees a worker's CPU time only once it has exited
        row["samples_per_cpu_s"] = None
    return {"first_epoch": first, "later_epochs": later, **{k: later[k] for k in ("samples", "samples_per_s",
            "samples_per_cpu_s", "steady_samples_per_s", "first_batch_s")}}  # fmt: skip


def memmap_loader(folder: Path, batch_size: int, workers: int) -> Any:
    from lightrec.data import CriteoMemmapDataset, rank_dataloader

    return rank_dataloader(CriteoMemmapDataset(folder, batch_size), num_workers=workers)


class _TorchrecStream(torch.utils.data.IterableDataset):
    """torchrec's in-memory reader, built where it is iterated (in the worker: its loading is timed)."""

    def __init__(self, folder: Path, batch_size: int) -> None:
        self.folder, self.batch_size = folder, batch_size

    def __iter__(self) -> Any:
        from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe

        paths = {kind: [str(self.folder / f"day_{k}_{kind}.npy") for k in range(FILES)] for kind in ("dense", "sparse", "labels")}
        yield from InMemoryBinaryCriteoIterDataPipe(
            "train", paths["dense"], paths["sparse"], paths["labels"], self.batch_size, rank=0, world_size=1
        )


def torchrec_loader(folder: Path, batch_size: int, workers: int) -> Any:
    stream = _TorchrecStream(folder, batch_size)
    if workers == 0:
        return stream
    return torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers)


def torchrec_in_child(python: str, args: argparse.Namespace) -> dict[str, Any]:
    """The torchrec contenders measured by ``python`` (torchrec's venv) running this script on the same files."""
    command = [python, __file__, "--only-torchrec", "--rows", str(args.rows), "--batch-size", str(args.batch_size),
               "--row-group-size", str(args.row_group_size), "--compression", args.compression,
               "--repeats", str(args.repeats), "--workdir", args.workdir]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    if done.returncode != 0:
        return {"torchrec_in_memory": {"skipped": f"{python} failed: {done.stderr.strip()[-2000:] or done.returncode}"}}
    rows: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])["single_id"]
    for row in rows.values():
        row["python"] = python
    return rows


def _torchrec_available() -> str | None:
    try:
        import torchrec  # noqa: F401
        from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure means "not measured", said in the report
        return f"torchrec is not importable ({type(exc).__name__}: {exc})"
    return None


# ----------------------------------------------------------------------------- step and conversion
def step_figure(folder: Path, batch_size: int, steps: int, work: Path) -> dict[str, Any]:
    """The 2-rank ``lightrec run dlrm`` step on the Parquet data, and the loader alone at its batch size."""
    logs = work / "step_logs"
    command = [
        sys.executable, "-m", "lightrec.cli", "run", "dlrm", "--data", "parquet", "--data.path", str(folder),
        "--data.label", "label", "--data.dense", "[int_*]", "--data.sparse", "[cat_*]", "--data.dense_transform",
        "log1p", "--data.batch_size", str(batch_size), "--data.num_workers", "1", "--trainer.max_steps", str(steps),
        "--trainer.logger.init_args.save_dir", str(logs), "--trainer.enable_progress_bar", "false",
        "--recipe.export", "false", "--recipe.test_after_fit", "false",
    ]  # fmt: skip
    subprocess.run(command, check=True, cwd=work, capture_output=True, timeout=3600)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = sorted((logs / "dlrm").glob("version_*"))
    events = EventAccumulator(str(runs[-1]))
    events.Reload()
    step_ms = [s.value for s in events.Scalars("monitor/step_time_ms")][1:] or [float("nan")]
    loader = _measure(lambda: parquet_loader(folder, batch_size, 1, rank=0, world=2), 1)
    loader_ms = 1e3 * batch_size / loader["samples_per_s"]
    median_step = statistics.median(step_ms)
    return {
        "batch_size_per_rank": batch_size,
        "ranks": 2,
        "step_ms": median_step,
        "step_samples_per_s_per_rank": 1e3 * batch_size / median_step,
        "loader_ms_per_batch": loader_ms,
        "loader_samples_per_s": loader["samples_per_s"],  # the whole pass, the worker's start included
        "loader_steady_samples_per_s": loader["steady_samples_per_s"],
        "loader_headroom": median_step / loader_ms,
    }


def _criteo_lines(rows: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    labels, dense, ids = _arrays(rows, seed)
    blank = rng.random((rows, 39)) < 0.1
    out = []
    for i in range(rows):
        fields = [str(int(labels[i]))]
        fields += ["" if blank[i, j] else str(int(dense[i, j])) for j in range(13)]
        fields += ["" if blank[i, 13 + j] else format(int(ids[i, j]) * 2654435761 % 2**32, "08x") for j in range(26)]
        out.append("\t".join(fields))
    return ("\n".join(out) + "\n").encode()


def convert_figure(megabytes: int, work: Path) -> dict[str, Any]:
    """``lightrec data convert`` of a generated Criteo TSV in a child process: rows/s, MB/s, peak RSS."""
    tsv = work / f"criteo_{megabytes}mb.tsv"
    block = _criteo_lines(100_000, 11)
    copies = max(1, megabytes * 2**20 // len(block))
    if not tsv.exists() or tsv.stat().st_size != copies * len(block):
        with open(tsv, "wb") as f:
            for _ in range(copies):
                f.write(block)
    out = work / f"converted_{megabytes}mb"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    code = (
        "import resource, time\nfrom lightrec.cli.app import main\nstart = time.perf_counter()\n"
        f"assert main(['data', 'convert', {str(tsv)!r}, '--out', {str(out)!r}, '--no-progress']) == 0\n"
        "print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=24 * 3600)
    seconds, rss = (float(x) for x in done.stdout.strip().splitlines()[-1].split())
    rows = copies * 100_000
    return {"input_mb": tsv.stat().st_size / 2**20, "rows": rows, "seconds": seconds, "rows_per_s": rows / seconds,
            "mb_per_s": tsv.stat().st_size / 2**20 / seconds, "peak_rss_mib": rss}  # fmt: skip


def _summary(result: dict[str, Any]) -> None:
    """The figures as lines on stderr (the JSON goes to stdout)."""
    for table in ("single_id", "multi_hot"):
        for name, row in result[table].items():
            if "samples_per_s" not in row:
                print(f"{table:9} {name:30} not measured: {row.get('skipped')}", file=sys.stderr)
                continue
            print(f"{table:9} {name:30} {row['samples_per_s'] / 1e6:5.2f} M samples/s whole pass, first batch after "
                  f"{row['first_batch_s'] * 1e3:4.0f} ms, then {row['steady_samples_per_s'] / 1e6:5.2f} M/s; "
                  + (f"{row['samples_per_cpu_s'] / 1e6:5.2f} M per CPU-s" if row["samples_per_cpu_s"] else "CPU n/a"),
                  file=sys.stderr)  # fmt: skip
    for key in ("parquet_vs_torchrec_1_worker", "parquet_vs_memmap_1_worker"):
        if key in result:
            print(f"{key}: {result[key]:.2f}x (whole pass)", file=sys.stderr)
    if "step" in result:
        step = result["step"]
        print(f"2-rank lightrec run dlrm: {step['step_samples_per_s_per_rank'] / 1e6:.3f} M samples/s per rank "
              f"({step['step_ms']:.1f} ms a step); the loader for rank 0 of 2: {step['loader_samples_per_s'] / 1e6:.2f} "
              f"M samples/s ({step['loader_headroom']:.0f}x)", file=sys.stderr)  # fmt: skip
    if "convert" in result:
        c = result["convert"]
        print(f"convert: {c['rows_per_s'] / 1e3:.0f}k rows/s, {c['mb_per_s']:.1f} MB/s, peak RSS {c['peak_rss_mib']:.0f} MiB",
              file=sys.stderr)  # fmt: skip
    print(f"load average: {result['machine']['load_average_at_start']} at start, "
          f"{result['machine']['load_average_at_end']} at the end", file=sys.stderr)  # fmt: skip


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_097_152, help="single-id rows (default 2.1M)")
    parser.add_argument("--multi-hot-rows", type=int, default=262_144)
    parser.add_argument("--multi-hot-ids", type=int, default=20, help="mean ids per feature of the multi-hot rows")
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--row-group-size", type=int, default=262_144)
    parser.add_argument("--compression", default="snappy")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step", action="store_true", help="also the 2-rank lightrec run dlrm step vs the loader")
    parser.add_argument("--step-steps", type=int, default=200)
    parser.add_argument("--step-batch-size", type=int, default=1024)
    parser.add_argument("--convert-mb", type=int, default=0, help="also convert a generated Criteo TSV of this size")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "lightrec-bench-data"))
    parser.add_argument("--torchrec-python", default="/tmp/trvenv/bin/python",
                        help="a Python with torchrec, for the torchrec reader when it is not importable here")
    parser.add_argument("--only-torchrec", action="store_true", help=argparse.SUPPRESS)  # the child of the above
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    paths = write_single_id(work / f"single_{args.rows}", args.rows, args.row_group_size, args.compression)
    multi = write_multi_hot(work / f"multi_{args.multi_hot_rows}", args.multi_hot_rows, args.multi_hot_ids,
                            max(args.row_group_size // (2 * args.multi_hot_ids), 4096), args.compression)  # fmt: skip
    b, r = args.batch_size, args.repeats
    # Imports before any timing (lightning comes with lightrec.data): they are not the loaders' work.
    import lightrec.data  # noqa: F401
    import lightrec.data.parquet  # noqa: F401

    missing = _torchrec_available()
    torchrec_contenders: dict[str, Callable[[], Iterable[Any]]] = {
        "torchrec_in_memory_1_worker": lambda: torchrec_loader(paths["npy"], b, 1),
        "torchrec_in_memory_in_process": lambda: torchrec_loader(paths["npy"], b, 0),
    }
    if args.only_torchrec:
        if missing is not None:
            raise SystemExit(missing)
        print(json.dumps({"single_id": {name: _measure(make, r) for name, make in torchrec_contenders.items()}}))
        return {}
    contenders: dict[str, Callable[[], Iterable[Any]]] = {
        "parquet_1_worker": lambda: parquet_loader(paths["parquet"], b, 1),
        "parquet_in_process": lambda: parquet_loader(paths["parquet"], b, 0),
        "criteo_memmap_1_worker": lambda: memmap_loader(paths["memmap"], b, 1),
        "criteo_memmap_in_process": lambda: memmap_loader(paths["memmap"], b, 0),
    }
    if missing is None:
        contenders.update(torchrec_contenders)
    result: dict[str, Any] = {
        "benchmark": "bench_data",
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "load_average_at_start": os.getloadavg()},  # fmt: skip
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "single_id": {name: _measure(make, r) for name, make in contenders.items()},
    }
    result["single_id"]["parquet_1_worker_kept_later_epochs"] = kept_worker_epochs(paths["parquet"], b, r + 1)
    if missing is not None and os.path.exists(args.torchrec_python):
        result["single_id"].update(torchrec_in_child(args.torchrec_python, args))
    elif missing is not None:
        result["single_id"]["torchrec_in_memory"] = {"skipped": f"{missing}; no {args.torchrec_python}"}
    result["multi_hot"] = {
        "parquet_1_worker": _measure(lambda: parquet_loader(multi, b, 1), r),
        "parquet_in_process": _measure(lambda: parquet_loader(multi, b, 0), r),
    }
    single = result["single_id"]
    if "samples_per_s" in single.get("torchrec_in_memory_1_worker", {}):
        result["parquet_vs_torchrec_1_worker"] = (
            single["parquet_1_worker"]["samples_per_s"] / single["torchrec_in_memory_1_worker"]["samples_per_s"]
        )
    result["parquet_vs_memmap_1_worker"] = (
        single["parquet_1_worker"]["samples_per_s"] / single["criteo_memmap_1_worker"]["samples_per_s"]
    )
    if args.step:
        result["step"] = step_figure(paths["parquet"], args.step_batch_size, args.step_steps, work)
    if args.convert_mb:
        result["convert"] = convert_figure(args.convert_mb, work)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["machine"]["load_average_at_end"] = os.getloadavg()
    _summary(result)
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
