"""The small file readers and row helpers torchrec's datasets share (``torchrec.datasets.utils``).

torchrec builds its Criteo and MovieLens row readers from these (as ``torchdata`` pipes); lightrec's
are plain iterables (``torch.utils.data.IterableDataset``), so there is no functional ``.limit(n)``
form. ``torchrec.datasets.utils``'s path, ``lightrec.datasets.utils``, re-exports them together with
:class:`~lightrec.data.Batch`:

==========================  ====================================================================
``safe_cast``               ``dest_type(val)``, or a default when the conversion fails
``LoadFiles``               ``(path, open file)`` per path
``ReadLinesFromCSV``        the fields of every line of those files
``idx_split_train_val``     row ``i`` goes to train when ``key_fn(i) % 10**decimal_places <
                            round(train_perc * 10**decimal_places)``, else to val
``rand_split_train_val``    row ``i`` goes to train when the ``i``-th draw of
                            ``random.Random(random_seed).random()`` is below ``train_perc``
``train_filter``,           the index rule of ``idx_split_train_val`` as a function of
``val_filter``              ``(key_fn, train_perc, decimal_places, idx)``
``Limit``                   the first ``limit`` rows
``ParallelReadConcat``      several sources one after the other; in a ``DataLoader`` with
                            workers, each worker reads its own contiguous share of the sources
==========================  ====================================================================

Both splits wrap any re-iterable source of rows (a list, a reader) and are deterministic and
disjoint: the train and the val stream each replay the same keys (or the same seeded draws) from the
start on every pass, so together they hold every row exactly once, in order, however often either
is iterated.
"""

from __future__ import annotations

import csv
import math
import os
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import IO, Any, TypeVar

from torch.utils.data import IterableDataset, get_worker_info

__all__ = [
    "PATH_MANAGER_KEY",
    "Limit",
    "LoadFiles",
    "ParallelReadConcat",
    "ReadLinesFromCSV",
    "idx_split_train_val",
    "rand_split_train_val",
    "safe_cast",
    "train_filter",
    "val_filter",
]

PATH_MANAGER_KEY = "torchrec"
"""Accepted for torchrec's ``path_manager_key=`` arguments; lightrec opens local paths with ``open``."""

T = TypeVar("T")
V = TypeVar("V")


def safe_cast(val: V, dest_type: Callable[[V], T], default: T) -> T:
    """``dest_type(val)``, or ``default`` when the conversion fails (an empty Criteo field)."""
    try:
        return dest_type(val)
    except (ValueError, TypeError):
        return default


class LoadFiles(IterableDataset):
    """Yields ``(path, open file)`` for each path, opened with ``open(path, **open_kw)``.

    Args:
        paths: local file paths, in order.
        mode: ``open`` mode (``"r"`` text, ``"rb"`` bytes).
        **open_kw: other ``open`` arguments (``encoding=``, ``newline=`` ...).
    """

    def __init__(self, paths: Iterable[str], mode: str = "r", **open_kw: Any) -> None:
        self.paths = paths
        self.mode = mode
        self.open_kw = open_kw

    def __iter__(self) -> Iterator[tuple[str, IO[Any]]]:
        for path in self.paths:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"LoadFiles: {path!r} is not a file")
            with open(path, self.mode, **self.open_kw) as f:
                yield path, f


class ReadLinesFromCSV(IterableDataset):
    """Splits every line of the files of a :class:`LoadFiles` into its fields (``csv.reader``).

    Args:
        datapipe: yields ``(path, text file)`` pairs.
        skip_first_line: drop each file's header line.
        **kw: ``csv.reader`` options (``delimiter="\\t"`` for Criteo).
    """

    def __init__(self, datapipe: Iterable[tuple[str, IO[str]]], skip_first_line: bool = False, **kw: Any) -> None:
        self.datapipe = datapipe
        self.skip_first_line = skip_first_line
        self.kw = kw

    def __iter__(self) -> Iterator[list[str]]:
        for _, f in self.datapipe:
            reader = csv.reader(f, **self.kw)
            if self.skip_first_line:
                next(reader, None)
            yield from reader


