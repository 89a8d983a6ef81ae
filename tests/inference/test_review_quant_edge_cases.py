"""Quantized collections on edge cases, against a plain fp32 reference and the unsharded module.

The reference dequantizes the stored rows (``dequantized_weight``) and pools them with
``F.embedding_bag`` / ``F.embedding``, torchrec's documented semantics: SUM or MEAN per table,
per-id weights, an empty bag pools to zeros (MEAN too, never NaN), features in the collection's
order whatever the KJT's key order. Covered besides: odd and non-multiple-of-4/8 dims, tables
sharing a feature list, an empty batch, the per-element error bound of the int8/int4 rows (half a
step of the row's stored scale), fp16 rows the fbgemm kernels cannot read, the sharded quantized
EBC against the unsharded one (bounds_check modes, weight checks), typed errors on bad input, and
state-dict round trips.
"""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

import lightrec
from lightrec.inference import QuantEmbeddingBagCollection, QuantEmbeddingCollection, shard_for_inference
from lightrec.modules import EmbeddingIdError, FeatureKeyError
from lightrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from lightrec.modules.feature_checks import strict_checks
from lightrec.quant.row_codec import dequantize_rows, max_abs_error, quantize_rows
from lightrec.sparse import KeyedJaggedTensor, SparseValueError
from tests.inference.helpers import kernel_params

KERNELS = kernel_params()
# (table a's dim, table b's dim): odd, not a multiple of 4, not a multiple of 8 (int4 needs even dims)
DIMS = {"int8": (3, 5), "int4": (6, 10), "fp16": (3, 7)}


def _tables(kind: str) -> list[EmbeddingBagConfig]:
    da, db = DIMS[kind]
    return [
        EmbeddingBagConfig(name="a", num_embeddings=11, embedding_dim=da, feature_names=["x", "y"]),  # shared
        EmbeddingBagConfig(name="b", num_embeddings=7, embedding_dim=db, feature_names=["z"], pooling=PoolingType.MEAN),
        EmbeddingBagConfig(name="c", num_embeddings=5, embedding_dim=da, feature_names=["w"]),
    ]


def _batch(weighted: bool, keys: tuple[str, ...] = ("z", "w", "x", "y")) -> KeyedJaggedTensor:
    """Batch of 3 with empty bags in every feature (z's first bag is empty: MEAN of nothing)."""
    rows = {"x": 11, "y": 11, "z": 7, "w": 5}
    lengths = {"x": [2, 0, 3], "y": [0, 1, 1], "z": [0, 4, 1], "w": [1, 0, 0]}
    g = torch.Generator().manual_seed(1)
    values = torch.cat([torch.randint(0, rows[k], (sum(lengths[k]),), generator=g) for k in keys])
    flat_lengths = torch.tensor([n for k in keys for n in lengths[k]])
    weights = torch.rand(values.numel(), generator=g) + 0.5 if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=list(keys), values=values, lengths=flat_lengths, weights=weights)


def _empty_batch(keys: list[str], weighted: bool) -> KeyedJaggedTensor:
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.empty(0, dtype=torch.long), lengths=torch.empty(0, dtype=torch.long),
        weights=torch.empty(0) if weighted else None,
    )


def _reference(q: QuantEmbeddingBagCollection, kjt: KeyedJaggedTensor) -> torch.Tensor:
    """``[B, sum D]``: every feature pooled from the dequantized rows by ``F.embedding_bag``."""
    features = kjt.to_dict()
    out = []
    for t in q.embedding_bag_configs():
        rows = q.dequantized_weight(t.name)
        for f in t.feature_names:
            jt = features[f]
            offsets = jt.offsets().long()
            weights = jt.weights().float() if q.is_weighted() else None
            pooled = F.embedding_bag(jt.values().long(), rows, offsets, mode="sum", per_sample_weights=weights,
                                     include_last_offset=True)
            if t.pooling == PoolingType.MEAN:  # fbgemm/torchrec: weighted sum / count; empty bag -> 0
                pooled = pooled / (offsets[1:] - offsets[:-1]).clamp(min=1).unsqueeze(1)
            out.append(pooled)
    return torch.cat(out, dim=1)


