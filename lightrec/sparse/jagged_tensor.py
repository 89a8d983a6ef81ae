"""torchrec's ``torchrec.sparse.jagged_tensor`` path: the sparse types and their helpers, re-exported.

Nothing is defined here; each name lives in the file that explains it:
:mod:`~lightrec.sparse.jagged` (``JaggedTensor``), :mod:`~lightrec.sparse.keyed_jagged_tensor`,
:mod:`~lightrec.sparse.keyed_tensor`, :mod:`~lightrec.sparse.equality` (``jt_is_equal``,
``kjt_is_equal``) and :mod:`~lightrec.sparse.conversion_modules`.
"""

from lightrec.sparse.conversion_modules import ComputeJTDictToKJT, ComputeKJTToJTDict
from lightrec.sparse.equality import jt_is_equal, kjt_is_equal
from lightrec.sparse.jagged import JaggedTensor, JaggedTensorMeta, SparseValueError
from lightrec.sparse.keyed_jagged_tensor import KeyedJaggedTensor
from lightrec.sparse.keyed_tensor import KeyedTensor

__all__ = [
    "ComputeJTDictToKJT",
    "ComputeKJTToJTDict",
    "JaggedTensor",
    "JaggedTensorMeta",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "SparseValueError",
    "jt_is_equal",
    "kjt_is_equal",
]
