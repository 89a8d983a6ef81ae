"""torchrec's ``torchrec.datasets.random``: ``RandomRecDataset``, batches of random ids, dense
features and labels for benchmarks and smoke tests of a training loop.

A re-export of :mod:`lightrec.data.synthetic.random_batches`, where the class and its layout are
documented.
"""

from lightrec.data.batch import Batch as Batch
from lightrec.data.synthetic.random_batches import RandomRecDataset
from lightrec.sparse import KeyedJaggedTensor as KeyedJaggedTensor

__all__ = ["RandomRecDataset"]
