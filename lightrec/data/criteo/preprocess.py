"""Criteo TSV (Kaggle ``train.txt``, 1TB ``day_N``) → preprocessed memory-mapped numpy chunks.

Input lines: ``label \\t I1..I13 \\t C1..C26`` (:mod:`lightrec.data.criteo.parse` reads them). Output,
under ``out_dir``::

    settings.json                     the preprocessing arguments (a resume must use the same)
    counts/<part>.npz                 per-id frequencies of one input (only with min_count > 0)
    chunks/<part>-<k>.dense.npy       [n, 13] float32   log(max(x, 0) + 1), empty -> 0
    chunks/<part>-<k>.sparse.npy      [n, 26] int32     ids in [0, num_embeddings_f); 0 = missing/rare
                                                        (int64 when a cap exceeds 2**31 rows)
    chunks/<part>-<k>.labels.npy      [n]     float32
    chunks/<part>-<k>.json            written last: the chunk is complete (rows, skipped lines)
    meta.json                         names, num_embeddings_per_feature, parts and their chunks

``<part>`` is the input file's name without suffixes (``train``, ``day_0``). Ids: ``raw = int(hex, 16)``;
``id = 1 + raw % (cap - 1)`` (or of a 64-bit hash of ``raw`` with ``hash_ids=True``); empty -> 0.
With ``min_count = T > 0`` a first pass counts every id, ids seen fewer than ``T`` times map to the
shared id 0, and the kept ids are renumbered ``1..K`` (tables shrink to ``K + 1`` rows).

A malformed line (a dense value with ``|value| >= 1e15`` included) raises or is skipped
(``on_error``). An empty input, or a truncated ``.gz``, raises ``DataFormatError`` naming the file.

Resumable: each input is cut into chunks of ``rows_per_chunk`` input lines; finished chunks (and
finished count files) are skipped when the same command runs again after an interruption.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Protocol, TypedDict

import numpy as np

from lightrec.data.criteo.parse import parse_criteo_lines
from lightrec.data.criteo.spec import CAT_FEATURE_COUNT, DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
from lightrec.data.errors import DataFormatError, LineErrors, OnError, check_at_least, check_on_error
from lightrec.data.hashing import mix64

__all__ = [
    "FORMAT",
    "CriteoChunk",
    "CriteoMeta",
    "CriteoPart",
    "PreprocessSettings",
    "atomic_save_npy",
    "hash_categoricals",
    "id_dtype",
    "preprocess_criteo",
]

logger = logging.getLogger(__name__)
#: ``meta.json``'s ``format``: what :class:`~lightrec.data.CriteoMemmapDataset` reads.
FORMAT = "lightrec-criteo-v1"


class PreprocessSettings(TypedDict):
    """``settings.json``: what a resumed run must repeat."""

    caps: list[int]
    min_count: int
    hash_ids: bool
    rows_per_chunk: int
    on_error: OnError
    format: str


class CriteoChunk(TypedDict):
    """One chunk of a part: its file stem, rows written and lines skipped."""

    name: str
    rows: int
    skipped_lines: int


class CriteoPart(TypedDict):
    """One input's entry of ``meta.json``."""

    name: str
    source: str
    rows: int
    skipped_lines: int
    chunks: list[CriteoChunk]


class CriteoMeta(TypedDict):
    """``meta.json`` of a finished run (what :func:`preprocess_criteo` returns)."""

    format: str
    int_names: list[str]
    cat_names: list[str]
    num_embeddings_per_feature: list[int]
    parts: list[CriteoPart]
    rows: int
    skipped_lines: int
    settings: PreprocessSettings


class _Bar(Protocol):
    """What :class:`_Progress` uses of a tqdm bar."""

    def update(self, n: int) -> object: ...

    def close(self) -> None: ...


