"""Edge cases of the sparse types against a plain-Python model (``{key: [[ids of sample 0], ...]}``).

The fixes they pin (wrong before):

* ``permute`` (so ``concat``/``permute_to_keys``) of a fixed-batch KJT with bfloat16 weights raised
  fbgemm's ``NotImplementedError`` on the host (its CPU kernel has no bfloat16 instance);
* ``KeyedJaggedTensor.dist_init`` did not compile under ``torch.jit.script``;
* ``kjt_is_equal`` / ``jt_is_equal`` raised ``RuntimeError: Long did not match Int`` for int32
  against int64 lengths or ids (torch.equal compares them by value);
* ``validate()`` let a tensor on another device than ``values`` through (or failed reading it).

No `from __future__ import annotations`: TorchScript must see real classes in the scripted helper.
"""

import pytest
import torch

from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, SparseValueError
from lightrec.sparse.jagged_tensor import jt_is_equal, kjt_is_equal

Model = dict[str, list[list[tuple[int, float]]]]  # per key, one list of (id, weight) per sample

_MODEL: Model = {
    "a": [[(1, 0.5), (2, 1.5)], [], [(3, 2.0)]],
    "b": [[], [], []],  # all bags empty
    "c": [[(7, 0.25)], [(8, 4.0), (9, 3.0), (10, 1.0)], []],
}


def _build(model: Model, weights_dtype: torch.dtype, lengths_dtype: torch.dtype) -> KeyedJaggedTensor:
    batch = len(next(iter(model.values()))) if model else 0
    return KeyedJaggedTensor(
        keys=list(model),
        values=torch.tensor([i for rows in model.values() for row in rows for i, _ in row], dtype=torch.int64),
        weights=torch.tensor([w for rows in model.values() for row in rows for _, w in row], dtype=weights_dtype),
        lengths=torch.tensor([len(row) for rows in model.values() for row in rows], dtype=lengths_dtype),
        stride=batch,
    )


def _read(kjt: KeyedJaggedTensor) -> list[tuple[str, list[list[tuple[int, float]]]]]:
    lengths, ids, weights = kjt.lengths().tolist(), kjt.values().tolist(), kjt.weights().float().tolist()
    out = []
    pos = row = 0
    for key, batch in zip(kjt.keys(), kjt.stride_per_key()):
        rows = []
        for _ in range(batch):
            rows.append([(ids[i], weights[i]) for i in range(pos, pos + lengths[row])])
            pos += lengths[row]
            row += 1
        out.append((key, rows))
    assert pos == len(ids) and row == len(lengths)
    return out


# ------------------------------------------------------------------------------ weights dtypes
@pytest.mark.parametrize("weights_dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lengths_dtype", [torch.int32, torch.int64])
def test_weights_of_any_float_dtype_go_through_every_transform(
    weights_dtype: torch.dtype, lengths_dtype: torch.dtype
) -> None:
    """The weights (exact in every dtype used here) keep their dtype; keys repeat or are left out."""
    kjt = _build(_MODEL, weights_dtype, lengths_dtype)
    keys = list(_MODEL)
    for order in ([2, 0, 2], [1], [], [0, 1, 2]):
        permuted = kjt.permute(order)
        assert _read(permuted) == [(keys[i], _MODEL[keys[i]]) for i in order]
        assert permuted.weights().dtype == weights_dtype and permuted.lengths().dtype == lengths_dtype
        assert permuted.stride() == 3
    assert _read(kjt.permute_to_keys(["c", "b", "a"])) == [(k, _MODEL[k]) for k in ["c", "b", "a"]]
    parts = kjt.split([0, 1, 2, 0])
    assert [_read(p) for p in parts] == [[], [("a", _MODEL["a"])], [(k, _MODEL[k]) for k in "bc"], []]
    back = KeyedJaggedTensor.concat([parts[2], parts[1]])
    assert _read(back) == [(k, _MODEL[k]) for k in "bca"] and back.weights().dtype == weights_dtype
    for key, jt in kjt.to_dict().items():
        assert [list(zip(v.tolist(), w.float().tolist())) for v, w in zip(jt.to_dense(), jt.to_dense_weights() or [])] == [
            [(i, w) for i, w in row] for row in _MODEL[key]
        ]


def test_zero_keys_and_zero_batch_through_the_transforms() -> None:
    none = _build({}, torch.float32, torch.int64)
    assert none.stride() == 0 and none.length_per_key() == [] and none.offset_per_key() == [0]
    assert none.to_dict() == {} and none.permute([]).keys() == [] and [p.keys() for p in none.split([0])] == [[]]
    empty_batch = _build({"a": [], "b": []}, torch.float32, torch.int64)
    assert empty_batch.stride() == 0 and empty_batch.length_per_key() == [0, 0]
    assert _read(empty_batch.permute([1, 1])) == [("b", []), ("b", [])]
    assert {k: jt.lengths().numel() for k, jt in empty_batch.to_dict().items()} == {"a": 0, "b": 0}
    with pytest.raises(ValueError, match="one batch size"):
        KeyedJaggedTensor.concat([empty_batch, _build(_MODEL, torch.float32, torch.int64)])


