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

from lightrec.data import csv_readers
from lightrec.data.batch import Batch
from lightrec.data.csv_readers import *  # noqa: F403 - torchrec's names, all of csv_readers.__all__

__all__ = ["Batch", *csv_readers.__all__]
