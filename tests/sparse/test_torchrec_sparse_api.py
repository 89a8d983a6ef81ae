"""torchrec's sparse API surface: equality helpers, conversion modules, variable-batch KJTs, the
all-to-all helpers, meta-device KJTs, pytree/export and fx tracing of ``concat``/``regroup``.

No `from __future__ import annotations`: fx copies forward() annotations into generated code.
"""

import pytest
import torch

from lightrec.sparse.jagged_tensor import (
    ComputeJTDictToKJT,
    ComputeKJTToJTDict,
    JaggedTensor,
    KeyedJaggedTensor,
    KeyedTensor,
    SparseValueError,
    jt_is_equal,
    kjt_is_equal,
)


def _vbe_kjt() -> KeyedJaggedTensor:
    """Key ``u`` has 2 samples (users), key ``i`` 3 (impressions); 3 rows in the full batch."""
    return KeyedJaggedTensor(
        keys=["u", "i"],
        values=torch.tensor([7, 8, 9, 4, 5, 6]),
        lengths=torch.tensor([2, 1, 1, 0, 2]),
        stride_per_key_per_rank=[[2], [3]],
        inverse_indices=(["u", "i"], torch.tensor([[0, 1, 1], [0, 1, 2]])),
    )


def test_empty_jagged_tensor_has_empty_offsets_like_torchrec() -> None:
    jt = JaggedTensor.empty()
    assert jt.offsets().numel() == 0 and jt.lengths().numel() == 0 and jt.values().numel() == 0
    jt.validate()


def test_jt_and_kjt_equality() -> None:
    a = JaggedTensor(values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
    b = JaggedTensor(values=torch.tensor([1, 2, 3]), offsets=torch.tensor([0, 2, 3]))
    c = JaggedTensor(values=torch.tensor([1, 2, 4]), lengths=torch.tensor([2, 1]))
    assert jt_is_equal(a, b) and not jt_is_equal(a, c)
    assert not jt_is_equal(a, "not a jagged tensor")  # type: ignore[arg-type]
    k1 = KeyedJaggedTensor(keys=["x", "y"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 0, 1]))
    k2 = KeyedJaggedTensor(keys=["x", "y"], values=torch.tensor([1, 2, 3]), offsets=torch.tensor([0, 1, 2, 2, 3]))
    k3 = KeyedJaggedTensor(keys=["y", "x"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 0, 1]))
    assert kjt_is_equal(k1, k2) and not kjt_is_equal(k1, k3)


def test_conversion_modules_round_trip() -> None:
    kjt = KeyedJaggedTensor(keys=["x", "y"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 0, 1]))
    jt_dict = ComputeKJTToJTDict()(kjt)
    assert list(jt_dict) == ["x", "y"] and jt_dict["y"].values().tolist() == [3]
    assert kjt_is_equal(ComputeJTDictToKJT()(jt_dict), kjt)


def test_variable_batch_kjt_layout_and_transforms() -> None:
    kjt = _vbe_kjt()
    kjt.validate()
    assert kjt.variable_stride_per_key() and kjt.stride() == 3
    assert kjt.stride_per_key() == [2, 3] and kjt.length_per_key() == [3, 3]
    assert kjt.lengths_offset_per_key() == [0, 2, 5]
    assert kjt["i"].lengths().tolist() == [1, 0, 2] and kjt["u"].values().tolist() == [7, 8, 9]
    permuted = kjt.permute([1, 0])
    assert permuted.keys() == ["i", "u"] and permuted.stride_per_key() == [3, 2]
    assert permuted.lengths().tolist() == [1, 0, 2, 2, 1] and permuted.values().tolist() == [4, 5, 6, 7, 8, 9]
    first, second = kjt.split([1, 1])
    assert second.values().tolist() == [4, 5, 6] and second.stride_per_key_per_rank() == [[3]]
    assert kjt_is_equal(KeyedJaggedTensor.concat([first, second]), kjt)
    fixed = KeyedJaggedTensor(keys=["x"], values=torch.tensor([1]), lengths=torch.tensor([1, 0]))
    assert fixed.stride_per_key_per_rank() == [] and not fixed.variable_stride_per_key()


def test_variable_batch_kjt_accepts_torchrec_tensor_strides_and_checks_them() -> None:
    kjt = KeyedJaggedTensor(
        keys=["u", "i"], values=torch.tensor([7, 8, 9, 4, 5, 6]), lengths=torch.tensor([2, 1, 1, 0, 2]),
        stride_per_key_per_rank=torch.tensor([[2], [3]]),
    )  # fmt: skip
    assert kjt.stride_per_key_per_rank() == [[2], [3]]
    with pytest.raises(SparseValueError, match="counts 6 samples"):
        KeyedJaggedTensor(
            keys=["u", "i"], values=torch.tensor([7, 8, 9, 4, 5, 6]), lengths=torch.tensor([2, 1, 1, 0, 2]),
            stride_per_key_per_rank=[[3], [3]], validate=True,
        )  # fmt: skip


