"""torchrec's ``torchrec.datasets.movielens``: column names and row readers of MovieLens 20M / 25M.

A re-export of :mod:`lightrec.data.movielens.torchrec_rows`, where the rows they yield are
documented. For training batches (dense ids, genres as a multi-hot feature, time splits) use
:func:`lightrec.data.read_movielens` and :class:`lightrec.data.MovieLensDataset`.
"""

from lightrec.data.csv_readers import LoadFiles as LoadFiles
from lightrec.data.csv_readers import ReadLinesFromCSV as ReadLinesFromCSV
from lightrec.data.csv_readers import safe_cast as safe_cast
from lightrec.data.movielens.torchrec_rows import (
    DEFAULT_GENOME_SCORES_COLUMN_NAMES,
    DEFAULT_GENOME_TAGS_COLUMN_NAMES,
    DEFAULT_LINKS_COLUMN_NAMES,
    DEFAULT_MOVIES_COLUMN_NAMES,
    DEFAULT_RATINGS_COLUMN_NAMES,
    DEFAULT_TAGS_COLUMN_NAMES,
    movielens_20m,
    movielens_25m,
)
from lightrec.data.movielens.torchrec_rows import MOVIES_FILENAME as MOVIES_FILENAME
from lightrec.data.movielens.torchrec_rows import RATINGS_FILENAME as RATINGS_FILENAME

__all__ = [
    "DEFAULT_GENOME_SCORES_COLUMN_NAMES",
    "DEFAULT_GENOME_TAGS_COLUMN_NAMES",
    "DEFAULT_LINKS_COLUMN_NAMES",
    "DEFAULT_MOVIES_COLUMN_NAMES",
    "DEFAULT_RATINGS_COLUMN_NAMES",
    "DEFAULT_TAGS_COLUMN_NAMES",
    "movielens_20m",
    "movielens_25m",
]
