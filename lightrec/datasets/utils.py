"""torchrec's ``torchrec.datasets.utils``: ``Batch`` and the small readers its datasets share.

A re-export of :mod:`lightrec.data.batch` and :mod:`lightrec.data.csv_readers`. ``Batch`` *is*
:class:`lightrec.data.Batch` (same class, not a copy): torchrec's fields (``dense_features``
``[B, D]``, ``sparse_features`` KJT, ``labels`` ``[B]``) and its ``to(device, non_blocking)``,
``record_stream(stream)`` and ``pin_memory()``, so batches built by a torchrec-style dataset flow
into lightrec's DataModules, ``RecModule`` and train pipelines alike.
"""

from lightrec.data.batch import Batch
from lightrec.data.csv_readers import PATH_MANAGER_KEY, LoadFiles, ReadLinesFromCSV, safe_cast

__all__ = ["PATH_MANAGER_KEY", "Batch", "LoadFiles", "ReadLinesFromCSV", "safe_cast"]