def test_dist_helpers_describe_and_rebuild_a_two_rank_all_to_all() -> None:
    """Two source ranks send all their keys to this rank; dist_init rebuilds the key-major KJT."""
    r0 = KeyedJaggedTensor(keys=["a", "b"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1, 0]))
    r1 = KeyedJaggedTensor(keys=["a", "b"], values=torch.tensor([4, 5]), lengths=torch.tensor([1, 1]), stride=1)
    assert r0.dist_labels() == ["lengths", "values"]
    assert r0.dist_splits([2]) == [[4], [3]]
    assert r0.dist_splits([1, 1]) == [[2, 2], [2, 1]]
    sent = [torch.cat([t0, t1]) for t0, t1 in zip(r0.dist_tensors(), r1.dist_tensors(), strict=True)]
    recat = torch.tensor([0, 2, 1, 3])  # (rank 0, a), (rank 1, a), (rank 0, b), (rank 1, b)
    got = KeyedJaggedTensor.dist_init(["a", "b"], sent, False, 2, recat, [2, 1])
    assert got.stride() == 3
    assert got["a"].values().tolist() == [1, 2, 4] and got["b"].values().tolist() == [3, 5]
    assert got.lengths().tolist() == [1, 1, 1, 1, 0, 1]


def test_kjt_on_meta_device_needs_no_host_read() -> None:
    values = torch.empty(10, dtype=torch.long, device="meta")
    lengths = torch.empty(4, dtype=torch.int32, device="meta")
    kjt = KeyedJaggedTensor.from_lengths_sync(["a", "b"], values, lengths)
    assert kjt.device().type == "meta" and kjt.length_per_key() == [5, 5] and kjt.offset_per_key() == [0, 5, 10]
    assert kjt["b"].values().shape == (5,)


def test_keyed_tensor_pytree_and_torch_export() -> None:
    kt = KeyedTensor.from_tensor_list(["a", "b"], [torch.randn(2, 3), torch.randn(2, 2)])
    leaves, spec = torch.utils._pytree.tree_flatten(kt)
    assert len(leaves) == 1 and torch.equal(torch.utils._pytree.tree_unflatten(leaves, spec).values(), kt.values())

    class Double(torch.nn.Module):
        def forward(self, kt: KeyedTensor) -> torch.Tensor:
            return kt["b"] * 2

    program = torch.export.export(Double(), (kt,))
    torch.testing.assert_close(program.module()(kt), kt["b"] * 2)


def test_variable_batch_kjt_pytree_round_trip() -> None:
    kjt = _vbe_kjt()
    leaves, spec = torch.utils._pytree.tree_flatten(kjt)
    back = torch.utils._pytree.tree_unflatten(leaves, spec)
    assert kjt_is_equal(back, kjt) and back.stride_per_key_per_rank() == [[2], [3]]
    assert torch.equal(back.inverse_indices()[1], kjt.inverse_indices()[1])


class _Concat(torch.nn.Module):
    def forward(self, a: KeyedJaggedTensor, b: KeyedJaggedTensor) -> torch.Tensor:
        return KeyedJaggedTensor.concat([a, b]).lengths()


class _Regroup(torch.nn.Module):
    def forward(self, kt: KeyedTensor) -> torch.Tensor:
        return KeyedTensor.regroup([kt], [["b", "a"]])[0]


def test_concat_and_regroup_trace_with_fx_and_script() -> None:
    a = KeyedJaggedTensor(keys=["x"], values=torch.tensor([1, 2]), lengths=torch.tensor([2, 0]))
    b = KeyedJaggedTensor(keys=["y"], values=torch.tensor([3]), lengths=torch.tensor([0, 1]))
    concat = torch.fx.symbolic_trace(_Concat())
    assert concat(a, b).tolist() == [2, 0, 0, 1]
    assert torch.jit.script(concat)(a, b).tolist() == [2, 0, 0, 1]
    kt = KeyedTensor.from_tensor_list(["a", "b"], [torch.randn(2, 3), torch.randn(2, 2)])
    regroup = torch.fx.symbolic_trace(_Regroup())
    expected = torch.cat([kt["b"], kt["a"]], dim=1)
    torch.testing.assert_close(regroup(kt), expected)
    torch.testing.assert_close(torch.jit.script(regroup)(kt), expected)