def _open(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")  # noqa: SIM115


def _part_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".tsv", ".txt", ".csv"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def hash_categoricals(cats: np.ndarray, caps: Sequence[int], hash_ids: bool) -> np.ndarray:
    """Raw values ``[n, 26]`` (``-1`` = empty) → ids ``1 + v % (cap_f - 1)``, empty → 0 (int64)."""
    out = np.zeros(cats.shape, dtype=np.int64)
    for f, cap in enumerate(caps):
        col = cats[:, f]
        present = col >= 0
        v = col[present].astype(np.uint64)
        if hash_ids:
            v = mix64(v)
        if cap > 1:  # cap == 1: a single row, every id is 0
            out[present, f] = 1 + (v % np.uint64(cap - 1)).astype(np.int64)
    return out


def _iter_chunks(path: Path, rows_per_chunk: int) -> Iterator[tuple[int, int, list[bytes], int]]:
    """``(chunk index, first line number, lines, bytes read)`` for consecutive chunks of a file.

    Raises:
        DataFormatError: the file is empty, or its gzip stream is truncated or corrupt.
    """
    with _open(path) as fh:
        k, lineno = 0, 1
        while True:
            lines: list[bytes] = []
            try:
                _take(fh, rows_per_chunk, lines)
            except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
                # The whole file is bad, not a line (on_error="skip" cannot help): say how far it
                # could be read and what to do.
                read = lineno - 1 + len(lines)
                raise DataFormatError(
                    str(path), 0, f"the gzip stream is truncated or corrupt after line {read} ({exc}); the file is "
                    "incomplete (an interrupted download or copy?): download or copy it again, or unpack what "
                    "can be read (gunzip -c) and pass that file instead"
                ) from exc
            if not lines:
                if k == 0:
                    raise DataFormatError(str(path), 0, "the file is empty: no Criteo lines to read")
                return
            yield k, lineno, lines, sum(len(x) for x in lines)
            k += 1
            lineno += len(lines)


def _take(fh: IO[bytes], n: int, out: list[bytes]) -> None:
    """Append up to ``n`` lines of ``fh`` to ``out`` (what was read stays there if reading fails)."""
    for line in fh:
        out.append(line)
        if len(out) == n:
            break


class _Progress:
    """tqdm over input bytes when tqdm is installed, else one log line per chunk."""

    def __init__(self, path: Path, desc: str, enabled: bool) -> None:
        self.bar: _Bar | None = None
        self.desc = desc
        self.enabled = enabled
        if enabled:
            try:
                from tqdm.auto import tqdm

                total = None if path.suffix == ".gz" else path.stat().st_size
                self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=desc)
            except ImportError:
                self.bar = None

    def update(self, nbytes: int, chunk: int) -> None:
        if self.bar is not None:
            self.bar.update(nbytes)
        elif self.enabled:
            logger.info("%s: chunk %d done", self.desc, chunk)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def id_dtype(caps: Sequence[int]) -> type[np.signedinteger]:
    """The dtype of stored ids: int32 while every table fits (ids < 2**31), int64 beyond."""
    return np.int32 if max(caps) <= np.iinfo(np.int32).max + 1 else np.int64


