"""Quantized collections: stored layout, exact numerics, error bounds, the quantize() entry points."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lightrec
from lightrec.inference import QuantEmbeddingBagCollection, quantize, row_size_in_bytes
from lightrec.modules import DataType
from lightrec.quant.row_codec import max_abs_error
from tests.inference import reference
from tests.inference.helpers import FEATURES, dlrm, kernel_params, kjt, needs_fbgemm, tables

KINDS = {"int8": DataType.INT8, "int4": DataType.INT4, "fp16": DataType.FP16}


@pytest.mark.parametrize("kind,dim,expected", [("int8", 64, 80), ("int4", 64, 48), ("fp16", 64, 128), ("int8", 8, 16)])
def test_row_sizes_follow_fbgemm_layout(kind: str, dim: int, expected: int) -> None:
    assert row_size_in_bytes(dim, KINDS[kind]) == expected
    assert row_size_in_bytes(dim, KINDS[kind], row_alignment=1) == {"int8": dim + 4, "int4": dim // 2 + 4, "fp16": 2 * dim}[kind]


@pytest.mark.parametrize("kind", list(KINDS))
def test_rows_decode_within_documented_bound(kind: str) -> None:
    torch.manual_seed(0)
    weight = torch.randn(200, 16) * torch.rand(200, 1) * 3
    weight[0] = 0.25  # a constant row
    from lightrec.inference import dequantize_rows, quantize_rows

    decoded = dequantize_rows(quantize_rows(weight, KINDS[kind]), KINDS[kind], 16)
    err = (decoded - weight).abs().max(dim=1).values
    bound = max_abs_error(weight, KINDS[kind])
    assert bool((err <= bound).all()), (err - bound).max()
    # the bound is tight enough to mean something: int8 is ~ range / 510
    if kind == "int8":
        assert float(bound.max()) < 0.01 * float((weight.max(1).values - weight.min(1).values).max())


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("init", [1e-3, 3.2e-4, 1e-5])
def test_rows_of_small_values_decode_within_the_bound(kind: str, init: float) -> None:
    """Tables initialised at +-1e-3 (torchrec's init for 1e6 rows) have fp16 scales in the subnormal range, where
    rounding the scale to fp16 lost a large share of it: rounded down, the top of a row was clamped (int8 rows of
    +-1e-3 up to 1.2x the bound, a row [0, 2.27e-5] 60x)."""
    from lightrec.inference import dequantize_rows, quantize_rows

    torch.manual_seed(0)
    weight = (torch.rand(4096, 64) * 2 - 1) * init
    weight[0, :2], weight[0, 2:] = torch.tensor([0.0, 2.27e-5]), 1e-5
    decoded = dequantize_rows(quantize_rows(weight, KINDS[kind]), KINDS[kind], 64)
    err = (decoded - weight).abs().max(dim=1).values
    bound = max_abs_error(weight, KINDS[kind])
    assert bool((err <= bound).all()), f"{int((err > bound).sum())} rows past the bound, worst {(err / bound).max():.2f}x"


@pytest.mark.parametrize("kernel", kernel_params())
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("kind", [*KINDS, "mixed"])
def test_pooled_equals_reference_dequantization_exactly(kind: str, weighted: bool, kernel: str) -> None:
    torch.manual_seed(1)
    ebc = lightrec.EmbeddingBagCollection(tables(mean_last=kind != "mixed"), is_weighted=weighted)
    # "mixed": int4, fp16 and int8 tables pooled by one fbgemm call (one SUM group)
    per_table = {"t0": "int4", "t1": "fp16"} if kind == "mixed" else None
    q = QuantEmbeddingBagCollection.from_float(ebc, dtype="int8" if kind == "mixed" else kind, per_table=per_table,
                                               kernel_backend=kernel)
    assert len(q._groups) == (1 if kind == "mixed" else 2)
    batch = kjt(batch=6, seed=2, weighted=weighted)
    got = q(batch).to_dict()
    for t in q.embedding_bag_configs():
        kind = t.data_type.value.lower()
        for f in t.feature_names:
            jt = batch[f]
            offsets = [0] + torch.cumsum(jt.lengths(), 0).tolist()
            w = jt.weights().tolist() if weighted else None
            want = reference.pooled(q.embedding_bags[t.name].weight, kind, t.embedding_dim, jt.values().tolist(),
                                    offsets, w, t.pooling == lightrec.PoolingType.MEAN)
            np.testing.assert_array_equal(got[f].numpy(), want, err_msg=f"{kind} feature {f}")


@pytest.mark.parametrize("kernel", kernel_params())
@pytest.mark.parametrize("kind", list(KINDS))
def test_pooled_within_error_bound_of_fp32(kind: str, kernel: str, device: torch.device) -> None:
    torch.manual_seed(3)
    ebc = lightrec.EmbeddingBagCollection(tables(mean_last=False), is_weighted=True)
    q = QuantEmbeddingBagCollection.from_float(ebc, dtype=kind, kernel_backend=kernel).to(device)
    batch = kjt(batch=8, seed=4, weighted=True)
    got = {f: v.cpu() for f, v in q(batch.to(device)).to_dict().items()}  # the float reference on CPU
    want = ebc(batch).to_dict()
    for t in ebc.embedding_bag_configs():
        row_bound = max_abs_error(ebc.embedding_bags[t.name].weight, KINDS[kind])
        for f in t.feature_names:
            jt = batch[f]
            # |sum_i w_i (x_i - x~_i)| <= sum_i |w_i| bound(row_i), plus fp32 summation slack
            per_id = row_bound[jt.values()] * jt.weights().abs()
            bag = torch.repeat_interleave(torch.arange(jt.lengths().numel()), jt.lengths())
            bound = torch.zeros(jt.lengths().numel()).index_add_(0, bag, per_id) + 1e-6
            err = (got[f] - want[f]).abs().max(dim=1).values
            assert bool((err <= bound).all()), f"{kind} {f}: {(err - bound).max()}"


@needs_fbgemm()
def test_fbgemm_kernel_equals_torch_kernel_on_larger_batch() -> None:
    torch.manual_seed(5)
    ebc = lightrec.EmbeddingBagCollection(tables(dim=16), is_weighted=True)
    batch = kjt(batch=64, seed=6, weighted=True, max_len=12)
    for kind in KINDS:
        a = QuantEmbeddingBagCollection.from_float(ebc, dtype=kind, kernel_backend="fbgemm")(batch).values()
        b = QuantEmbeddingBagCollection.from_float(ebc, dtype=kind, kernel_backend="torch")(batch).values()
        assert torch.equal(a, b), kind


def test_torchrec_quantize_dynamic_api_and_buffers() -> None:
    from torch import quantization as quant

    from lightrec.modules.quant_config import QuantConfig
    from lightrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC

    ebc = lightrec.EmbeddingBagCollection(tables(dim=64))
    qconfig = QuantConfig(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
                          weight=quant.PlaceholderObserver.with_args(dtype=torch.quint4x2))
    holder = torch.nn.Sequential(ebc)
    q = quant.quantize_dynamic(holder, qconfig_spec={lightrec.EmbeddingBagCollection: qconfig},
                               mapping={lightrec.EmbeddingBagCollection: QuantEBC}, inplace=False)
    assert isinstance(q[0], QuantEmbeddingBagCollection) and holder[0] is ebc
    saved = {n: (tuple(b.shape), b.dtype) for n, b in q.state_dict().items()}
    assert saved == {f"0.embedding_bags.{t}.weight": ((r, 48), torch.uint8) for t, r in [("t0", 40), ("t1", 31), ("t2", 17)]}
    assert not list(q.parameters())
    assert q[0].embedding_bag_configs()[0].data_type == DataType.INT4


def test_quantize_model_keeps_dense_layers_and_float_model() -> None:
    model = dlrm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quantize(model, "int8")
    assert isinstance(q.sparse_arch.embedding_bag_collection, QuantEmbeddingBagCollection)
    assert torch.equal(q.dense_arch.model.mlp[0].weight if hasattr(q.dense_arch.model, "mlp") else
                       next(q.dense_arch.parameters()), next(model.dense_arch.parameters()))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    batch, dense = kjt(), torch.randn(5, 5)
    torch.testing.assert_close(q(dense, batch), model(dense, batch), atol=2e-3, rtol=0)


def test_quantize_dense_uses_dynamic_int8_linear() -> None:
    model = dlrm()
    q = quantize(model, "fp16", quantize_dense=True)
    kinds = {type(m).__module__ for m in q.modules()}
    assert any(k.startswith("torch.ao.nn.quantized.dynamic") for k in kinds)
    batch, dense = kjt(), torch.randn(5, 5)
    torch.testing.assert_close(q(dense, batch), model(dense, batch), atol=0.05, rtol=0)


def test_quantize_from_full_state_dict_matches_quantizing_the_module() -> None:
    trained = dlrm(seed=7)
    fresh = dlrm(seed=8)
    from_state = quantize(fresh, "int8", state_dict=trained.state_dict())
    direct = quantize(trained, "int8")
    batch, dense = kjt(), torch.randn(5, 5)
    assert torch.equal(from_state(dense, batch), direct(dense, batch))


def test_per_table_types_and_errors() -> None:
    ebc = lightrec.EmbeddingBagCollection(tables())
    q = quantize(ebc, torch.int8, per_table={"t1": torch.float16, "t2": "int4"})
    assert [t.data_type for t in q.embedding_bag_configs()] == [DataType.INT8, DataType.FP16, DataType.INT4]
    with pytest.raises(KeyError, match="nope"):
        quantize(ebc, "int8", per_table={"nope": "int4"})
    with pytest.raises(ValueError, match="int3"):
        quantize(ebc, "int3")
    odd = lightrec.EmbeddingBagCollection([lightrec.EmbeddingBagConfig(name="o", num_embeddings=5, embedding_dim=3,
                                                                       feature_names=["x"])])
    with pytest.raises(ValueError, match="even embedding_dim"):
        quantize(odd, "int4")
    with pytest.raises(ValueError, match="no EmbeddingBagCollection"):
        quantize(torch.nn.Linear(2, 2), "int8")


def test_bad_ids_raise_like_the_float_collection() -> None:
    q = quantize(lightrec.EmbeddingBagCollection(tables()), "int8")
    bad = lightrec.KeyedJaggedTensor(keys=["f0", "f1", "f2", "f3"], values=torch.tensor([1, 2, 99, 0]),
                                     lengths=torch.tensor([1, 1, 1, 1]))
    with pytest.raises(IndexError, match="table 't1' has 31 rows"):
        q(bad)


@pytest.mark.parametrize("kernel", kernel_params())
def test_tables_are_views_of_one_flat_buffer_through_moves_copies_and_loads(kernel: str) -> None:
    import copy

    torch.manual_seed(6)
    ebc = lightrec.EmbeddingBagCollection(tables())
    q = QuantEmbeddingBagCollection.from_float(ebc, dtype="int8", per_table={"t1": "int4"}, kernel_backend=kernel)
    batch = kjt(batch=5, seed=8)
    want = q(batch).values()

    def shares_storage(m: QuantEmbeddingBagCollection) -> bool:
        flat = m._flat_weights.untyped_storage().data_ptr()
        return all(t.weight.untyped_storage().data_ptr() == flat for t in m.embedding_bags.values())

    assert shares_storage(q) and q.storage_bytes() == q._flat_weights.numel()
    assert shares_storage(copy.deepcopy(q)) and shares_storage(q.to("cpu"))
    # built on meta, materialised empty, then loaded (the group constants are rebuilt, not left garbage)
    for assign in (False, True):
        fresh = QuantEmbeddingBagCollection(ebc.embedding_bag_configs(), dtype="int8", per_table={"t1": "int4"},
                                            kernel_backend=kernel, device="meta").to_empty(device="cpu")
        assert shares_storage(fresh)
        fresh.load_state_dict(q.state_dict(), assign=assign)  # lands in the flat buffer the kernel reads
        assert shares_storage(fresh) and torch.equal(fresh(batch).values(), want)
    copied = copy.deepcopy(q)
    copied.set_float_weight("t0", torch.zeros(40, 8))
    assert torch.equal(copied(batch).values()[:, :16], torch.zeros(5, 16)) and torch.equal(q(batch).values(), want)


@pytest.mark.parametrize("kernel", kernel_params())
def test_id_checks_of_equal_sized_tables_name_feature_and_sample(kernel: str) -> None:
    # three tables of 10 rows form one min/max run; the error still names the right table and sample
    equal = [lightrec.EmbeddingBagConfig(name=f"e{i}", num_embeddings=10, embedding_dim=4, feature_names=[f"x{i}"])
             for i in range(3)]
    q = quantize(lightrec.EmbeddingBagCollection(equal), "int8", kernel_backend=kernel)
    lengths = torch.tensor([1, 0, 1, 1, 0, 1])  # x0: [a], [] | x1: [b], [c] | x2: [], [d]
    ok = lightrec.KeyedJaggedTensor(keys=["x0", "x1", "x2"], values=torch.tensor([0, 9, 3, 9]), lengths=lengths)
    assert q(ok).values().shape == (2, 12)
    for values, message in (([0, 9, 10, 9], r"feature 'x1' \(sample 1\) has id 10 but table 'e1' has 10 rows"),
                            ([0, 9, 3, -1], r"feature 'x2' \(sample 1\) has id -1 but table 'e2' has 10 rows")):
        bad = lightrec.KeyedJaggedTensor(keys=["x0", "x1", "x2"], values=torch.tensor(values), lengths=lengths)
        with pytest.raises(IndexError, match=message):
            q(bad)


@pytest.mark.parametrize("kernel", kernel_params())
@pytest.mark.parametrize("mode", ["clamp", "skip"])
def test_clamp_and_skip_modes_match_the_float_collection(mode: str, kernel: str) -> None:
    torch.manual_seed(9)
    ebc = lightrec.EmbeddingBagCollection(tables(), is_weighted=True, bounds_check=mode)
    q = quantize(ebc, "fp16", kernel_backend=kernel)
    batch = kjt(batch=6, seed=10, weighted=True)
    values = batch.values().clone()
    values[::3] += 35  # every third id: some beyond their table
    values[1] = -2
    bad = lightrec.KeyedJaggedTensor(keys=FEATURES, values=values, lengths=batch.lengths(), weights=batch.weights())
    torch.testing.assert_close(q(bad).values(), ebc(bad).values(), atol=2e-3, rtol=0)


@pytest.mark.parametrize("kernel", kernel_params())
@pytest.mark.parametrize("mode", ["error", "clamp", "skip"])
def test_collection_scripts_directly_and_after_fx_trace(mode: str, kernel: str) -> None:
    from lightrec.fx.tracer import symbolic_trace

    ebc = lightrec.EmbeddingBagCollection(tables(), is_weighted=True, bounds_check=mode)
    q = quantize(ebc, "int8", per_table={"t1": "int4"}, kernel_backend=kernel)
    batch = kjt(batch=4, seed=12, weighted=True)
    want = q(batch).values()
    for scripted in (torch.jit.script(q), torch.jit.script(symbolic_trace(q))):
        assert torch.equal(scripted(batch).values(), want)
