"""Quantized EmbeddingCollection (sequence embeddings): exact rows, error bounds, quantize(), artifacts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import lightrec
from lightrec.fx.tracer import symbolic_trace
from lightrec.inference import QuantEmbeddingCollection, export, load, quantize
from lightrec.modules import DataType
from lightrec.modules.feature_checks import EmbeddingIdError
from lightrec.quant.row_codec import max_abs_error
from tests.inference import reference
from tests.inference.helpers import (
    FEATURES,
    kernel_params,
    kjt,
    needs_fbgemm,
    sequence_model,
    sequence_tables,
)

KINDS = {"int8": DataType.INT8, "int4": DataType.INT4, "fp16": DataType.FP16}
REPO = Path(__file__).resolve().parents[2]


def _reference_rows(stored: torch.Tensor, kind: str, dim: int, ids: torch.Tensor) -> np.ndarray:
    """Rows decoded from raw bytes with numpy: float32(float64(scale) * q + float64(bias))."""
    q, scale, bias = reference.decode(stored, kind, dim)
    picked = q[ids.numpy()]
    if scale is None:
        return picked.astype(np.float32)
    return (scale[ids.numpy()].astype(np.float64)[:, None] * picked
            + bias[ids.numpy()].astype(np.float64)[:, None]).astype(np.float32)


@pytest.mark.parametrize("kernel", kernel_params())
@pytest.mark.parametrize("kind", list(KINDS))
def test_rows_equal_reference_dequantization_exactly(kind: str, kernel: str) -> None:
    torch.manual_seed(1)
    ec = lightrec.EmbeddingCollection(sequence_tables())
    with torch.no_grad():  # rows of very different ranges (and one constant row) stress scale/bias
        for t in ec.embeddings.values():
            t.weight.mul_(torch.rand(t.weight.shape[0], 1) * 20)
            t.weight[0] = -0.75
    q = QuantEmbeddingCollection.from_float(ec, dtype=kind, kernel_backend=kernel)
    batch = kjt(batch=6, seed=2).permute([2, 0, 3, 1])  # any key order; empty bags included
    got, floats = q(batch), ec(batch)
    assert list(got) == FEATURES
    for t in q.embedding_configs():
        assert t.data_type == KINDS[kind]
        for f in t.feature_names:
            jt = batch[f]
            want = _reference_rows(q.embeddings[t.name].weight, kind, t.embedding_dim, jt.values())
            np.testing.assert_array_equal(got[f].values().numpy(), want, err_msg=f"{kind} feature {f}")
            assert torch.equal(got[f].lengths(), floats[f].lengths())
            assert got[f].values().dtype == torch.float32
            # the same numbers the documented dequantization gives
            assert torch.equal(got[f].values(), q.dequantized_weight(t.name)[jt.values()])


@pytest.mark.parametrize("kernel", kernel_params())
@pytest.mark.parametrize("kind", list(KINDS))
def test_rows_within_error_bound_of_fp32(kind: str, kernel: str) -> None:
    torch.manual_seed(3)
    ec = lightrec.EmbeddingCollection(sequence_tables())
    q = QuantEmbeddingCollection.from_float(ec, dtype=kind, kernel_backend=kernel)
    batch = kjt(batch=8, seed=4)
    got, want = q(batch), ec(batch)
    for t in ec.embedding_configs():
        bound = max_abs_error(ec.embeddings[t.name].weight, KINDS[kind])
        for f in t.feature_names:
            err = (got[f].values() - want[f].values()).abs().max(dim=1).values
            assert bool((err <= bound[batch[f].values()]).all()), f"{kind} {f}: {(err - bound[batch[f].values()]).max()}"


@needs_fbgemm()
def test_fbgemm_kernel_equals_torch_kernel_on_larger_batch() -> None:
    torch.manual_seed(5)
    ec = lightrec.EmbeddingCollection(sequence_tables())
    batch = kjt(batch=64, seed=6, max_len=12)
    for kind in KINDS:
        a = QuantEmbeddingCollection.from_float(ec, dtype=kind, kernel_backend="fbgemm")(batch)
        b = QuantEmbeddingCollection.from_float(ec, dtype=kind, kernel_backend="torch")(batch)
        assert all(torch.equal(a[f].values(), b[f].values()) for f in FEATURES), kind


_BLOCKED_CHILD = """
import sys, torch
sys.path.insert(0, {repo!r})
from tests.fbgemm_block import install_fbgemm_block
install_fbgemm_block()
from lightrec._fbgemm import fbgemm_available
assert not fbgemm_available()
from lightrec.inference import quantize
from tests.inference.helpers import kjt, sequence_model
model = sequence_model(seed=4)
batch = kjt(batch=32, seed=9, max_len=6)
out = {{}}
for kind in ("int8", "int4", "fp16"):
    rows = quantize(model, kind).ec(batch)
    out[kind] = {{f: jt.values() for f, jt in rows.items()}}
