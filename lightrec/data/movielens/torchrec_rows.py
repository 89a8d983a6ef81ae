"""torchrec's MovieLens row readers (``torchrec.datasets.movielens`` re-exports them): column names
and the rows of MovieLens 20M / 25M.

``movielens_20m(root)`` yields one dict per line of ``<root>/ratings.csv``::

    {"userId": 1, "movieId": 296, "rating": 5.0, "timestamp": 1147880044}

and, with ``include_movies_data=True``, that movie's ``"title"`` and ``"genres"`` from
``<root>/movies.csv`` as well (``""`` for a movie missing there). ``row_mapper=None`` yields each
row's list of strings unmapped, as torchrec's does. For training batches (dense ids, genres as a multi-hot feature,
time splits) use :func:`lightrec.data.read_movielens` and :class:`lightrec.data.MovieLensDataset`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset

from lightrec.data.csv_readers import LoadFiles, ReadLinesFromCSV, safe_cast

__all__ = [
    "DEFAULT_COLUMN_NAMES",
    "DEFAULT_GENOME_SCORES_COLUMN_NAMES",
    "DEFAULT_GENOME_TAGS_COLUMN_NAMES",
    "DEFAULT_LINKS_COLUMN_NAMES",
    "DEFAULT_MOVIES_COLUMN_NAMES",
    "DEFAULT_RATINGS_COLUMN_NAMES",
    "DEFAULT_TAGS_COLUMN_NAMES",
    "movielens_20m",
    "movielens_25m",
]

RATINGS_FILENAME = "ratings.csv"
MOVIES_FILENAME = "movies.csv"
DEFAULT_RATINGS_COLUMN_NAMES: list[str] = ["userId", "movieId", "rating", "timestamp"]
DEFAULT_MOVIES_COLUMN_NAMES: list[str] = ["movieId", "title", "genres"]
#: The columns of a rating row joined with its movie (``include_movies_data=True``).
DEFAULT_COLUMN_NAMES: list[str] = DEFAULT_RATINGS_COLUMN_NAMES + DEFAULT_MOVIES_COLUMN_NAMES[1:]
DEFAULT_TAGS_COLUMN_NAMES: list[str] = ["userId", "movieId", "tag", "timestamp"]
DEFAULT_LINKS_COLUMN_NAMES: list[str] = ["movieId", "imdbId", "tmdbId"]
DEFAULT_GENOME_SCORES_COLUMN_NAMES: list[str] = ["movieId", "tagId", "relevance"]
DEFAULT_GENOME_TAGS_COLUMN_NAMES: list[str] = ["tagId", "tag"]

_CASTERS: dict[str, Callable[[str], int | float | str]] = {
    "userId": lambda v: safe_cast(v, int, 0),
    "movieId": lambda v: safe_cast(v, int, 0),
    "rating": lambda v: safe_cast(v, float, 0.0),
    "timestamp": lambda v: safe_cast(v, int, 0),
    "title": lambda v: safe_cast(v, str, ""),
    "genres": lambda v: safe_cast(v, str, ""),
}


def _default_row_mapper(row: list[str]) -> dict[str, int | float | str]:
    """A rating row (4 fields, or 6 joined with its movie) as ``{column: typed value}``."""
    return {name: _CASTERS[name](value) for name, value in zip(DEFAULT_COLUMN_NAMES, row)}


class _MovieLensRows(IterableDataset):
    """The mapped rows of ``ratings.csv`` under ``root`` (header skipped), movie data joined on request."""

    def __init__(
        self,
        root: str,
        include_movies_data: bool,
        row_mapper: Callable[[list[str]], object] | None,
        open_kw: dict[str, Any],
    ) -> None:
        ratings = os.path.join(root, RATINGS_FILENAME)
        if not os.path.isfile(ratings):
            raise FileNotFoundError(
                f"{ratings!r} not found: root must be the unpacked MovieLens folder (ml-20m, ml-25m) holding "
                f"{RATINGS_FILENAME}"
            )
        self.root, self.include_movies_data = root, include_movies_data
        self.row_mapper, self.open_kw = row_mapper, open_kw

    def _movies(self) -> dict[int, list[str]]:
        path = os.path.join(self.root, MOVIES_FILENAME)
        rows = ReadLinesFromCSV(LoadFiles([path], mode="r", newline="", **self.open_kw), skip_first_line=True)
        return {safe_cast(r[0], int, 0): r[1:] for r in rows if r}

    def __iter__(self) -> Iterator[object]:
        movies = self._movies() if self.include_movies_data else {}
        path = os.path.join(self.root, RATINGS_FILENAME)
        files = LoadFiles([path], mode="r", newline="", **self.open_kw)
        for row in ReadLinesFromCSV(files, skip_first_line=True):
            if self.include_movies_data:
                row = row + movies.get(safe_cast(row[1], int, 0), ["", ""])
            yield self.row_mapper(row) if self.row_mapper is not None else row


def movielens_20m(
    root: str,
    *,
    include_movies_data: bool = False,
    row_mapper: Callable[[list[str]], object] | None = _default_row_mapper,
    **open_kw: Any,
) -> IterableDataset:
    """Rows of MovieLens 20M's ``ratings.csv`` (see the module docstring).

    Args:
        root: the unpacked ``ml-20m`` folder.
        include_movies_data: join ``title`` and ``genres`` from ``movies.csv``.
        row_mapper: applied to each row's list of fields (the joined movie fields appended with
            ``include_movies_data``); the default builds the dict above, ``None`` yields the list.
        **open_kw: ``open`` arguments.
    """
    return _MovieLensRows(root, include_movies_data, row_mapper, open_kw)


def movielens_25m(
    root: str,
    *,
    include_movies_data: bool = False,
    row_mapper: Callable[[list[str]], object] | None = _default_row_mapper,
    **open_kw: Any,
) -> IterableDataset:
    """Rows of MovieLens 25M's ``ratings.csv`` (same layout as :func:`movielens_20m`)."""
    return _MovieLensRows(root, include_movies_data, row_mapper, open_kw)
