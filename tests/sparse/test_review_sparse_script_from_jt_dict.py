"""``KeyedJaggedTensor.from_jt_dict`` (and ``ComputeJTDictToKJT``) compile under ``torch.jit.script``.

torchrec's ``from_jt_dict`` is scriptable; lightrec's failed to compile ("Comprehension ifs are not
supported yet") in its mixed-weights check, so a scripted model that stacks JaggedTensors could not
be compiled at all.
"""

import pytest
import torch

from lightrec.sparse import JaggedTensor, KeyedJaggedTensor
from lightrec.sparse.jagged_tensor import ComputeJTDictToKJT


def _stack(jt_dict: dict[str, JaggedTensor], variable_batch: bool) -> KeyedJaggedTensor:
    return KeyedJaggedTensor.from_jt_dict(jt_dict, variable_batch)


def test_from_jt_dict_and_its_module_script_and_match_eager() -> None:
    jt_dict = {
        "product": JaggedTensor(values=torch.tensor([1, 2, 1, 5]), lengths=torch.tensor([3, 1])),
        "user": JaggedTensor(values=torch.tensor([2, 3, 4, 1]), lengths=torch.tensor([2, 2])),
    }
    scripted = torch.jit.script(_stack)
    kjt = scripted(jt_dict, False)
    assert kjt.keys() == ["product", "user"]
    assert kjt.lengths().tolist() == [3, 1, 2, 2]
    assert kjt.values().tolist() == [1, 2, 1, 5, 2, 3, 4, 1]
    assert kjt.length_per_key_or_none() == [4, 4]  # synced, as eager
    assert torch.jit.script(ComputeJTDictToKJT())(jt_dict).lengths().tolist() == [3, 1, 2, 2]

    weighted = {
        "a": JaggedTensor(values=torch.tensor([7]), weights=torch.tensor([0.5]), lengths=torch.tensor([1])),
        "b": JaggedTensor(values=torch.tensor([8, 9]), weights=torch.tensor([1.0, 2.0]), lengths=torch.tensor([2, 0])),
    }
    vbe = scripted(weighted, True)
    assert vbe.stride_per_key_per_rank() == [[1], [2]]
    assert vbe.weights().tolist() == [0.5, 1.0, 2.0]
    with pytest.raises(Exception, match="different batch sizes"):
        scripted(weighted, False)
    mixed = {"a": weighted["a"], "u": JaggedTensor(values=torch.tensor([3]), lengths=torch.tensor([1]))}
    with pytest.raises(Exception, match="have no weights"):
        scripted(mixed, False)
