"""Batches read from the memory-mapped output of :func:`lightrec.data.preprocess_criteo`.

The chosen parts' chunks form one row space in time order; batch ``g`` is rows
``[start + g * B, start + (g + 1) * B)`` of it (a batch may straddle two chunks). Files are opened
lazily with ``np.load(mmap_mode="r")`` inside each worker, so pickling the dataset into workers
copies no data and the page cache is shared.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from lightrec.data.batch import Batch
from lightrec.data.criteo.preprocess import FORMAT, CriteoMeta
from lightrec.data.criteo.spec import table_configs
from lightrec.data.errors import DataFormatError
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["CriteoMemmapDataset", "load_criteo_meta", "one_id_per_key"]


def one_id_per_key(keys: list[str], ids: np.ndarray) -> KeyedJaggedTensor:
    """The KJT of ``ids [B, F]``: sample ``b`` holds exactly the id ``ids[b, f]`` under key ``f``.

    Values are key-major (``ids.T`` flattened, int64), every length is 1 and ``length_per_key`` is
    given, so the lookups that need the ids per key read no device value for it.
    """
    b = int(ids.shape[0])
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.from_numpy(np.ascontiguousarray(ids.T).reshape(-1).astype(np.int64)),
        lengths=torch.ones(len(keys) * b, dtype=torch.int32),
        stride=b,
        length_per_key=[b] * len(keys),
    )


def load_criteo_meta(data_dir: str | Path) -> CriteoMeta:
    """Read ``meta.json`` of a preprocessed folder (raises if preprocessing did not finish)."""
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} not found: {str(data_dir)!r} is not a finished preprocess_criteo output; "
            "run lightrec.data.preprocess_criteo(inputs, out_dir) first (it resumes if interrupted)"
        )
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} has format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def _open_array(path: str, rows: int) -> np.ndarray:
    """Memory-map one chunk array; a truncated or damaged file raises ``DataFormatError`` naming it."""
    try:
        array = np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise DataFormatError(
            path, 0, f"cannot be read as a .npy array (truncated or corrupt: {exc}); run preprocess_criteo again"
        ) from exc
    if array.shape[0] != rows:
        raise DataFormatError(path, 0, f"holds {array.shape[0]} rows, meta.json records {rows}")
    return array


class CriteoMemmapDataset(Dataset):
    """Map-style dataset: item ``g`` is batch ``g`` of a row range of preprocessed Criteo data.

    Args:
        data_dir: output folder of ``preprocess_criteo``.
        batch_size: samples per batch ``B``; a last partial batch is dropped.
        parts: part names to read, in order (default: all, in preprocessing order).
        row_range: ``(start, end)`` rows of the concatenated parts (fractions in ``[0, 1]`` when
            floats, e.g. ``(0.9, 0.95)``); default all rows.
    """

    def __init__(
        self,
        data_dir: str | Path,
        batch_size: int,
        parts: Sequence[str] | None = None,
        row_range: tuple[float, float] | tuple[int, int] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.data_dir = Path(data_dir)
        self.meta = load_criteo_meta(data_dir)
        by_name = {p["name"]: p for p in self.meta["parts"]}
        names = list(by_name) if parts is None else list(parts)
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise KeyError(f"parts {unknown} are not in {str(data_dir)!r}; it holds {list(by_name)}")
        self.chunks = [c for n in names for c in by_name[n]["chunks"] if c["rows"] > 0]
        self.chunk_starts = np.cumsum([0] + [c["rows"] for c in self.chunks])
        total = int(self.chunk_starts[-1])
        start, end = (0, total) if row_range is None else row_range
        if isinstance(start, float) or isinstance(end, float):
            start, end = int(round(float(start) * total)), int(round(float(end) * total))
        if not 0 <= start <= end <= total:
            raise ValueError(f"row_range must satisfy 0 <= start <= end <= {total} rows, got {row_range!r}")
        self.start, self.end = int(start), int(end)
        self.batch_size = int(batch_size)
        self.keys: list[str] = list(self.meta["cat_names"])
        self.num_embeddings_per_feature: list[int] = list(self.meta["num_embeddings_per_feature"])
        self._arrays: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_arrays"] = {}  # memmaps are reopened in the worker, never pickled
        return state

    def __len__(self) -> int:
        return (self.end - self.start) // self.batch_size

    def _chunk(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if i not in self._arrays:
            stem = self.data_dir / "chunks" / self.chunks[i]["name"]
            self._arrays[i] = tuple(  # type: ignore[assignment]
                _open_array(f"{stem}.{kind}.npy", self.chunks[i]["rows"]) for kind in ("dense", "sparse", "labels")
            )
        return self._arrays[i]

    def rows(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows ``[lo, hi)`` of the concatenated parts: dense [n, 13], ids [n, 26], labels [n]."""
        out: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        i = int(np.searchsorted(self.chunk_starts, lo, side="right")) - 1
        while lo < hi:
            c0 = int(self.chunk_starts[i])
            take = min(hi, int(self.chunk_starts[i + 1])) - lo
            dense, sparse, labels = self._chunk(i)
            out.append(
                (
                    dense[lo - c0 : lo - c0 + take],
                    sparse[lo - c0 : lo - c0 + take],
                    labels[lo - c0 : lo - c0 + take],
                )
            )
            lo += take
            i += 1
        return tuple(np.concatenate([o[k] for o in out]) for k in range(3))  # type: ignore[return-value]

    def __getitem__(self, index: int) -> Batch:
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} is out of range for {len(self)} batches")
        lo = self.start + index * self.batch_size
        dense, ids, labels = self.rows(lo, lo + self.batch_size)
        return Batch(
            torch.from_numpy(np.array(dense, dtype=np.float32)),
            one_id_per_key(self.keys, ids),
            torch.from_numpy(np.array(labels, dtype=np.float32)),
        )

    def table_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """One table per categorical feature sized by the preprocessing (``t_cat_i``)."""
        return table_configs(embedding_dim, self.num_embeddings_per_feature, self.keys)
