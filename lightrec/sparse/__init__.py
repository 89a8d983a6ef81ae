"""Sparse batch types: pure data, nothing else of lightrec imported.

- ``JaggedTensor``: one feature, variable ids per sample.
- ``KeyedJaggedTensor``: all sparse features of a batch, flat and key-major (optionally with a
  batch size per key: variable-batch input).
- ``KeyedTensor``: named dense blocks side by side (pooled embeddings).

``lightrec.sparse.jagged_tensor`` is torchrec's import path for all of them (and for
``jt_is_equal``, ``kjt_is_equal``, ``ComputeKJTToJTDict``, ``ComputeJTDictToKJT``).
"""

from lightrec.sparse import pytree as _pytree  # noqa: F401 - registers the types with torch's pytree
from lightrec.sparse.conversion_modules import ComputeJTDictToKJT, ComputeKJTToJTDict
from lightrec.sparse.equality import jt_is_equal, kjt_is_equal
from lightrec.sparse.jagged import JaggedTensor, SparseValueError
from lightrec.sparse.keyed_jagged_tensor import KeyedJaggedTensor
from lightrec.sparse.keyed_tensor import KeyedTensor

__all__ = [
    "ComputeJTDictToKJT",
    "ComputeKJTToJTDict",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "SparseValueError",
    "jt_is_equal",
    "kjt_is_equal",
]