def _quantized(kind: str, weighted: bool, kernel: str, bounds_check: str = "error") -> QuantEmbeddingBagCollection:
    torch.manual_seed(0)
    ebc = lightrec.EmbeddingBagCollection(_tables(kind), is_weighted=weighted, bounds_check=bounds_check)
    return QuantEmbeddingBagCollection.from_float(ebc, kind, kernel_backend=kernel)  # keeps bounds_check


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kind", ["int8", "int4", "fp16"])
@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_lookup_equals_fp32_embedding_bag_of_the_dequantized_rows(kernel: str, kind: str, weighted: bool) -> None:
    q = _quantized(kind, weighted, kernel)
    batch = _batch(weighted)  # keys in another order than the collection's
    got = q(batch)
    assert got.keys() == ["x", "y", "z", "w"]
    assert got.values().dtype == torch.float32 and not torch.isnan(got.values()).any()
    torch.testing.assert_close(got.values(), _reference(q, batch), rtol=1e-6, atol=1e-6)
    da, db = DIMS[kind]
    mean_block = got.values()[:, 2 * da : 2 * da + db]
    assert torch.equal(mean_block[0], torch.zeros(db))  # MEAN of an empty bag is 0, not NaN
    empty = q(_empty_batch(["x", "y", "z", "w"], weighted)).values()
    assert empty.shape == (0, 3 * da + db) and empty.dtype == torch.float32


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kind", ["int8", "int4", "fp16"])
def test_sequence_lookup_equals_fp32_embedding_of_the_dequantized_rows(kernel: str, kind: str) -> None:
    da, db = DIMS[kind]
    tables = [
        EmbeddingConfig(name="a", num_embeddings=11, embedding_dim=da, feature_names=["x", "y"]),
        EmbeddingConfig(name="b", num_embeddings=7, embedding_dim=db, feature_names=["z"]),
    ]
    torch.manual_seed(0)
    q = QuantEmbeddingCollection.from_float(lightrec.EmbeddingCollection(tables), kind, kernel_backend=kernel)
    batch = _batch(False, keys=("z", "x", "y"))
    got = q(batch)
    for feature, table in [("x", "a"), ("y", "a"), ("z", "b")]:
        want = F.embedding(batch[feature].values(), q.dequantized_weight(table))
        assert torch.equal(got[feature].values(), want)
        assert torch.equal(got[feature].lengths(), batch[feature].lengths())
    empty = q(_empty_batch(["x", "y", "z"], False))
    assert {k: tuple(v.values().shape) for k, v in empty.items()} == {"x": (0, da), "y": (0, da), "z": (0, db)}


