"""torchrec's ``torchrec.datasets.utils``: ``Batch``, the small readers its datasets share and the
train/val split helpers.

A re-export of :mod:`lightrec.data.batch` and :mod:`lightrec.data.csv_readers` (also
``rand_split_train_val``, ``idx_split_train_val``, ``train_filter``, ``val_filter``, ``Limit``,
``ParallelReadConcat``: plain iterables, not ``torchdata`` pipes). ``Batch`` *is*
:class:`lightrec.data.Batch` (same class, not a copy): torchrec's fields (``dense_features``
``[B, D]``, ``sparse_features`` KJT, ``labels`` ``[B]``) and its ``to(device, non_blocking)``,
``record_stream(stream)`` and ``pin_memory()``, so batches built by a torchrec-style dataset flow
into lightrec's DataModules, ``RecModule`` and train pipelines alike.
"""

from lightrec.data.batch import Batch
from lightrec.data.csv_readers import (
    PATH_MANAGER_KEY,
    Limit,
    LoadFiles,
    ParallelReadConcat,
    ReadLinesFromCSV,
    idx_split_train_val,
    rand_split_train_val,
    safe_cast,
    train_filter,
    val_filter,
)

__all__ = [
    "PATH_MANAGER_KEY",
    "Batch",
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
