"""torchrec's ``torchrec.datasets.criteo``: the Criteo constants, TSV readers and the in-memory
reader of torchrec's binary (``.npy``) Criteo files.

A re-export of :mod:`lightrec.data.criteo` (``spec.py``: the constants; ``torchrec_readers.py``:
``criteo_kaggle``, ``criteo_terabyte``, ``BinaryCriteoUtils``, ``InMemoryBinaryCriteoIterDataPipe``
and their file layouts). lightrec's own Criteo pipeline (:func:`lightrec.data.preprocess_criteo`,
resumable, memory-mapped chunks) is the one to use for new work.
"""

from lightrec.data.batch import Batch as Batch
from lightrec.data.criteo.parse import parse_criteo_lines as parse_criteo_lines
from lightrec.data.criteo.spec import (
    CAT_FEATURE_COUNT,
    DAYS,
    DEFAULT_CAT_NAMES,
    DEFAULT_COLUMN_NAMES,
    DEFAULT_INT_NAMES,
    DEFAULT_LABEL_NAME,
    FREQUENCY_THRESHOLD,
    INT_FEATURE_COUNT,
    TOTAL_TRAINING_SAMPLES,
)
from lightrec.data.criteo.torchrec_readers import (
    BinaryCriteoUtils,
    CriteoIterDataPipe,
    InMemoryBinaryCriteoIterDataPipe,
    criteo_kaggle,
    criteo_terabyte,
)
from lightrec.data.csv_readers import PATH_MANAGER_KEY as PATH_MANAGER_KEY
from lightrec.data.csv_readers import LoadFiles as LoadFiles
from lightrec.data.csv_readers import ReadLinesFromCSV as ReadLinesFromCSV
from lightrec.data.csv_readers import safe_cast as safe_cast
from lightrec.data.errors import LineErrors as LineErrors
from lightrec.sparse import KeyedJaggedTensor as KeyedJaggedTensor

__all__ = [
    "CAT_FEATURE_COUNT",
    "DAYS",
    "DEFAULT_CAT_NAMES",
    "DEFAULT_COLUMN_NAMES",
    "DEFAULT_INT_NAMES",
    "DEFAULT_LABEL_NAME",
    "FREQUENCY_THRESHOLD",
    "INT_FEATURE_COUNT",
    "TOTAL_TRAINING_SAMPLES",
    "BinaryCriteoUtils",
    "CriteoIterDataPipe",
    "InMemoryBinaryCriteoIterDataPipe",
    "criteo_kaggle",
    "criteo_terabyte",
]
