"""torchrec's private sparse helpers at ``lightrec.sparse.jagged_tensor`` (regroups), and the
``tensor_dict`` / ``jagged_tensor_validator`` modules: each against a plain-PyTorch reference."""

from __future__ import annotations

import logging

import pytest
import torch

from lightrec._fbgemm import has_fbgemm_op
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor
from lightrec.sparse.jagged_tensor import (
    _all_keys_used_once,
    _fbgemm_permute_pooled_embs,
    _kt_regroup_arguments,
    _regroup_keyed_tensors,
)
from lightrec.sparse.jagged_tensor_validator import validate_keyed_jagged_tensor
from lightrec.sparse.tensor_dict import maybe_td_to_kjt


def _kts(requires_grad: bool = False) -> list[KeyedTensor]:
    torch.manual_seed(0)
    a = torch.randn(3, 3, requires_grad=requires_grad)  # a (1 col) | b (2 cols)
    c = torch.randn(3, 3, requires_grad=requires_grad)  # c (3 cols)
    return [KeyedTensor(["a", "b"], [1, 2], a), KeyedTensor(["c"], [3], c)]


def _reference(kts: list[KeyedTensor], groups: list[list[str]]) -> list[torch.Tensor]:
    blocks = {k: v for kt in kts for k, v in kt.to_dict().items()}
    return [torch.cat([blocks[k] for k in group], dim=1) for group in groups]


@pytest.mark.parametrize(
    "groups", [[["c", "a"], ["b"]], [["b", "a", "c"]], [["c", "a"], ["b", "a"], ["a"]], [["b"]]]
)
def test_permute_pooled_embs_equals_concatenation_values_and_gradients(groups: list[list[str]]) -> None:
    kts = _kts(requires_grad=True)
    got = _fbgemm_permute_pooled_embs(kts, groups)
    want = _reference(kts, groups)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    weights = [torch.randn_like(w) for w in want]
    inputs = [kt.values() for kt in kts]
    grads = torch.autograd.grad(sum((g * x).sum() for g, x in zip(got, weights)), inputs, materialize_grads=True)
    want_grads = torch.autograd.grad(sum((w * x).sum() for w, x in zip(want, weights)), inputs, materialize_grads=True)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w)
    for g, w in zip(_regroup_keyed_tensors(_kts(), groups), _reference(_kts(), groups)):
        torch.testing.assert_close(g, w)


def test_permute_pooled_embs_names_a_missing_key() -> None:
    with pytest.raises(KeyError, match="'z' is in no KeyedTensor"):
        _fbgemm_permute_pooled_embs(_kts(), [["a", "z"]])


def test_all_keys_used_once() -> None:
    kts = _kts()
    assert _all_keys_used_once(kts, [["c", "a"], ["b"]])
    assert not _all_keys_used_once(kts, [["c", "a"], ["b", "a"]])  # a twice
    assert not _all_keys_used_once(kts, [["c", "a"]])  # b left out
    assert not _all_keys_used_once([KeyedTensor(["a"], [1], torch.ones(1, 1))] * 2, [["a"], ["a"]])


def test_kt_regroup_arguments_plan_written_out() -> None:
    keys, lengths = [["a", "b"], ["c"]], [[1, 2], [3]]
    groups = [["c", "a"], ["b", "a"], ["a"]]
    permutes, in_shapes, out_shapes, out_lengths = _kt_regroup_arguments(torch.empty(0), keys, lengths, groups)
    # [in tensor, out tensor, in start, out start, width, jump]; "a" is copied by rows 1, 3, 4:
    # its first row points to row 3, row 3 to -4, the last row holds -P = -5.
    assert permutes.tolist() == [
        [1, 0, 0, 0, 3, 0],
        [0, 0, 0, 3, 1, 3],
        [0, 1, 1, 0, 2, 0],
        [0, 1, 0, 2, 1, -4],
        [0, 2, 0, 0, 1, -5],
    ]
    assert permutes.dtype == torch.int32
    assert in_shapes.tolist() == [3, 3] and out_shapes.tolist() == [4, 3, 1] and out_lengths == [4, 3, 1]
    with pytest.raises(KeyError, match="'z'"):
        _kt_regroup_arguments(torch.empty(0), keys, lengths, [["z"]])


