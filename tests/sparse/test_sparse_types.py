"""Behaviour of JaggedTensor / KeyedJaggedTensor / KeyedTensor: constructors, accessors, errors."""

from __future__ import annotations

import pytest
import torch

from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor, SparseValueError


def _kjt(weighted: bool = False) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(
        keys=["a", "b", "c"],
        values=torch.tensor([1, 2, 3, 4, 5, 6, 7]),
        lengths=torch.tensor([2, 0, 1, 1, 3, 0]),
        weights=torch.arange(7, dtype=torch.float32) if weighted else None,
    )


def test_accessors_follow_the_key_major_layout(device: torch.device) -> None:
    kjt = _kjt().to(device)
    assert kjt.values().device.type == device.type
    assert kjt.stride() == 2
    assert kjt.length_per_key() == [2, 2, 3]
    assert kjt.offset_per_key() == [0, 2, 4, 7]
    assert kjt.index_per_key() == {"a": 0, "b": 1, "c": 2}
    assert kjt.offsets().tolist() == [0, 2, 2, 3, 4, 7, 7]
    assert kjt["b"].values().tolist() == [3, 4]
    assert kjt["c"].lengths().tolist() == [3, 0]
    assert kjt.weights_or_none() is None
    with pytest.raises(ValueError, match="no weights"):
        kjt.weights()


def test_from_offsets_and_from_lengths_sync_agree() -> None:
    a = KeyedJaggedTensor.from_lengths_sync(["x", "y"], torch.tensor([1, 2, 3]), torch.tensor([1, 0, 2, 0]))
    b = KeyedJaggedTensor.from_offsets_sync(["x", "y"], torch.tensor([1, 2, 3]), torch.tensor([0, 1, 1, 3, 3]))
    assert a.length_per_key_or_none() == [1, 2] == b.length_per_key_or_none()
    assert torch.equal(a.lengths(), b.lengths()) and torch.equal(a.offsets(), b.offsets())


def test_empty_and_empty_like() -> None:
    e = KeyedJaggedTensor.empty(is_weighted=True)
    assert e.keys() == [] and e.stride() == 0 and e.values().numel() == 0 and e.weights().numel() == 0
    like = KeyedJaggedTensor.empty_like(_kjt(weighted=True))
    assert like.keys() == ["a", "b", "c"] and like.stride() == 2 and like.length_per_key() == [0, 0, 0]
    assert JaggedTensor.empty().lengths().numel() == 0


def test_weighted_split_and_to_dict_carry_weights(device: torch.device) -> None:
    kjt = _kjt(weighted=True).to(device)
    first, rest = kjt.split([1, 2])
    assert first.weights().tolist() == [0.0, 1.0]
    assert rest.keys() == ["b", "c"] and rest.weights().tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert kjt.to_dict()["c"].weights().tolist() == [4.0, 5.0, 6.0]


def test_python_lists_are_accepted_in_eager_mode() -> None:
    kjt = KeyedJaggedTensor(keys=["u", "i"], lengths=[2, 3, 1, 2], values=[11, 12, 21, 22, 23, 101, 102, 201])
    assert kjt["u"].to_dense()[1].tolist() == [21, 22, 23]
    jt = JaggedTensor(lengths=[2, 3, 1], values=[101, 102, 201, 202, 203, 301])
    assert jt.offsets().tolist() == [0, 2, 5, 6]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(keys=["a", "b"], values=torch.arange(4), lengths=torch.tensor([1, 1, 1])), "not divisible"),
        (dict(keys=["a"], values=torch.arange(4), lengths=torch.tensor([1, 2])), "sum to 3 but values has 4"),
        (dict(keys=["a"], values=torch.arange(1), lengths=torch.tensor([2, -1])), "non-negative"),
        (dict(keys=["a", "a"], values=torch.arange(2), lengths=torch.tensor([1, 1])), "duplicated: \\['a'\\]"),
        (
            dict(keys=["a"], values=torch.arange(3), lengths=torch.tensor([1, 2]), weights=torch.ones(2)),
            r"weights of features \[.a.\] has 2 entries \(shape \[2\]\) but values has 3",
        ),
        (dict(keys=["a"], values=torch.arange(3), offsets=torch.tensor([0, 2, 1])), "non-negative"),
        (dict(keys=["a"], values=torch.arange(3), lengths=torch.tensor([1, 2]), stride=3), "stride=3"),
    ],
)
def test_validate_rejects_inconsistent_input(kwargs: dict, match: str) -> None:
    kjt = KeyedJaggedTensor(**kwargs)  # construction alone does not check (hot path)
    with pytest.raises(SparseValueError, match=match):
        kjt.validate()
    with pytest.raises(SparseValueError, match=match):
        KeyedJaggedTensor(**kwargs, validate=True)