torch.save(out, sys.argv[1])
"""


@needs_fbgemm()
def test_fbgemm_here_equals_torch_kernel_where_fbgemm_is_blocked(tmp_path: Path) -> None:
    """The LIGHTREC_BLOCK_FBGEMM=1 world (fbgemm_gpu unimportable) computes the same rows bit for bit."""
    script = tmp_path / "child.py"
    script.write_text(_BLOCKED_CHILD.format(repo=str(REPO)))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "rows.pt")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    blocked = torch.load(tmp_path / "rows.pt")
    model, batch = sequence_model(seed=4), kjt(batch=32, seed=9, max_len=6)
    for kind in KINDS:
        here = quantize(model, kind, kernel_backend="fbgemm").ec(batch)
        assert all(torch.equal(here[f].values(), blocked[kind][f]) for f in FEATURES), kind


def test_quantize_swaps_ec_and_keeps_float_model() -> None:
    model = sequence_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quantize(model, "int8", per_table={"t1": "fp16", "t2": "int4"})
    assert isinstance(q.ec, QuantEmbeddingCollection) and isinstance(model.ec, lightrec.EmbeddingCollection)
    assert [t.data_type for t in q.ec.embedding_configs()] == [DataType.INT8, DataType.FP16, DataType.INT4]
    assert {n: (tuple(b.shape), b.dtype) for n, b in q.named_buffers()} == {
        "ec.embeddings.t0.weight": ((40, 16), torch.uint8),  # 8 + 4 bytes -> 16
        "ec.embeddings.t1.weight": ((31, 16), torch.uint8),  # 4 halves = 8 bytes -> 16
        "ec.embeddings.t2.weight": ((17, 16), torch.uint8),  # 3 + 4 bytes -> 16
    }
    assert torch.equal(q.linear.weight, model.linear.weight)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    batch = kjt()
    torch.testing.assert_close(q(batch), model(batch), atol=0.02, rtol=0)
    # from a full state dict (e.g. a checkpoint) instead of the module's own weights
    from_state = quantize(sequence_model(seed=8), "int8", state_dict=model.state_dict())
    assert torch.equal(from_state(batch), quantize(model, "int8")(batch))


def test_quantize_dynamic_torchrec_api_and_fused_collection() -> None:
    from torch import quantization as quant

    from lightrec.modules.quant_config import QuantConfig

    ec = lightrec.EmbeddingCollection(sequence_tables())
    qconfig = QuantConfig(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
                          weight=quant.PlaceholderObserver.with_args(dtype=torch.quint4x2))
    q = quant.quantize_dynamic(torch.nn.Sequential(ec), qconfig_spec={lightrec.EmbeddingCollection: qconfig},
                               mapping={lightrec.EmbeddingCollection: QuantEmbeddingCollection}, inplace=False)
    assert isinstance(q[0], QuantEmbeddingCollection) and q[0].embedding_configs()[0].data_type == DataType.INT4
    import dataclasses

    same_dim = [dataclasses.replace(t, embedding_dim=8) for t in sequence_tables()]  # fused: one width
    ec = lightrec.EmbeddingCollection(same_dim)
    fused = lightrec.FusedEmbeddingCollection(same_dim, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1})
    fused.load_state_dict(ec.state_dict())
    batch = kjt()
    a, b = quantize(fused, "int8")(batch), quantize(ec, "int8")(batch)
    assert all(torch.equal(a[f].values(), b[f].values()) for f in FEATURES)


def test_bounds_check_matches_the_float_collection() -> None:
    bad = lightrec.KeyedJaggedTensor(keys=FEATURES, values=torch.tensor([1, 2, 40, 0, 99, 3]),
                                     lengths=torch.tensor([1, 2, 1, 2]), stride=1)
    with pytest.raises(EmbeddingIdError, match="table 't0' has 40 rows"):
        quantize(lightrec.EmbeddingCollection(sequence_tables()), "int8")(bad)
    for mode in ("clamp", "skip"):
        ec = lightrec.EmbeddingCollection(sequence_tables(), bounds_check=mode)
        q, want = quantize(ec, "fp16")(bad), ec(bad)
        for f in FEATURES:
            assert torch.equal(q[f].lengths(), want[f].lengths()), (mode, f)
            torch.testing.assert_close(q[f].values(), want[f].values(), atol=1e-3, rtol=0)


@pytest.mark.parametrize("kernel", kernel_params())
def test_scripts_directly_and_after_fx_trace(kernel: str) -> None:
    q = quantize(lightrec.EmbeddingCollection(sequence_tables()), "int4", kernel_backend=kernel)
    batch = kjt(batch=4, seed=7)
    want = q(batch)
    for scripted in (torch.jit.script(q), torch.jit.script(symbolic_trace(q))):
        got = scripted(batch)
        assert all(torch.equal(got[f].values(), want[f].values()) for f in FEATURES)


@pytest.mark.parametrize("kernel", kernel_params())
@pytest.mark.parametrize("fmt,suffix", [("torchscript", "pt"), ("export", "pt2")])
def test_sequence_model_artifacts_reproduce_the_model(tmp_path: Path, fmt: str, suffix: str, kernel: str) -> None:
    q = quantize(sequence_model(), "int8", kernel_backend=kernel)
    path = export(q, tmp_path / f"seq.{suffix}", format=fmt)
    meta = json.loads(Path(f"{path}.meta.json").read_text())
    assert meta["feature_names"] == FEATURES and meta["takes_dense"] is False
    assert [t["pooling"] for t in meta["tables"]] == ["NONE"] * 3 and meta["dtype"] == ["INT8"]
    predictor = load(path)
    for batch_size in (2, 7):
        batch = kjt(batch=batch_size, seed=batch_size)
        got = predictor(torch.zeros(batch_size, 0), batch.values(), batch.lengths())
        assert torch.equal(got, q(batch))
    scores = predictor.predict([{"sparse": {"f0": [1, 39], "f2": [30]}}, {"sparse": {"f3": [16]}}])
    assert scores.shape == (2,) and bool(((scores > 0) & (scores < 1)).all())


def test_export_rejects_a_model_returning_jagged_rows(tmp_path: Path) -> None:
    from lightrec.inference import ExportError

    with pytest.raises(ExportError, match="must return one tensor"):
        export(quantize(lightrec.EmbeddingCollection(sequence_tables()), "int8"), tmp_path / "ec.pt")