def _check_source(fn: str, name: str, source: object) -> None:
    if not isinstance(source, Iterable):
        raise TypeError(
            f"{fn}({name}=...) must be an iterable of rows (a list, a reader, an IterableDataset), "
            f"got {type(source).__name__}"
        )


def _check_train_perc(fn: str, train_perc: float) -> None:
    if isinstance(train_perc, bool) or not isinstance(train_perc, int | float) or not 0.0 < train_perc < 1.0:
        raise ValueError(
            f"{fn}(train_perc={train_perc!r}): train_perc must be in range (0.0, 1.0), the fraction of rows "
            "that go to the train split (e.g. 0.9)"
        )


def _default_key_fn(idx: int) -> int:
    return idx


def train_filter(key_fn: Callable[[int], int], train_perc: float, decimal_places: int, idx: int) -> bool:
    """True when row ``idx`` belongs to the train split: ``key_fn(idx) % 10**decimal_places <
    round(train_perc * 10**decimal_places)`` (with the default key, the first ``train_perc`` of every
    ``10**decimal_places`` rows)."""
    scale = 10**decimal_places
    return key_fn(idx) % scale < round(train_perc * scale)


def val_filter(key_fn: Callable[[int], int], train_perc: float, decimal_places: int, idx: int) -> bool:
    """True when row ``idx`` belongs to the val split: ``not train_filter(...)``."""
    return not train_filter(key_fn, train_perc, decimal_places, idx)


class _IdxFilter(IterableDataset[T]):
    """The rows of ``datapipe`` whose index passes ``filter_fn``."""

    def __init__(self, datapipe: Iterable[T], filter_fn: Callable[[int], bool]) -> None:
        self.datapipe = datapipe
        self.filter_fn = filter_fn

    def __iter__(self) -> Iterator[T]:
        for idx, row in enumerate(self.datapipe):
            if self.filter_fn(idx):
                yield row


def idx_split_train_val(
    datapipe: Iterable[T],
    train_perc: float,
    decimal_places: int = 2,
    key_fn: Callable[[int], int] = _default_key_fn,
) -> tuple[IterableDataset[T], IterableDataset[T]]:
    """Split ``datapipe`` into ``(train, val)`` by each row's index (see :func:`train_filter`).

    Args:
        datapipe: the rows; iterated once per pass of either split.
        train_perc: fraction in ``(0.0, 1.0)`` of every ``10**decimal_places`` keys that go to train.
        decimal_places: precision of ``train_perc`` (2: percent).
        key_fn: the key of row ``idx`` (default: ``idx``); a hash spreads train rows evenly.
    """
    fn = "idx_split_train_val"
    _check_source(fn, "datapipe", datapipe)
    _check_train_perc(fn, train_perc)
    if isinstance(decimal_places, bool) or not isinstance(decimal_places, int) or decimal_places < 0:
        raise ValueError(
            f"{fn}(decimal_places={decimal_places!r}): decimal_places must be an int >= 0 (e.g. 2)"
        )
    if not callable(key_fn):
        raise TypeError(f"{fn}(key_fn=...) must be a function of the row index, got {type(key_fn).__name__}")
    return (
        _IdxFilter(datapipe, partial(train_filter, key_fn, train_perc, decimal_places)),
        _IdxFilter(datapipe, partial(val_filter, key_fn, train_perc, decimal_places)),
    )


class _RandFilter(IterableDataset[T]):
    """The rows of ``datapipe`` for which ``filter_fn(rng)`` holds, ``rng`` restarted every pass."""

    def __init__(
        self, datapipe: Iterable[T], filter_fn: Callable[[random.Random], bool], rand_gen: random.Random
    ) -> None:
        self.datapipe = datapipe
        self.filter_fn = filter_fn
        self.rand_gen = rand_gen
        self.rand_gen_init_state = rand_gen.getstate()

    def __iter__(self) -> Iterator[T]:
        self.rand_gen.setstate(self.rand_gen_init_state)
        for row in self.datapipe:
            if self.filter_fn(self.rand_gen):
                yield row