def _rows(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    base = torch.rand(64, 16, generator=g)
    return {
        "centred": (base - 0.5) * 0.2,
        "offset": 0.9 + 0.1 * base,  # far from 0 relative to its range
        "negative": -5.0 + base,
        "large": 1000.0 + base,  # fp16 steps of 0.5 at the row's bottom
        "tiny": (base - 0.5) * 2e-3,  # subnormal fp16 scales
        "constant": torch.full((64, 16), 0.3),
    }[kind]


@pytest.mark.parametrize("data_type", [DataType.INT8, DataType.INT4])
@pytest.mark.parametrize("rows", ["centred", "offset", "negative", "large", "tiny", "constant"])
def test_every_value_decodes_within_half_a_step_of_its_row(data_type: DataType, rows: str) -> None:
    x = _rows(rows)
    stored = quantize_rows(x, data_type)
    error = (dequantize_rows(stored, data_type, 16) - x).abs()
    scale = stored[:, :2].contiguous().view(torch.float16).float()  # the row's stored step
    bound = scale / 2 * (1 + 2.0**-20) + 2.0**-23 * x.abs() + 2.0**-40  # + fp32 rounding of the decode
    assert bool((error <= bound).all()), f"worst error / scale: {float((error / scale).max()):.3f}"
    assert bool((error.max(1).values <= max_abs_error(x, data_type)).all())  # the documented row bound holds too


def test_fp16_rows_of_an_odd_size_are_refused_naming_table_and_row_alignment() -> None:
    # row_alignment=5 pads a dim-2 fp16 row (4 bytes) to 5: fbgemm's kernels read such rows from the wrong place
    tables = [EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2, feature_names=["f"])]
    with pytest.raises(ValueError, match=r"row_alignment=5 .*'t'.*5 bytes"):
        QuantEmbeddingBagCollection(tables, dtype="fp16", row_alignment=5)
    seq = [EmbeddingConfig(name="t", num_embeddings=4, embedding_dim=2, feature_names=["f"])]
    with pytest.raises(ValueError, match="row_alignment=5"):
        QuantEmbeddingCollection(seq, dtype="fp16", row_alignment=5)
    with pytest.raises(ValueError, match="row_alignment must be a positive int"):
        QuantEmbeddingBagCollection(tables, row_alignment=True)  # type: ignore[arg-type]
    # odd alignments stay available where every row is a whole number of halves or int8/int4
    assert QuantEmbeddingBagCollection(tables, dtype="fp16", row_alignment=1).embedding_bags["t"].weight.shape == (4, 4)
    QuantEmbeddingBagCollection(tables, dtype="int8", row_alignment=5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_odd_row_alignment_looks_up_the_same_rows_on_every_kernel(kernel: str) -> None:
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(name="a", num_embeddings=5, embedding_dim=3, feature_names=["x"]),
        EmbeddingBagConfig(name="b", num_embeddings=4, embedding_dim=2, feature_names=["z"]),  # 4-byte fp16 rows
        EmbeddingBagConfig(name="c", num_embeddings=3, embedding_dim=4, feature_names=["w"]),
    ]
    ebc = lightrec.EmbeddingBagCollection(tables)
    q = QuantEmbeddingBagCollection.from_float(ebc, "int8", per_table={"b": "fp16", "c": "int4"}, row_alignment=1,
                                               kernel_backend=kernel)
    batch = KeyedJaggedTensor.from_lengths_sync(keys=["x", "z", "w"], values=torch.tensor([0, 4, 1, 3, 0, 2]),
                                                lengths=torch.tensor([2, 0, 1, 1, 1, 1]))
    torch.testing.assert_close(q(batch).values(), _reference(q, batch), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kind", ["int8", "int4", "fp16"])
@pytest.mark.parametrize("weighted", [False, True])
def test_sharded_equals_unsharded_on_edge_batches(kernel: str, kind: str, weighted: bool) -> None:
    q = _quantized(kind, weighted, "torch")
    sharded = shard_for_inference(q, devices=["cpu", "cpu"], kernel_backend=kernel)
    for batch in [_batch(weighted), _empty_batch(["w", "z", "y", "x"], weighted)]:
        got, want = sharded(batch), q(batch)
        assert got.keys() == want.keys() and torch.equal(got.values(), want.values())


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("mode", ["clamp", "skip"])
def test_sharded_groups_apply_clamp_and_skip_like_the_unsharded_collection(kernel: str, mode: str) -> None:
    q = _quantized("int8", False, "torch", bounds_check=mode)
    sharded = shard_for_inference(q, devices=["cpu", "cpu"], kernel_backend=kernel)
    batch = KeyedJaggedTensor.from_lengths_sync(
        keys=["x", "y", "z", "w"], values=torch.tensor([3, 11, -1, 2, 7, 1, 40]), lengths=torch.tensor([2, 1, 2, 2]),
    )
    assert torch.equal(sharded(batch).values(), q(batch).values())


@pytest.mark.parametrize("kernel", KERNELS)
def test_sharded_weighted_collection_checks_its_weights_like_the_unsharded_one(kernel: str) -> None:
    q = _quantized("int8", True, "torch")
    sharded = shard_for_inference(q, devices=["cpu", "cpu"], kernel_backend=kernel)
    keys, values, lengths = ["x", "y", "z", "w"], torch.tensor([1, 2, 3, 4]), torch.tensor([1, 1, 1, 1])
    unweighted = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
    with pytest.raises(ValueError, match=r"is_weighted=True\) needs per-id weights"):
        sharded(unweighted)
    nan = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths,
                                              weights=torch.tensor([1.0, float("nan"), 1.0, 1.0]))
    for module in (q, sharded):
        with pytest.raises(SparseValueError, match="non-finite weight nan"):
            module(nan)