def atomic_save_npy(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """``np.save`` to a temporary file of this process, then rename: ``path`` is whole or absent."""
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        np.save(fh, array)
    os.replace(tmp, path)


def _atomic_json(path: Path, obj: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def _count_ids(path: Path, out: Path, caps: list[int], args: PreprocessSettings, progress: bool) -> None:
    """Counting pass over one input: ``counts/<part>.npz`` with one uint32 array per feature."""
    if out.exists():
        return
    counts = [np.zeros(cap, dtype=np.int64) for cap in caps]
    errors = LineErrors(args["on_error"])
    bar = _Progress(path, f"count {path.name}", progress)
    for k, first, lines, nbytes in _iter_chunks(path, args["rows_per_chunk"]):
        _, _, cats = parse_criteo_lines(lines, str(path), first, errors)
        ids = hash_categoricals(cats, caps, args["hash_ids"])
        for f in range(CAT_FEATURE_COUNT):
            counts[f] += np.bincount(ids[:, f], minlength=caps[f])
        bar.update(nbytes, k)
    bar.close()
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez(tmp, *[c.astype(np.uint32) for c in counts])
    os.replace(tmp, out)


def _write_chunks(
    path: Path,
    out_dir: Path,
    caps: list[int],
    remap: list[np.ndarray] | None,
    args: PreprocessSettings,
    progress: bool,
) -> CriteoPart:
    """Writing pass over one input; returns the part's entry of ``meta.json``."""
    part = _part_name(path)
    chunks: list[CriteoChunk] = []
    errors = LineErrors(args["on_error"])
    bar = _Progress(path, f"write {path.name}", progress)
    for k, first, lines, nbytes in _iter_chunks(path, args["rows_per_chunk"]):
        stem = f"{part}-{k:05d}"
        done = out_dir / "chunks" / f"{stem}.json"
        if done.exists():  # finished by an earlier, interrupted run
            chunks.append(json.loads(done.read_text()))
            bar.update(nbytes, k)
            continue
        skipped_before = errors.skipped
        labels, dense, cats = parse_criteo_lines(lines, str(path), first, errors)
        ids = hash_categoricals(cats, caps, args["hash_ids"])
        if remap is not None:
            ids = np.stack([remap[f][ids[:, f]] for f in range(CAT_FEATURE_COUNT)], axis=1)
        dense = np.log1p(np.maximum(dense, 0.0)).astype(np.float32)
        atomic_save_npy(out_dir / "chunks" / f"{stem}.dense.npy", dense)
        atomic_save_npy(out_dir / "chunks" / f"{stem}.sparse.npy", ids.astype(id_dtype(caps)))
        atomic_save_npy(out_dir / "chunks" / f"{stem}.labels.npy", labels)
        entry: CriteoChunk = {"name": stem, "rows": int(labels.shape[0]), "skipped_lines": errors.skipped - skipped_before}
        _atomic_json(done, entry)
        chunks.append(entry)
        bar.update(nbytes, k)
    bar.close()
    errors.log_summary(str(path))
    return {
        "name": part,
        "source": str(path),
        "rows": sum(c["rows"] for c in chunks),
        "skipped_lines": sum(c["skipped_lines"] for c in chunks),
        "chunks": chunks,
    }


def preprocess_criteo(
    inputs: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    num_embeddings_cap: int | Sequence[int] = 10_000_000,
    min_count: int = 0,
    hash_ids: bool = False,
    rows_per_chunk: int = 1_000_000,
    on_error: OnError = "raise",
    progress: bool = True,
) -> CriteoMeta:
    """Preprocess Criteo TSV files into memory-mapped chunks (see the module docstring).

    Args:
        inputs: ``train.txt`` and/or ``day_0`` … ``day_23`` (optionally ``.gz``), in time order.
        out_dir: output folder; re-running the same call resumes an interrupted run.
        num_embeddings_cap: table rows per feature before frequency filtering (one int or 26).
        min_count: ids seen fewer times than this over all inputs map to id 0; ``0`` disables the
            counting pass.
        hash_ids: mix raw values with a 64-bit hash before the modulo (spreads structured values).
        rows_per_chunk: input lines per output chunk (the resume granularity).
        on_error: ``"raise"`` on the first malformed line, or ``"skip"`` and count them.
        progress: show a tqdm bar per pass and file (log lines without tqdm).

    Returns:
        The content of ``meta.json``: ``num_embeddings_per_feature``, ``parts`` (name, rows,
        skipped_lines, chunks), ``skipped_lines`` in total, and the settings.
    """
    paths = [Path(inputs)] if isinstance(inputs, (str, Path)) else [Path(p) for p in inputs]
    if not paths:
        raise ValueError("inputs must name at least one Criteo TSV file, got an empty list")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"Criteo input {str(p)!r} does not exist or is not a file")
    names = [_part_name(p) for p in paths]
    if len(set(names)) != len(names):
        raise ValueError(f"inputs must have distinct file names (they name the output parts), got {names}")
    caps = (
        [int(num_embeddings_cap)] * CAT_FEATURE_COUNT
        if isinstance(num_embeddings_cap, int)
        else [int(c) for c in num_embeddings_cap]
    )
    if len(caps) != CAT_FEATURE_COUNT or any(c < 1 for c in caps):
        raise ValueError(
            f"num_embeddings_cap must be a positive int or {CAT_FEATURE_COUNT} of them, got {num_embeddings_cap!r}"
        )
    check_at_least(0, min_count=min_count)
    check_at_least(1, rows_per_chunk=rows_per_chunk)
    args: PreprocessSettings = {
        "caps": caps,
        "min_count": int(min_count),
        "hash_ids": bool(hash_ids),
        "rows_per_chunk": int(rows_per_chunk),
        "on_error": check_on_error(on_error),
        "format": FORMAT,
    }
    out = Path(out_dir)
    (out / "chunks").mkdir(parents=True, exist_ok=True)
    settings = out / "settings.json"
    if settings.exists():
        old = json.loads(settings.read_text())
        if old != args:
            changed = sorted(k for k, v in args.items() if old.get(k) != v)
            raise ValueError(
                f"{str(out)!r} holds a preprocessing run with different settings ({changed}); "
                "use another out_dir or delete it to start over"
            )
    else:
        _atomic_json(settings, args)

    remap: list[np.ndarray] | None = None
    num_embeddings = list(caps)
    if min_count > 0:
        (out / "counts").mkdir(exist_ok=True)
        for p in paths:
            _count_ids(p, out / "counts" / f"{_part_name(p)}.npz", caps, args, progress)
        totals = [np.zeros(c, dtype=np.int64) for c in caps]
        for p in paths:
            with np.load(out / "counts" / f"{_part_name(p)}.npz") as z:
                for f in range(CAT_FEATURE_COUNT):
                    totals[f] += z[f"arr_{f}"]
        remap = []
        for f in range(CAT_FEATURE_COUNT):
            kept = totals[f] >= min_count
            kept[0] = False  # id 0 is the shared missing/rare id
            remap.append((np.cumsum(kept) * kept).astype(np.int64))
            num_embeddings[f] = int(kept.sum()) + 1
    parts = [_write_chunks(p, out, caps, remap, args, progress) for p in paths]
    meta: CriteoMeta = {
        "format": FORMAT,
        "int_names": DEFAULT_INT_NAMES,
        "cat_names": DEFAULT_CAT_NAMES,
        "num_embeddings_per_feature": num_embeddings,
        "parts": parts,
        "rows": sum(p["rows"] for p in parts),
        "skipped_lines": sum(p["skipped_lines"] for p in parts),
        "settings": args,
    }
    _atomic_json(out / "meta.json", meta)
    return meta
