"""Sparse batch types: pure data, no ``nn.Module``, nothing else of lightrec imported.

- ``JaggedTensor``: one feature, variable ids per sample.
- ``KeyedJaggedTensor``: all sparse features of a batch, flat and key-major.
- ``KeyedTensor``: named dense blocks side by side (pooled embeddings).
"""

from lightrec.sparse.jagged_tensor import JaggedTensor, SparseValueError
from lightrec.sparse.keyed_jagged_tensor import KeyedJaggedTensor
from lightrec.sparse.keyed_tensor import KeyedTensor

__all__ = ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor", "SparseValueError"]