@pytest.mark.parametrize("kernel", KERNELS)
def test_bad_input_raises_typed_errors_naming_the_argument(kernel: str) -> None:
    q = _quantized("int8", False, kernel)
    sharded = shard_for_inference(q, devices=["cpu", "cpu"], kernel_backend=kernel)
    torch.manual_seed(0)
    seq = QuantEmbeddingCollection.from_float(
        lightrec.EmbeddingCollection([EmbeddingConfig(name="a", num_embeddings=11, embedding_dim=4,
                                                      feature_names=["x", "y", "z", "w"])]),
        "int8", kernel_backend=kernel,
    )
    keys = ["x", "y", "z", "w"]

    def kjt(values: torch.Tensor, keys: list[str] = keys) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=torch.ones(len(keys), dtype=torch.long))

    for module in (q, sharded, seq):
        with pytest.raises(FeatureKeyError, match=r"missing features \['w'\]"):
            module(kjt(torch.tensor([1, 2, 3]), ["x", "y", "z"]))
        with strict_checks(), pytest.raises(FeatureKeyError, match=r"unknown features \['v'\]"):
            module(kjt(torch.tensor([1, 2, 3, 4, 0]), [*keys, "v"]))
        with pytest.raises(SparseValueError, match="must be int64 or int32, got torch.float32"):
            module(kjt(torch.tensor([1.0, 2.0, 3.0, 4.0])))
        with pytest.raises(EmbeddingIdError, match=r"feature 'w' \(sample 0\) has id 11 .*table '(c|a)' has (5|11) rows"):
            module(kjt(torch.tensor([1, 2, 3, 11])))
        with pytest.raises(EmbeddingIdError, match=r"feature 'x' \(sample 0\) has id -1"):
            module(kjt(torch.tensor([-1, 2, 3, 4])))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("assign", [False, True])
def test_state_dict_round_trips_through_torch_save_into_a_fresh_collection(kernel: str, assign: bool) -> None:
    q = QuantEmbeddingBagCollection.from_float(
        lightrec.EmbeddingBagCollection(_tables("int4")), "int8", per_table={"a": "int4", "b": "fp16"},
        kernel_backend=kernel,
    )
    state = q.state_dict()
    assert sorted(state) == ["embedding_bags.a.weight", "embedding_bags.b.weight", "embedding_bags.c.weight"]
    assert all(v.dtype == torch.uint8 for v in state.values())
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    fresh = QuantEmbeddingBagCollection(_tables("int4"), dtype="int8", per_table={"a": "int4", "b": "fp16"},
                                        kernel_backend=kernel)
    fresh.load_state_dict(torch.load(buffer), assign=assign)
    batch = _batch(False)
    assert torch.equal(fresh(batch).values(), q(batch).values())
    for t in ("a", "b", "c"):
        assert torch.equal(fresh.dequantized_weight(t), q.dequantized_weight(t))


def test_torchrec_form_of_the_quantized_managed_sequence_collection_refuses_another_output_dtype() -> None:
    """torchrec's ``(tables, device, output_dtype=...)`` form: float32 builds, fp16 output is refused (it
    was dropped, returning float32 where fp16 was asked), as ``quantize_embeddings`` refuses it."""
    from lightrec import EmbeddingConfig
    from lightrec.modules.managed_collision import (
        LRU_EvictionPolicy,
        ManagedCollisionCollection,
        MCHManagedCollisionModule,
    )
    from lightrec.quant.managed_collision import QuantManagedCollisionEmbeddingCollection

    tables = [EmbeddingConfig(name="t", num_embeddings=8, embedding_dim=4, feature_names=["f"])]

    def mcc() -> ManagedCollisionCollection:
        module = MCHManagedCollisionModule(8, "cpu", LRU_EvictionPolicy(), 2, input_hash_size=2**40)
        return ManagedCollisionCollection({"t": module}, tables)

    built = QuantManagedCollisionEmbeddingCollection(tables, managed_collision_collection=mcc(), output_dtype=torch.float)
    assert [c.name for c in built.embedding_configs()] == ["t"]
    with pytest.raises(ValueError, match=r"output_dtype=torch.float16.*float32"):
        QuantManagedCollisionEmbeddingCollection(tables, managed_collision_collection=mcc(), output_dtype=torch.float16)


@pytest.mark.parametrize("inplace", [False, True])
def test_an_assignment_naming_an_unknown_table_is_refused_and_changes_nothing(inplace: bool) -> None:
    """``assignment={"t_typo": 1}`` was ignored: the table silently went where the greedy placement put it."""
    q = _quantized("int8", False, "torch")
    model = torch.nn.Sequential(q)
    names = [t.name for t in q.embedding_bag_configs()]
    with pytest.raises(ValueError, match=r"assignment names \['nosuch'\].*quantized tables are") as info:
        shard_for_inference(model, devices=["cpu", "cpu"], assignment={names[0]: 1, "nosuch": 0}, inplace=inplace)
    assert str(sorted(names)) in str(info.value)
    assert model[0] is q  # nothing was converted
    placed = shard_for_inference(model, devices=["cpu", "cpu"], assignment={names[0]: 1}, kernel_backend="torch")
    batch = _batch(False)
    torch.testing.assert_close(placed(batch).values(), q(batch).values(), rtol=0, atol=0)
