"""Quantized lookups on the Triton kernel: the same numbers as the torch kernel, bit for bit.

Runs on CPU tensors under ``TRITON_INTERPRET=1`` (or on a GPU); see ``tests/triton_support.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import lightrec
from lightrec._triton import triton_available
from lightrec.fx.tracer import symbolic_trace
from lightrec.inference import QuantEmbeddingBagCollection, QuantEmbeddingCollection, export, load, quantize
from lightrec.quant import QUANT_KERNELS, resolve_quant_kernel
from tests.inference import reference
from tests.inference.helpers import dlrm, kjt, sequence_tables, tables
from tests.triton_support import DEVICE, requires_triton

KINDS = ["int8", "int4", "fp16", "mixed"]


def _quantized(
    kind: str, weighted: bool, backend: str, mean_last: bool = True, row_alignment: int = 16, dim: int = 8
) -> QuantEmbeddingBagCollection:
    torch.manual_seed(1)
    ebc = lightrec.EmbeddingBagCollection(
        tables(dim, mean_last=mean_last and kind != "mixed"), is_weighted=weighted
    )
    with torch.no_grad():  # rows of very different ranges stress the fp16 scale and bias
        for t in ebc.embedding_bags.values():
            t.weight.mul_(torch.rand(t.weight.shape[0], 1) * 20)
    per_table = {"t0": "int4", "t1": "fp16"} if kind == "mixed" else None
    q = QuantEmbeddingBagCollection.from_float(
        ebc,
        dtype="int8" if kind == "mixed" else kind,
        per_table=per_table,
        kernel_backend=backend,
        row_alignment=row_alignment,
    )
    return q.to(DEVICE) if backend == "triton" else q


@requires_triton
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_pooled_triton_equals_torch_kernel_and_reference(kind: str, weighted: bool) -> None:
    """SUM and MEAN groups, empty bags, int4/fp16/int8 mixed in one launch; exact equality."""
    tri, ref = _quantized(kind, weighted, "triton"), _quantized(kind, weighted, "torch")
    assert tri.kernel == "triton" and "kernel='triton'" in repr(tri)
    for seed in (2, 3):
        batch = kjt(batch=6, seed=seed, weighted=weighted)
        got, want = tri(batch.to(DEVICE)).values().cpu(), ref(batch).values()
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    # and against the numpy reference of fbgemm's arithmetic, feature by feature
    got = tri(batch.to(DEVICE)).to_dict()
    for t in tri.embedding_bag_configs():
        for f in t.feature_names:
            jt = batch[f]
            offsets = [0] + torch.cumsum(jt.lengths(), 0).tolist()
            w = jt.weights().tolist() if weighted else None
            stored = tri.embedding_bags[t.name].weight.cpu()
            want = reference.pooled(stored, t.data_type.value.lower(), t.embedding_dim, jt.values().tolist(), offsets,
                                    w, t.pooling == lightrec.PoolingType.MEAN)  # fmt: skip
            np.testing.assert_array_equal(got[f].cpu().numpy(), want)


@requires_triton
@pytest.mark.parametrize("kind", ["int8", "int4", "fp16"])
def test_sequence_triton_equals_torch_kernel(kind: str) -> None:
    torch.manual_seed(1)
    ec = lightrec.EmbeddingCollection(sequence_tables())
    tri = QuantEmbeddingCollection.from_float(ec, dtype=kind, kernel_backend="triton").to(DEVICE)
    ref = QuantEmbeddingCollection.from_float(ec, dtype=kind, kernel_backend="torch")
    assert tri.kernel == "triton" and "kernel='triton'" in repr(tri)
    batch = kjt(batch=6, seed=4)
    got, want = tri(batch.to(DEVICE)), ref(batch)
    for f in want:
        np.testing.assert_array_equal(got[f].values().cpu().numpy(), want[f].values().numpy())
        assert torch.equal(got[f].lengths().cpu(), want[f].lengths())


# (kind, row_alignment, dim): the int8/int4 layouts store rows of an odd number of bytes (int8 dim 5:
# 4 + 5 = 9; int4 dim 6: 4 + 3 = 7), so tables and their fp16 scale/bias start at odd bytes. fp16 rows
# of an odd size are refused (fbgemm steps through them in halves; see the test below), so the fp16
# layout only checks that an odd row_alignment which keeps rows whole halves gives the same numbers.
ODD_LAYOUTS = [("int8", 1, 5), ("int8", 3, 4), ("int4", 1, 6), ("int4", 3, 6), ("fp16", 1, 6),
               ("mixed", 1, 6), ("mixed", 3, 6)]  # fmt: skip


@requires_triton
@pytest.mark.parametrize("kind,row_alignment,dim", ODD_LAYOUTS)
def test_odd_row_alignment_equals_torch_kernel(kind: str, row_alignment: int, dim: int) -> None:
    """An odd ``row_alignment`` puts rows (their fp16 scale and bias, or fp16 values) at odd
    bytes, and can make the flat buffer's length odd: the kernel reads them bytewise, exactly."""
    tri = _quantized(kind, True, "triton", row_alignment=row_alignment, dim=dim)
    ref = _quantized(kind, True, "torch", row_alignment=row_alignment, dim=dim)
    if kind != "fp16":
        assert any(t.weight.shape[1] % 2 for t in tri.embedding_bags.values())
    batch = kjt(batch=6, seed=7, weighted=True)
    got, want = tri(batch.to(DEVICE)).values().cpu(), ref(batch).values()
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    if kind == "mixed":
        return
    torch.manual_seed(1)
    ec = lightrec.EmbeddingCollection(
        [lightrec.EmbeddingConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=dim + 2 * i,
                                  feature_names=t.feature_names) for i, t in enumerate(sequence_tables())]
    )  # fmt: skip
    seq = {
        be: QuantEmbeddingCollection.from_float(ec, dtype=kind, kernel_backend=be, row_alignment=row_alignment)
        for be in ("triton", "torch")
    }
    seq_got, seq_want = seq["triton"].to(DEVICE)(batch.to(DEVICE)), seq["torch"](batch)
    for f in seq_want:
        np.testing.assert_array_equal(seq_got[f].values().cpu().numpy(), seq_want[f].values().numpy())