# ------------------------------------------------------------------------------ dist_init under TorchScript
def _dist_round_trip(values: torch.Tensor, lengths: torch.Tensor, strides: torch.Tensor) -> list[torch.Tensor]:
    fixed = KeyedJaggedTensor.dist_init(
        ["a", "b"], [lengths[:4], values[:4]], False, 2, torch.tensor([0, 2, 1, 3]), [1, 1], 1
    )
    variable = KeyedJaggedTensor.dist_init(["a", "b"], [lengths, values, strides], True, 2, None, None, 2)
    sizes: list[int] = [fixed.stride()] + fixed.length_per_key() + variable.stride_per_key()
    for per_rank in variable.stride_per_key_per_rank():
        sizes.extend(per_rank)
    return [fixed.lengths(), fixed.values(), variable.lengths(), variable.values(), torch.tensor(sizes)]


def test_dist_init_scripts_and_matches_eager() -> None:
    # rank 0 sends lengths [a0, b0], rank 1 [a1, b1]; recat puts them key-major: a0 a1 b0 b1
    values, lengths = torch.tensor([10, 11, 12, 13, 14, 15]), torch.tensor([1, 0, 2, 1, 1, 1])
    strides = torch.tensor([1, 1, 2, 2])  # rank-major [R * F]: rank 0 (a: 1, b: 1), rank 1 (a: 2, b: 2)
    eager = _dist_round_trip(values, lengths, strides)
    assert eager[0].tolist() == [1, 2, 0, 1] and eager[1].tolist() == [10, 11, 12, 13]
    # stride 2, length_per_key [3, 1]; the variable one (stagger 2 over 2 ranks keeps their order)
    assert eager[4].tolist() == [2, 3, 1, 3, 3, 1, 2, 1, 2]
    scripted = torch.jit.script(_dist_round_trip)(values, lengths, strides)
    for got, expected in zip(scripted, eager):
        torch.testing.assert_close(got, expected)


# ------------------------------------------------------------------------------ equality
def test_equality_compares_int32_and_int64_parts_by_value() -> None:
    a = _build(_MODEL, torch.float32, torch.int64)
    b = _build(_MODEL, torch.float32, torch.int32)
    assert kjt_is_equal(a, b) and kjt_is_equal(b, a)
    c = KeyedJaggedTensor(keys=a.keys(), values=a.values().int(), weights=a.weights().double(), lengths=a.lengths())
    assert kjt_is_equal(a, c)
    other = _build({**_MODEL, "c": [[(7, 0.25)], [(8, 4.0), (9, 3.0), (11, 1.0)], []]}, torch.float32, torch.int32)
    assert not kjt_is_equal(a, other)
    jt = JaggedTensor(values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
    assert jt_is_equal(jt, JaggedTensor(values=torch.tensor([1, 2, 3], dtype=torch.int32), offsets=torch.tensor([0, 2, 3], dtype=torch.int32)))
    assert not jt_is_equal(jt, JaggedTensor(values=torch.tensor([1, 2, 3], dtype=torch.int32), lengths=torch.tensor([1, 2], dtype=torch.int32)))


# ------------------------------------------------------------------------------ devices
def _on(device: str, tensor: torch.Tensor | None) -> torch.Tensor | None:
    return tensor.to(device) if tensor is not None else None


@pytest.mark.parametrize("part", ["lengths", "weights", "offsets", "inverse_indices"])
def test_validate_names_a_tensor_on_another_device_than_values(part: str) -> None:
    kwargs = {
        "keys": ["a", "b"], "values": torch.tensor([1, 2, 3]), "weights": torch.ones(3),
        "lengths": torch.tensor([1, 0, 2]), "offsets": torch.tensor([0, 1, 1, 3]),
        "stride_per_key_per_rank": [[1], [2]], "inverse_indices": (["a", "b"], torch.tensor([[0, 0], [0, 1]])),
    }  # fmt: skip
    KeyedJaggedTensor(**kwargs, validate=True)  # consistent on one device
    if part == "inverse_indices":
        kwargs[part] = (["a", "b"], torch.empty(2, 2, dtype=torch.long, device="meta"))
    else:
        kwargs[part] = _on("meta", kwargs[part])
    with pytest.raises(SparseValueError, match=f"{part} is on meta but values is on cpu"):
        KeyedJaggedTensor(**kwargs, validate=True)


def test_jagged_tensor_validate_names_a_tensor_on_another_device() -> None:
    values = torch.empty(3, dtype=torch.long, device="meta")
    with pytest.raises(SparseValueError, match="lengths is on cpu but values is on meta"):
        JaggedTensor(values=values, lengths=torch.tensor([1, 2]), validate=True)