@pytest.mark.skipif(not has_fbgemm_op("permute_multi_embedding"), reason="fbgemm's permute_multi_embedding")
def test_kt_regroup_arguments_drive_fbgemm_permute_multi_embedding() -> None:
    kts = _kts()
    groups = [["c", "a"], ["b", "a"], ["a"], ["c"]]
    keys = [kt.keys() for kt in kts]
    lengths = [kt.length_per_key() for kt in kts]
    plan = _kt_regroup_arguments(kts[0].values(), keys, lengths, groups)
    ours = torch.ops.fbgemm.kt_regroup_arguments(kts[0].values(), keys, lengths, groups)
    for a, b in zip(plan[:3], ours[:3]):
        assert torch.equal(a, b)
    out = torch.ops.fbgemm.permute_multi_embedding([kt.values() for kt in kts], *plan)
    for g, w in zip(out, _reference(kts, groups)):
        torch.testing.assert_close(g, w)


# ---------------------------------------------------------------------------- tensor_dict
def test_maybe_td_to_kjt_passes_other_inputs_through() -> None:
    kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    assert maybe_td_to_kjt(kjt) is kjt


def test_maybe_td_to_kjt_lays_out_a_tensordict_key_major() -> None:
    tensordict = pytest.importorskip("tensordict")
    f = torch.nested.nested_tensor([torch.tensor([1, 2]), torch.tensor([3])], layout=torch.jagged)
    g = torch.nested.nested_tensor_from_jagged(torch.tensor([4, 5, 6]), lengths=torch.tensor([0, 3]))
    td = tensordict.TensorDict({"f": f, "g": g}, batch_size=[2])
    kjt = maybe_td_to_kjt(td)
    assert kjt.keys() == ["f", "g"]
    assert kjt.values().tolist() == [1, 2, 3, 4, 5, 6] and kjt.lengths().tolist() == [2, 1, 0, 3]
    assert kjt["g"].to_dense()[1].tolist() == [4, 5, 6]
    picked = maybe_td_to_kjt(td, ["g"])
    assert picked.keys() == ["g"] and picked.values().tolist() == [4, 5, 6] and picked.lengths().tolist() == [0, 3]
    with pytest.raises(KeyError, match=r"\['h'\] are not in the TensorDict"):
        maybe_td_to_kjt(td, ["f", "h"])
    with pytest.raises(TypeError, match="feature 'd' must be a jagged nested tensor"):
        maybe_td_to_kjt(tensordict.TensorDict({"d": torch.ones(2, 3)}, batch_size=[2]))


# ------------------------------------------------------------------------------ validator
class _Table:
    def __init__(self, num_embeddings: int, feature_names: list[str]) -> None:
        self.num_embeddings, self.feature_names = num_embeddings, feature_names


def test_validator_layout_errors_and_soft_range_check(caplog: pytest.LogCaptureFixture) -> None:
    kjt = KeyedJaggedTensor(keys=["f", "g"], values=torch.tensor([1, 2, 9]), lengths=torch.tensor([1, 1, 1, 0]))
    assert validate_keyed_jagged_tensor(kjt)
    assert validate_keyed_jagged_tensor(kjt, [_Table(10, ["f", "g"])])
    with caplog.at_level(logging.WARNING):
        assert not validate_keyed_jagged_tensor(kjt, [_Table(10, ["f"]), _Table(5, ["g"])])
    assert "feature 'g' has ids in [9, 9], outside [0, 5)" in caplog.text
    assert validate_keyed_jagged_tensor(kjt, [_Table(3, ["other"])])  # features no table lists: skipped
    short = KeyedJaggedTensor(keys=["f", "g"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1, 1, 0]))
    with pytest.raises(ValueError):
        validate_keyed_jagged_tensor(short)
    odd = KeyedJaggedTensor(keys=["f", "g"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="not divisible by its 2 keys"):
        validate_keyed_jagged_tensor(odd)
