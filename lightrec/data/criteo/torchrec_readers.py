"""torchrec's Criteo readers (``torchrec.datasets.criteo`` re-exports them): the TSV row readers and
the in-memory reader of torchrec's binary (``.npy``) Criteo files.

File layout of the binary form (what ``BinaryCriteoUtils.tsv_to_npys`` writes, one triple per day)::

    day_<d>_dense.npy    [N, 13] float32   log(count + 3) (torchrec's transform; empty -> 0)
    day_<d>_sparse.npy   [N, 26] int64     raw categorical value (hex field as an int; empty -> 0)
    day_<d>_labels.npy   [N, 1]  int32     0 / 1 (-1: Kaggle's unlabelled test.txt, as in torchrec)

``InMemoryBinaryCriteoIterDataPipe`` loads this rank's contiguous share of the rows (ranks differ
by at most one row; with ``shuffle_training_set``, its block of one seeded permutation of all rows)
and yields ``Batch`` es whose ids are ``raw % hashes[f]``. Every rank yields the same number of
batches (a rank with one row more puts it in its last batch), so DDP ranks step together. The names
(``DEFAULT_CAT_NAMES`` = ``cat_0 .. cat_25``, ``DEFAULT_INT_NAMES`` = ``int_0 .. int_12``) are the
ones :mod:`lightrec.data` uses (:mod:`lightrec.data.criteo.spec`), so table configs move between
the two. lightrec's own Criteo pipeline (:func:`lightrec.data.preprocess_criteo`, resumable,
memory-mapped chunks) is the one to use for new work; this module reads torchrec's format for
scripts that already have it.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from lightrec.data.batch import Batch
from lightrec.data.criteo.memmap_dataset import one_id_per_key
from lightrec.data.criteo.parse import parse_criteo_lines
from lightrec.data.criteo.preprocess import atomic_save_npy
from lightrec.data.criteo.spec import CAT_FEATURE_COUNT, DEFAULT_CAT_NAMES, DEFAULT_COLUMN_NAMES
from lightrec.data.csv_readers import PATH_MANAGER_KEY, LoadFiles, safe_cast
from lightrec.data.errors import LineErrors, OnError, check_on_error

__all__ = [
    "BinaryCriteoUtils",
    "CriteoIterDataPipe",
    "InMemoryBinaryCriteoIterDataPipe",
    "criteo_kaggle",
    "criteo_terabyte",
]


def _too_many(example: list[str]) -> str:
    return (
        f"a Criteo row has at most {len(DEFAULT_COLUMN_NAMES)} tab-separated fields (label, 13 counts, "
        f"26 categoricals), got {len(example)}"
    )


def _default_row_mapper(example: list[str]) -> dict[str, int | str]:
    """A TSV row as ``{column name: value}``: label and counts as ints (empty -> 0), categoricals as
    their hex strings (empty -> ""). A short row fills the *last* columns, as torchrec's does; a row
    of more than 40 fields is refused (``CriteoIterDataPipe`` names its file and line)."""
    if len(example) > len(DEFAULT_COLUMN_NAMES):
        raise ValueError(_too_many(example))
    out: dict[str, int | str] = {}
    for name, value in zip(reversed(DEFAULT_COLUMN_NAMES), reversed(example)):
        out[name] = safe_cast(value, str, "") if name.startswith("cat_") else safe_cast(value, int, 0)
    return out


class CriteoIterDataPipe(IterableDataset):
    """Rows of Criteo TSV files (Kaggle ``train.txt`` or the 1TB ``day_N``), mapped by ``row_mapper``.

    With DataLoader workers, worker ``w`` of ``n`` reads the files ``w, w + n, ...``. A row the
    default ``row_mapper`` refuses (more than 40 fields: torchrec's mapper fails on it) raises a
    ``DataFormatError`` naming the file and line, or is skipped with ``on_error="skip"``.

    Args:
        paths: the TSV files, in order.
        row_mapper: applied to each row's list of fields (None: the list itself).
        on_error: ``"raise"`` or ``"skip"`` a row the default ``row_mapper`` refuses (lightrec's
            addition; a custom ``row_mapper``'s errors propagate unchanged).
        **open_kw: ``open`` arguments.
    """

    def __init__(
        self,
        paths: Iterable[str],
        *,
        row_mapper: Callable[[list[str]], object] | None = _default_row_mapper,
        on_error: OnError = "raise",
        **open_kw: Any,
    ) -> None:
        self.paths = list(paths)
        self.row_mapper = row_mapper
        self.on_error = check_on_error(on_error)
        self.open_kw = open_kw

    def __iter__(self) -> Iterator[object]:
        paths = self.paths
        worker = get_worker_info()
        if worker is not None:
            paths = [p for i, p in enumerate(paths) if i % worker.num_workers == worker.id]
        errors = LineErrors(self.on_error)
        for path, f in LoadFiles(paths, mode="r", **self.open_kw):
            reader = csv.reader(f, delimiter="\t")
            for row in reader:
                if self.row_mapper is not _default_row_mapper:
                    yield self.row_mapper(row) if self.row_mapper is not None else row
                elif len(row) > len(DEFAULT_COLUMN_NAMES):
                    errors.bad_line(path, reader.line_num, _too_many(row))
                else:
                    yield _default_row_mapper(row)
        errors.log_summary("CriteoIterDataPipe")


def criteo_terabyte(
    paths: Iterable[str],
    *,
    row_mapper: Callable[[list[str]], object] | None = _default_row_mapper,
    on_error: OnError = "raise",
    **open_kw: Any,
) -> CriteoIterDataPipe:
    """The Criteo 1TB click logs, read from its TSV files (see :class:`CriteoIterDataPipe`)."""
    return CriteoIterDataPipe(paths, row_mapper=row_mapper, on_error=on_error, **open_kw)


def criteo_kaggle(
    path: str,
    *,
    row_mapper: Callable[[list[str]], object] | None = _default_row_mapper,
    on_error: OnError = "raise",
    **open_kw: Any,
) -> CriteoIterDataPipe:
    """The Kaggle Display Advertising Challenge data, read from ``train.txt`` or ``test.txt``."""
    return CriteoIterDataPipe((path,), row_mapper=row_mapper, on_error=on_error, **open_kw)


# Bytes of lines ``tsv_to_npys`` parses at a time: measured, ~150 MiB of memory for a chunk, its
# lines and its parsed arrays, whatever the file's size (reading a 109 MiB file whole took 481 MiB).
TSV_CHUNK_BYTES = 16 << 20


def _count_lines(path: str) -> int:
    """Lines in a file as ``readlines`` splits it (a last line without its newline counts)."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(TSV_CHUNK_BYTES):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


class BinaryCriteoUtils:
    """Convert Criteo TSV to torchrec's binary layout, and read row ranges of it (module docstring)."""

    @staticmethod
    def tsv_to_npys(
        in_file: str,
        out_dense_file: str,
        out_sparse_file: str,
        out_labels_file: str,
        dataset_name: str = "criteo_1tb",
        path_manager_key: str = PATH_MANAGER_KEY,
    ) -> None:
        """Convert one TSV file into the three ``.npy`` files (each written atomically).

        ``dataset_name="criteo_kaggle"`` with ``"test"`` in ``in_file``'s name reads the Kaggle
        ``test.txt``, whose lines have no label (39 fields): every label is written as ``-1``, as
        torchrec does (its ``npy_preproc_criteo.py`` passes ``dataset_name`` fifth).

        The lines are read ``TSV_CHUNK_BYTES`` at a time and written into the outputs in place
        (``.npy`` memory maps sized by a first pass that counts the lines), so memory stays bounded
        for a day of the 1TB logs (~45 GB of text, which reading whole would need several times
        over). A bad line raises ``DataFormatError`` naming it, and no output is left behind.
        """
        rows = _count_lines(in_file)
        outputs = ((out_dense_file, np.float32, 13), (out_sparse_file, np.int64, CAT_FEATURE_COUNT),
                   (out_labels_file, np.int32, 1))  # fmt: skip
        if rows == 0:  # no memory map of an empty array
            for path, dtype, width in outputs:
                atomic_save_npy(path, np.zeros((0, width), dtype=dtype))
            return
        tmps = [f"{path}.tmp-{os.getpid()}" for path, _, _ in outputs]
        try:
            dense_out, sparse_out, labels_out = (
                np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(rows, width))
                for tmp, (_, dtype, width) in zip(tmps, outputs, strict=True)
            )
            done = 0
            # torchrec tests the whole path; the file name alone keeps a folder such as tests/ out of it
            unlabelled = dataset_name == "criteo_kaggle" and "test" in os.path.basename(in_file)
            with open(in_file, "rb") as f:
                while lines := f.readlines(TSV_CHUNK_BYTES):
                    if unlabelled:  # a stand-in label: line numbers stay, the labels are -1 below
                        lines = [b"0\t" + line for line in lines]
                    # "raise": no line is skipped, so line numbers are row numbers
                    labels, dense, cats = parse_criteo_lines(lines, in_file, done + 1, LineErrors("raise"))
                    end = done + len(labels)
                    if end > rows:
                        raise ValueError(f"{in_file!r} grew while it was converted ({rows} lines counted)")
                    dense_out[done:end] = np.log(np.maximum(dense, -2.0) + 3.0)  # log(x + 3); -3 would be -inf
                    sparse_out[done:end] = np.where(cats < 0, 0, cats)
                    labels_out[done:end, 0] = -1 if unlabelled else labels
                    done = end
            if done != rows:
                raise ValueError(f"{in_file!r} shrank while it was converted ({rows} lines counted, {done} read)")
            for array in (dense_out, sparse_out, labels_out):
                array.flush()
            del dense_out, sparse_out, labels_out
            for tmp, (path, _, _) in zip(tmps, outputs, strict=True):
                os.replace(tmp, path)
        finally:
            for tmp in tmps:
                if os.path.exists(tmp):
                    os.remove(tmp)

    @staticmethod
    def get_shape_from_npy(path: str, path_manager_key: str = PATH_MANAGER_KEY) -> tuple[int, ...]:
        """Shape of an ``.npy`` file, read from its header only."""
        return tuple(int(s) for s in np.load(path, mmap_mode="r").shape)  # a memory map reads the header only

    @staticmethod
    def get_file_idx_to_row_range(
        lengths: list[int], rank: int, world_size: int, start_row: int = 0, last_row: int | None = None
    ) -> dict[int, tuple[int, int]]:
        """``{file index: (first row, last row)}`` (inclusive, file-local) of ``rank``'s share.

        The rows ``start_row .. last_row`` of the files laid end to end are cut into ``world_size``
        contiguous shares whose sizes differ by at most one (the first ``total % world_size`` ranks
        get one row more).
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        total = (sum(lengths) - start_row) if last_row is None else (last_row - start_row + 1)
        per_rank, extra = divmod(total, world_size)
        left = start_row + rank * per_rank + min(rank, extra)
        right = left + per_rank + (1 if rank < extra else 0) - 1
        out: dict[int, tuple[int, int]] = {}
        file_left = 0
        for idx, length in enumerate(lengths):
            file_right = file_left + length - 1
            if left <= file_right and right >= file_left:
                out[idx] = (max(left, file_left) - file_left, min(right, file_right) - file_left)
            file_left += length
        return out

    @staticmethod
    def get_file_row_ranges_and_remainder(
        lengths: list[int], rank: int, world_size: int, start_row: int = 0, last_row: int | None = None
    ) -> tuple[dict[int, tuple[int, int]], int]:
        """torchrec's later name of :meth:`get_file_idx_to_row_range`: its ranges, and the number of
        rows left over by an even split (``rows % world_size``: ranks below it hold one row more)."""
        ranges = BinaryCriteoUtils.get_file_idx_to_row_range(lengths, rank, world_size, start_row, last_row)
        total = (sum(lengths) - start_row) if last_row is None else (last_row - start_row + 1)
        return ranges, total % world_size

    @staticmethod
    def load_npy_range(
        fname: str, start_row: int, num_rows: int, path_manager_key: str = PATH_MANAGER_KEY, mmap_mode: bool = False
    ) -> np.ndarray:
        """Rows ``[start_row, start_row + num_rows)`` of a 2-D ``.npy`` file (a copy, or a memory map)."""
        data = np.load(fname, mmap_mode="r")
        if data.ndim != 2:
            raise ValueError(f"{fname!r} holds a {data.ndim}-D array; load_npy_range reads 2-D arrays")
        if not 0 <= start_row < data.shape[0] or start_row + num_rows > data.shape[0]:
            raise ValueError(
                f"rows [{start_row}, {start_row + num_rows}) are outside {fname!r}'s {data.shape[0]} rows"
            )
        block = data[start_row : start_row + num_rows]
        return block if mmap_mode else np.array(block)


class InMemoryBinaryCriteoIterDataPipe(IterableDataset):
    """Batches of this rank's share of binary Criteo files, loaded into memory (module docstring).

    Args:
        stage: ``"train"`` (every row of the files), ``"val"`` / ``"test"`` (first / second half of
            the first file, torchrec's split of the last day).
        dense_paths, sparse_paths, labels_paths: the files, one triple per day, in order.
        batch_size: samples per batch. Every rank yields ``ceil(R / batch_size)`` batches, ``R``
            being ``rows // world_size``; the last one may be smaller, and on the first
            ``rows % world_size`` ranks it also holds their one extra row (so it can hold
            ``batch_size + 1``): the ranks together read every row once, in equally many steps
            (torchrec's split). With fewer rows than ranks, ranks with a row yield it as one batch.
        rank, world_size: which share of the rows this process reads.
        drop_last: every rank yields ``R // batch_size`` full batches and leaves the rest out.
        shuffle_batches: shuffle the samples inside each batch.
        shuffle_training_set: (``"train"`` only) permute every row of every file before the
            ranks take their shares: rank ``r`` gets block ``r`` of the permuted rows (the first
            ``rows % world_size`` ranks one row more), so the ranks together still read each row
            once. The files are memory-mapped and this rank's rows copied out (``mmap_mode`` is
            then moot).
        shuffle_training_set_random_seed: seed of the permutation and of ``shuffle_batches``
            (torchrec seeds numpy's global generator with it; here a generator of the reader's
            own draws the same numbers, and the global one is left alone).
        mmap_mode: memory-map the files instead of reading them into memory.
        hashes: rows of each of the 26 tables; ids are ``raw % hashes[f]`` (None: raw values).
    """

    def __init__(
        self,
        stage: str,
        dense_paths: list[str],
        sparse_paths: list[str],
        labels_paths: list[str],
        batch_size: int,
        rank: int,
        world_size: int,
        drop_last: bool | None = False,
        shuffle_batches: bool = False,
        shuffle_training_set: bool = False,
        shuffle_training_set_random_seed: int = 0,
        mmap_mode: bool = False,
        hashes: list[int] | None = None,
        path_manager_key: str = PATH_MANAGER_KEY,
    ) -> None:
        if stage not in ("train", "val", "test"):
            raise ValueError(f"stage must be 'train', 'val' or 'test', got {stage!r}")
        if batch_size < 1 or world_size < 1:
            raise ValueError(f"batch_size and world_size must be >= 1, got {batch_size!r} and {world_size!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
        if not (len(dense_paths) == len(sparse_paths) == len(labels_paths)) or not dense_paths:
            raise ValueError(
                "dense_paths, sparse_paths and labels_paths must list the same, non-zero number of files; got "
                f"{len(dense_paths)}, {len(sparse_paths)}, {len(labels_paths)}"
            )
        if hashes is not None and (len(hashes) != CAT_FEATURE_COUNT or any(h <= 0 for h in hashes)):
            raise ValueError(f"hashes must list {CAT_FEATURE_COUNT} positive table sizes, got {hashes!r}")
        self.stage, self.batch_size = stage, batch_size
        self.rank, self.world_size = rank, world_size
        self.shuffle_batches, self.mmap_mode = shuffle_batches, mmap_mode
        self.drop_last, self.shuffle_training_set = bool(drop_last), shuffle_training_set
        # torchrec seeds numpy's global generator; the reader's own one draws the same numbers
        self._rng = np.random.RandomState(shuffle_training_set_random_seed)
        self.hashes = None if hashes is None else np.asarray(hashes, dtype=np.int64).reshape(1, -1)
        start, last = 0, None
        self.remainder = 0  # rows % world_size: ranks below it hold one row more
        if stage != "train":
            rows = BinaryCriteoUtils.get_shape_from_npy(dense_paths[0])[0]
            half = math.ceil(rows / 2)
            start, last = (0, half - 1) if stage == "val" else (half, rows - 1)
            dense_paths, sparse_paths, labels_paths = dense_paths[:1], sparse_paths[:1], labels_paths[:1]
        self.dense_arrs: list[np.ndarray] = []
        self.sparse_arrs: list[np.ndarray] = []
        self.labels_arrs: list[np.ndarray] = []
        if shuffle_training_set and stage == "train":
            self._load_shuffled_share(dense_paths, sparse_paths, labels_paths)
        else:
            lengths = [BinaryCriteoUtils.get_shape_from_npy(p)[0] for p in dense_paths]
            ranges = BinaryCriteoUtils.get_file_idx_to_row_range(lengths, rank, world_size, start, last)
            total = (sum(lengths) - start) if last is None else (last - start + 1)
            self.remainder = total % world_size
            for arrs, paths in ((self.dense_arrs, dense_paths), (self.sparse_arrs, sparse_paths),
                                (self.labels_arrs, labels_paths)):  # fmt: skip
                for idx, (lo, hi) in ranges.items():
                    arrs.append(BinaryCriteoUtils.load_npy_range(paths[idx], lo, hi - lo + 1, mmap_mode=mmap_mode))
        self.num_rows_per_file = [a.shape[0] for a in self.dense_arrs]
        rows = sum(self.num_rows_per_file)
        # every rank holds `base` rows, the first `total % world_size` ranks one more: batch counts
        # come from `base` so that all ranks yield equally many (an extra row joins the last batch)
        base = rows - 1 if rank < self.remainder else rows
        if self.drop_last:
            self.num_batches = base // batch_size
        else:
            self.num_batches = math.ceil(base / batch_size) if base > 0 else int(rows > 0)
        self.keys = list(DEFAULT_CAT_NAMES)

    def _load_shuffled_share(self, dense_paths: list[str], sparse_paths: list[str], labels_paths: list[str]) -> None:
        """This rank's block of every file's rows after one permutation of all of them (torchrec's)."""
        files = [[np.load(p, mmap_mode="r", allow_pickle=False) for p in paths]
                 for paths in (dense_paths, sparse_paths, labels_paths)]  # fmt: skip
        lengths = [a.shape[0] for a in files[0]]
        total = sum(lengths)
        self.remainder = total % self.world_size
        destination = self._rng.permutation(total)  # row j of the concatenated files goes to destination[j]
        per_rank = np.full(self.world_size, total // self.world_size)
        per_rank[: total % self.world_size] += 1
        lo = int(per_rank[: self.rank].sum())
        hi = lo + int(per_rank[self.rank])
        for arrs, arrays in zip((self.dense_arrs, self.sparse_arrs, self.labels_arrs), files):
            block = np.empty((hi - lo, *arrays[0].shape[1:]), dtype=arrays[0].dtype)
            first = 0
            for array, n in zip(arrays, lengths):
                dest = destination[first : first + n]
                mine = np.nonzero((dest >= lo) & (dest < hi))[0]
                block[dest[mine] - lo] = array[mine]
                first += n
            arrs.append(block)

    def _to_batch(self, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray) -> Batch:
        if self.hashes is not None:
            sparse = sparse % self.hashes
        if self.shuffle_batches:
            order = self._rng.permutation(len(dense))
            dense, sparse, labels = dense[order], sparse[order], labels[order]
        return Batch(
            dense_features=torch.from_numpy(np.array(dense, dtype=np.float32)),
            sparse_features=one_id_per_key(self.keys, sparse),
            labels=torch.from_numpy(np.array(labels).reshape(-1)),
        )

    def __iter__(self) -> Iterator[Batch]:
        if not self.dense_arrs:
            return
        dense = np.concatenate(self.dense_arrs) if len(self.dense_arrs) > 1 else self.dense_arrs[0]
        sparse = np.concatenate(self.sparse_arrs) if len(self.sparse_arrs) > 1 else self.sparse_arrs[0]
        labels = np.concatenate(self.labels_arrs) if len(self.labels_arrs) > 1 else self.labels_arrs[0]
        for g in range(self.num_batches):
            start = g * self.batch_size
            last = g == self.num_batches - 1 and not self.drop_last
            end = len(dense) if last else start + self.batch_size  # the last batch takes the rest
            yield self._to_batch(dense[start:end], sparse[start:end], labels[start:end])

    def __len__(self) -> int:
        return self.num_batches
