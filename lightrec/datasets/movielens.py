"""torchrec's ``torchrec.datasets.movielens``: column names and row readers of MovieLens 20M / 25M.

A re-export of :mod:`lightrec.data.movielens.torchrec_rows`, where the rows they yield are
documented. For training batches (dense ids, genres as a multi-hot feature, time splits) use
:func:`lightrec.data.read_movielens` and :class:`lightrec.data.MovieLensDataset`.
"""

from lightrec.data.csv_readers import LoadFiles as LoadFiles
from lightrec.data.csv_readers import ReadLinesFromCSV as ReadLinesFromCSV
from lightrec.data.csv_readers import safe_cast as safe_cast
from lightrec.data.movielens import torchrec_rows as _home
from lightrec.data.movielens.torchrec_rows import *  # noqa: F403 - the home's __all__, restated nowhere
from lightrec.data.movielens.torchrec_rows import MOVIES_FILENAME as MOVIES_FILENAME
from lightrec.data.movielens.torchrec_rows import RATINGS_FILENAME as RATINGS_FILENAME

__all__ = list(_home.__all__)