def _rand_in_train(train_perc: float, rand_gen: random.Random) -> bool:
    return rand_gen.random() < train_perc


def _rand_in_val(train_perc: float, rand_gen: random.Random) -> bool:
    return not _rand_in_train(train_perc, rand_gen)


def rand_split_train_val(
    datapipe: Iterable[T], train_perc: float, random_seed: int = 0
) -> tuple[IterableDataset[T], IterableDataset[T]]:
    """Split ``datapipe`` into ``(train, val)`` by a seeded uniform draw per row.

    Row ``i`` goes to train when the ``i``-th ``random.Random(random_seed).random()`` is below
    ``train_perc``, so the train share is about (not exactly) ``train_perc``, and the same seed gives
    the same split on every pass and in every process.

    Args:
        datapipe: the rows; iterated once per pass of either split.
        train_perc: fraction in ``(0.0, 1.0)`` of rows expected in train.
        random_seed: seed of the draws; use the same value wherever the split must agree.
    """
    fn = "rand_split_train_val"
    _check_source(fn, "datapipe", datapipe)
    _check_train_perc(fn, train_perc)
    if isinstance(random_seed, bool) or not isinstance(random_seed, int):
        raise TypeError(f"{fn}(random_seed={random_seed!r}): random_seed must be an int (e.g. 0)")
    return (
        _RandFilter(datapipe, partial(_rand_in_train, train_perc), random.Random(random_seed)),
        _RandFilter(datapipe, partial(_rand_in_val, train_perc), random.Random(random_seed)),
    )


class Limit(IterableDataset[T]):
    """The first ``limit`` rows of ``datapipe`` (all of them when it has fewer)."""

    def __init__(self, datapipe: Iterable[T], limit: int) -> None:
        _check_source("Limit", "datapipe", datapipe)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"Limit(limit={limit!r}): limit must be an int >= 0, the number of rows to keep")
        self.datapipe = datapipe
        self.limit = limit

    def __iter__(self) -> Iterator[T]:
        if self.limit == 0:
            return
        for idx, row in enumerate(self.datapipe):
            yield row
            if idx + 1 >= self.limit:
                break


def _default_dp_selector(datapipes: Sequence[Iterable[T]]) -> Sequence[Iterable[T]]:
    """The sources this ``DataLoader`` worker reads: all of them outside workers, else a contiguous
    share (``ceil`` of what is left over the workers left, so earlier workers take the extra ones)."""
    info = get_worker_info()
    if info is None:
        return datapipes
    if info.num_workers > len(datapipes):
        raise ValueError(
            f"ParallelReadConcat: DataLoader(num_workers={info.num_workers}) exceeds the number of "
            f"sources ({len(datapipes)}); give each worker at least one source or lower num_workers"
        )
    bounds = [0]
    for workers_left in range(info.num_workers, 0, -1):
        bounds.append(bounds[-1] + math.ceil((len(datapipes) - bounds[-1]) / workers_left))
    return datapipes[bounds[info.id] : bounds[info.id + 1]]


class ParallelReadConcat(IterableDataset[T]):
    """The rows of several sources, one source after the other.

    In a ``DataLoader(num_workers=n)`` each worker reads only the sources ``dp_selector`` gives it
    (default: a contiguous share, at least one each), so ``n`` files are read in parallel and every
    row is read once. Use ``batch_size=None`` when the sources already yield batches.

    Args:
        *datapipes: the sources (e.g. one Criteo reader per file).
        dp_selector: ``sources -> the sources this worker reads``.
    """

    def __init__(
        self,
        *datapipes: Iterable[T],
        dp_selector: Callable[[Sequence[Iterable[T]]], Sequence[Iterable[T]]] = _default_dp_selector,
    ) -> None:
        for i, dp in enumerate(datapipes):
            _check_source("ParallelReadConcat", f"datapipes[{i}]", dp)
        self.datapipes: tuple[Iterable[T], ...] = datapipes
        self.dp_selector = dp_selector

    def __iter__(self) -> Iterator[T]:
        for dp in self.dp_selector(self.datapipes):
            yield from dp
