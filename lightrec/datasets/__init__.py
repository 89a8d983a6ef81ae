"""torchrec's ``torchrec.datasets`` at its paths: re-exports of lightrec's homes in :mod:`lightrec.data`.

A torchrec training script's data code runs unchanged after ``sed s/torchrec/lightrec/``::

    from lightrec.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
    from lightrec.datasets.random import RandomRecDataset
    from lightrec.data.batch import Batch

=====================================  ===========================================================
path                                   what it gives
=====================================  ===========================================================
``lightrec.datasets.utils``            ``Batch`` (the very class of ``lightrec.data.Batch``),
                                       ``safe_cast``, ``LoadFiles``, ``ReadLinesFromCSV``
``lightrec.datasets.random``           ``RandomRecDataset``: random batches of given keys and sizes
``lightrec.datasets.criteo``           the Criteo constants, TSV readers (``criteo_kaggle``,
                                       ``criteo_terabyte``), ``BinaryCriteoUtils`` and
                                       ``InMemoryBinaryCriteoIterDataPipe`` over torchrec's npy files
``lightrec.datasets.movielens``        the MovieLens column names, ``movielens_20m`` / ``movielens_25m``
=====================================  ===========================================================

Every module here only re-exports (``tests/test_architecture.py`` checks it): the code lives in
``lightrec/data/csv_readers.py``, ``data/synthetic/random_batches.py``, ``data/criteo/`` (``spec.py``,
``torchrec_readers.py``) and ``data/movielens/torchrec_rows.py``. The readers are plain iterables
(``torch.utils.data.IterableDataset``); torchrec's are ``torchdata`` ``IterDataPipe`` s, which
lightrec does not depend on. docs/migrating-from-torchrec.md lists the differences.
"""

from lightrec.data.batch import Batch

__all__ = ["Batch"]
