"""``ComputeKJTToJTDict`` / ``ComputeJTDictToKJT``: torchrec's KJT <-> ``{key: JaggedTensor}``
conversions as modules, so a model can hold them as children (and fx keeps them as calls).

The only ``nn.Module`` s of ``lightrec.sparse``: they have no parameters and hold no state, and
torchrec users import them from ``torchrec.sparse.jagged_tensor``::

    #             0        1      2   <- sample
    # "f0"      [V0, V1]  None   [V2]
    # "f1"      [V3]      [V4]   [V5, V6, V7]
    {"f0": JaggedTensor([[V0, V1], [], [V2]]), "f1": JaggedTensor([[V3], [V4], [V5, V6, V7]])}
"""

from typing import Dict

import torch

from lightrec.sparse.jagged import JaggedTensor
from lightrec.sparse.keyed_jagged_tensor import KeyedJaggedTensor

__all__ = ["ComputeJTDictToKJT", "ComputeKJTToJTDict"]


class ComputeKJTToJTDict(torch.nn.Module):
    """``KeyedJaggedTensor -> {key: JaggedTensor}`` (views of each key's slice; variable-batch
    KJTs give each key its own batch size)."""

    def forward(self, keyed_jagged_tensor: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        return keyed_jagged_tensor.to_dict()


class ComputeJTDictToKJT(torch.nn.Module):
    """``{key: JaggedTensor} -> KeyedJaggedTensor`` (``KeyedJaggedTensor.from_jt_dict``)."""

    def forward(self, jt_dict: Dict[str, JaggedTensor]) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_jt_dict(jt_dict)