def test_jagged_tensor_validate() -> None:
    with pytest.raises(SparseValueError, match="offsets must have"):
        JaggedTensor(values=torch.arange(3), lengths=torch.tensor([1, 2]), offsets=torch.tensor([0, 3]), validate=True)
    with pytest.raises(ValueError, match="needs lengths or offsets"):
        JaggedTensor(values=torch.arange(3))
    JaggedTensor(values=torch.arange(3), lengths=torch.tensor([1, 2]), validate=True)


def test_permute_and_getitem_errors_name_the_keys() -> None:
    kjt = _kjt()
    with pytest.raises(IndexError, match="out of range for 3 keys"):
        kjt.permute([0, 3])
    with pytest.raises(KeyError, match="'zz' is not in this KeyedJaggedTensor"):
        kjt["zz"]
    with pytest.raises(ValueError, match="segments sum to 2"):
        kjt.split([1, 1])


def test_from_jt_dict_of_mixed_batch_sizes_is_variable_batch_and_rejects_mixed_weights() -> None:
    a = JaggedTensor(values=torch.tensor([1]), lengths=torch.tensor([1, 0]))
    b = JaggedTensor(values=torch.tensor([1]), lengths=torch.tensor([1]))
    with pytest.raises(SparseValueError, match=r"different batch sizes \{.a.: 2, .b.: 1\}.*variable_batch=True"):
        KeyedJaggedTensor.from_jt_dict({"a": a, "b": b})  # issue 23: it was accepted silently
    mixed = KeyedJaggedTensor.from_jt_dict({"a": a, "b": b}, variable_batch=True)  # torchrec's VBE input
    assert mixed.variable_stride_per_key() and mixed.stride_per_key_per_rank() == [[2], [1]]
    assert mixed["a"].lengths().tolist() == [1, 0] and mixed["b"].lengths().tolist() == [1]
    w = JaggedTensor(values=torch.tensor([1]), lengths=torch.tensor([1, 0]), weights=torch.ones(1))
    with pytest.raises(SparseValueError, match="weight all or none"):
        KeyedJaggedTensor.from_jt_dict({"a": a, "w": w})


def test_concat_rejects_different_strides() -> None:
    a, b = _kjt(), KeyedJaggedTensor(keys=["z"], values=torch.arange(1), lengths=torch.tensor([1]))
    with pytest.raises(ValueError, match="one batch size"):
        KeyedJaggedTensor.concat([a, b])


def test_to_keeps_caches_and_moves_tensors(device: torch.device) -> None:
    kjt = _kjt(weighted=True).sync()
    moved = kjt.to(device, non_blocking=True)
    assert moved.length_per_key_or_none() == [2, 2, 3]
    assert moved.values().device.type == moved.lengths().device.type == moved.weights().device.type == device.type
    assert torch.equal(moved.values().cpu(), kjt.values()) and torch.equal(moved.weights().cpu(), kjt.weights())
    assert kjt.unsync().length_per_key_or_none() is None


def test_keyed_tensor_blocks_and_regroup(device: torch.device) -> None:
    a = KeyedTensor.from_tensor_list(["x", "y"], [torch.ones(2, 3, device=device), torch.zeros(2, 1, device=device)])
    b = KeyedTensor(keys=["z"], length_per_key=[2], values=torch.full((2, 2), 5.0, device=device))
    assert a.values().shape == (2, 4) and a.offset_per_key() == [0, 3, 4]
    assert a["y"].shape == (2, 1) and torch.equal(a.to_dict()["x"].cpu(), torch.ones(2, 3))
    g1, g2 = KeyedTensor.regroup([a, b], [["z", "x"], ["y"]])
    assert g1.device.type == device.type
    assert torch.equal(g1.cpu(), torch.cat([torch.full((2, 2), 5.0), torch.ones(2, 3)], dim=1))
    assert g2.shape == (2, 1)
    d = KeyedTensor.regroup_as_dict([a, b], [["y", "z"]], ["yz"])
    assert d["yz"].shape == (2, 3)
    with pytest.raises(KeyError, match="is in no KeyedTensor"):
        KeyedTensor.regroup([a], [["nope"]])
    with pytest.raises(ValueError, match="one length per key"):
        KeyedTensor(keys=["a"], length_per_key=[1, 2], values=torch.ones(1, 3))


def test_pin_memory_when_available() -> None:
    if not torch.cuda.is_available():
        pytest.skip("pinned memory needs a CUDA runtime")
    kjt = _kjt(weighted=True).pin_memory()
    assert kjt.values().is_pinned() and kjt.weights().is_pinned()
