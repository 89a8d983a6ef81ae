"""torchrec's ``torchrec.sparse.jagged_tensor`` path: the sparse types and their helpers, re-exported.

Nothing is defined here; each name lives in the file that explains it:
:mod:`~lightrec.sparse.jagged` (``JaggedTensor``), :mod:`~lightrec.sparse.keyed_jagged_tensor`,
:mod:`~lightrec.sparse.keyed_tensor`, :mod:`~lightrec.sparse.equality` (``jt_is_equal``,
``kjt_is_equal``), :mod:`~lightrec.sparse.conversion_modules` and, for the private regroup helpers
torchrec's tests and extensions call (``_regroup_keyed_tensors``, ``_all_keys_used_once``,
``_fbgemm_permute_pooled_embs``, ``_kt_regroup_arguments``), :mod:`~lightrec.sparse.keyed_tensor` and
:mod:`~lightrec.sparse.kt_regroup`.
"""

from lightrec.sparse.conversion_modules import ComputeJTDictToKJT, ComputeKJTToJTDict
from lightrec.sparse.equality import jt_is_equal, kjt_is_equal
from lightrec.sparse.jagged import JaggedTensor, JaggedTensorMeta, SparseValueError
from lightrec.sparse.keyed_jagged_tensor import KeyedJaggedTensor
from lightrec.sparse.keyed_tensor import KeyedTensor, _regroup_keyed_tensors
from lightrec.sparse.kt_regroup import _all_keys_used_once, _fbgemm_permute_pooled_embs, _kt_regroup_arguments

__all__ = [
    "ComputeJTDictToKJT",
    "ComputeKJTToJTDict",
    "JaggedTensor",
    "JaggedTensorMeta",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "SparseValueError",
    "_all_keys_used_once",
    "_fbgemm_permute_pooled_embs",
    "_kt_regroup_arguments",
    "_regroup_keyed_tensors",
    "jt_is_equal",
    "kjt_is_equal",
]