@requires_triton
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("row_alignment,dim", [(3, 4), (5, 6)])
def test_fp16_rows_of_odd_size_refused_on_every_backend(backend: str, row_alignment: int, dim: int) -> None:
    """fp16 dim 4 padded to a multiple of 3 is 9 bytes a row: refused before any kernel runs, the
    same on both backends, with the fix in the message."""
    with pytest.raises(ValueError, match=rf"row_alignment={row_alignment} .*whole number of halves"):
        _quantized("fp16", True, backend, row_alignment=row_alignment, dim=dim)


@requires_triton
@pytest.mark.parametrize("fmt,suffix", [("torchscript", "pt"), ("export", "pt2")])
def test_triton_model_traces_scripts_and_exports(tmp_path: Path, fmt: str, suffix: str) -> None:
    """The Triton lookup is the custom op ``lightrec::triton_quant_pooled_lookup``: fx keeps it as
    one call, TorchScript compiles the caller, torch.export keeps one node."""
    q = _quantized("mixed", False, "triton")
    batch = kjt(batch=4, seed=5).to(DEVICE)
    assert torch.equal(torch.jit.script(symbolic_trace(q))(batch).values(), q(batch).values())
    model = quantize(dlrm(), "int8", kernel_backend="triton").to(DEVICE)
    assert {m.kernel for m in model.modules() if hasattr(m, "kernel")} == {"triton"}
    predictor = load(export(model, tmp_path / f"m.{suffix}", format=fmt), device=DEVICE)
    dense = torch.randn(4, 5, device=DEVICE)
    got = predictor(dense, batch.values(), batch.lengths())
    torch.testing.assert_close(got, model(dense, batch), rtol=0, atol=0)


@pytest.mark.skipif(not triton_available(), reason="triton is not importable")
def test_kernel_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda")
    monkeypatch.setattr("lightrec._fbgemm.has_fbgemm_op", lambda name: False)
    assert resolve_quant_kernel("auto", cuda) == "triton"  # auto on CUDA without fbgemm
    assert resolve_quant_kernel("auto", torch.device("cpu")) == "torch"  # never triton on CPU
    assert resolve_quant_kernel("torch", cuda) == "torch"
    monkeypatch.setattr("lightrec._fbgemm.has_fbgemm_op", lambda name: True)
    monkeypatch.setattr("lightrec._fbgemm.fbgemm_serves_cuda", lambda: True)
    assert resolve_quant_kernel("auto", cuda) == "fbgemm"
    monkeypatch.setattr("lightrec._fbgemm.fbgemm_serves_cuda", lambda: False)  # fbgemm-gpu-cpu
    assert resolve_quant_kernel("auto", cuda) == "triton"
    assert resolve_quant_kernel("auto", torch.device("cpu")) == "fbgemm"
    with pytest.raises(ValueError, match="ask for different kernels"):
        QuantEmbeddingBagCollection(tables(), kernel_backend="triton", use_fbgemm=True)
    with pytest.raises(ValueError, match="kernel_backend must be one of"):
        resolve_quant_kernel("tbe", cuda)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):  # no GPU to move to, no interpreter
        QuantEmbeddingBagCollection(tables(), kernel_backend="triton")
    assert QUANT_KERNELS == ("auto", "fbgemm", "triton", "torch")


@pytest.mark.skipif(not triton_available(), reason="triton is not importable")
def test_triton_module_built_on_the_host_is_for_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quantize on the host, then ``.to("cuda")``: a CPU module may pick Triton where a GPU is
    visible; a lookup left on the CPU (no interpreter) raises and says to move the module."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    q = QuantEmbeddingBagCollection(tables(), kernel_backend="triton")
    assert q.kernel == "triton"
    with pytest.raises(RuntimeError, match=r"kernel='triton'\) has its tables on cpu.*module.to\('cuda'\)"):
        q(kjt(batch=2, seed=0))
