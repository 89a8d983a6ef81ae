"""The small file readers torchrec's datasets share: ``safe_cast``, ``LoadFiles``, ``ReadLinesFromCSV``.

torchrec builds its Criteo and MovieLens row readers from these (as ``torchdata`` pipes); lightrec's
are plain iterables (``torch.utils.data.IterableDataset``). ``torchrec.datasets.utils``'s path,
``lightrec.datasets.utils``, re-exports them together with :class:`~lightrec.data.Batch`.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, TypeVar

from torch.utils.data import IterableDataset

__all__ = ["PATH_MANAGER_KEY", "LoadFiles", "ReadLinesFromCSV", "safe_cast"]

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
