"""torchrec's ``torchrec.datasets.criteo``: the Criteo constants, TSV readers and the in-memory
reader of torchrec's binary (``.npy``) Criteo files.

A re-export of :mod:`lightrec.data.criteo` (``spec.py``: the constants; ``torchrec_readers.py``:
``criteo_kaggle``, ``criteo_terabyte``, ``BinaryCriteoUtils``, ``InMemoryBinaryCriteoIterDataPipe``
and their file layouts). lightrec's own Criteo pipeline (:func:`lightrec.data.preprocess_criteo`,
resumable, memory-mapped chunks) is the one to use for new work.
"""

from lightrec.data.batch import Batch as Batch
from lightrec.data.criteo import spec as _spec
from lightrec.data.criteo import torchrec_readers as _readers
from lightrec.data.criteo.parse import parse_criteo_lines as parse_criteo_lines
from lightrec.data.criteo.spec import CAT_FEATURE_COUNT as CAT_FEATURE_COUNT
from lightrec.data.criteo.spec import DAYS as DAYS
from lightrec.data.criteo.spec import DEFAULT_CAT_NAMES as DEFAULT_CAT_NAMES
from lightrec.data.criteo.spec import DEFAULT_COLUMN_NAMES as DEFAULT_COLUMN_NAMES
from lightrec.data.criteo.spec import DEFAULT_INT_NAMES as DEFAULT_INT_NAMES
from lightrec.data.criteo.spec import DEFAULT_LABEL_NAME as DEFAULT_LABEL_NAME
from lightrec.data.criteo.spec import FREQUENCY_THRESHOLD as FREQUENCY_THRESHOLD
from lightrec.data.criteo.spec import INT_FEATURE_COUNT as INT_FEATURE_COUNT
from lightrec.data.criteo.spec import TOTAL_TRAINING_SAMPLES as TOTAL_TRAINING_SAMPLES
from lightrec.data.criteo.torchrec_readers import *  # noqa: F403 - the readers' __all__, restated nowhere
from lightrec.data.csv_readers import PATH_MANAGER_KEY as PATH_MANAGER_KEY
from lightrec.data.csv_readers import LoadFiles as LoadFiles
from lightrec.data.csv_readers import ReadLinesFromCSV as ReadLinesFromCSV
from lightrec.data.csv_readers import safe_cast as safe_cast
from lightrec.data.errors import LineErrors as LineErrors
from lightrec.sparse import KeyedJaggedTensor as KeyedJaggedTensor

# torchrec's constants are the spec's names imported above (the spec also holds lightrec's
# cardinality tables and table builders, which torchrec's path does not carry).
__all__ = [name for name in _spec.__all__ if name in globals()] + list(_readers.__all__)
