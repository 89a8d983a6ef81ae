"""Which backend runs (``kernel_backend="auto"|"triton"``), and the Triton backend's device-side id checks."""

from __future__ import annotations

import pytest
import torch

import lightrec.kernels.fbgemm_backend as fbgemm_backend
import lightrec.kernels.triton_backend as triton_backend
from lightrec._fbgemm import fbgemm_available
from lightrec._triton import triton_available
from lightrec.kernels import (
    BatchedEmbeddingBag,
    EmbOptimType,
    FusedOptimizerSpec,
    KernelConfig,
    fbgemm_supports,
    select_backend,
)
from lightrec.modules.embedding_configs import PoolingType
from lightrec.modules.feature_checks import EmbeddingIdError
from tests.triton_support import DEVICE, requires_triton

needs_triton_import = pytest.mark.skipif(not triton_available(), reason="triton is not importable")
ROWWISE = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD)
CUDA = torch.device("cuda")


def _select(backend: str, spec: FusedOptimizerSpec | None, device: torch.device, dims: list[int] = [8, 8]) -> str:  # noqa: B006
    return select_backend(backend, KernelConfig([10] * len(dims), dims, list(range(len(dims))), PoolingType.SUM, spec, device))


@needs_triton_import
def test_auto_on_cuda_prefers_fbgemm_then_triton_then_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule as a function of what fbgemm and triton support (no GPU needed to decide)."""
    # the backends read their layout checks as class attributes (LayoutGatedKernel.layout_check)
    monkeypatch.setattr(fbgemm_backend.FbgemmBatchedLookup, "layout_check", lambda *a: None)
    assert _select("auto", ROWWISE, CUDA) == "fbgemm"
    monkeypatch.setattr(fbgemm_backend.FbgemmBatchedLookup, "layout_check", lambda *a: "fbgemm is unavailable (test)")
    assert _select("auto", ROWWISE, CUDA) == "triton"
    assert _select("auto", None, CUDA) == "triton"  # non-fused lookups too
    monkeypatch.setattr(triton_backend.TritonBatchedLookup, "layout_check", lambda *a: "triton failed to import (test)")
    assert _select("auto", ROWWISE, CUDA) == "torch"


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm absent")
def test_the_cpu_build_of_fbgemm_does_not_serve_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """fbgemm-gpu-cpu imports everywhere but has no CUDA kernels: auto must look further."""
    monkeypatch.setattr(fbgemm_backend, "fbgemm_serves_cuda", lambda: False)
    assert "CPU build" in str(fbgemm_supports(ROWWISE, CUDA, [8], PoolingType.SUM, [0]))
    assert fbgemm_supports(ROWWISE, torch.device("cpu"), [8], PoolingType.SUM, [0]) is None
    monkeypatch.setattr(fbgemm_backend, "fbgemm_serves_cuda", lambda: True)
    assert fbgemm_supports(ROWWISE, CUDA, [8], PoolingType.SUM, [0]) is None


@needs_triton_import
def test_auto_on_cpu_never_picks_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # even with the interpreter on
    monkeypatch.setattr(fbgemm_backend.FbgemmBatchedLookup, "layout_check", lambda *a: "fbgemm is unavailable (test)")
    assert _select("auto", ROWWISE, torch.device("cpu")) == "torch"
    assert _select("triton", ROWWISE, torch.device("cpu")) == "triton"


@needs_triton_import
def test_forcing_triton_on_cpu_without_the_interpreter_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"kernel_backend='triton' cannot serve this lookup: .*TRITON_INTERPRET=1"):
        BatchedEmbeddingBag([(10, 8)], optimizer=ROWWISE, kernel_backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="at most 2048"):
        _select("triton", ROWWISE, torch.device("cpu"), [4096])


def test_unknown_backend_and_id_check_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"kernel_backend must be one of \('auto', 'fbgemm', 'fbgemm_managed_caching', 'tiered', 'torch', 'triton'\)"):
        BatchedEmbeddingBag([(10, 8)], kernel_backend="cuda")
    with pytest.raises(ValueError, match="id_check must be one of"):
        BatchedEmbeddingBag([(10, 8)], kernel_backend="torch", id_check="later")
    with pytest.raises(ValueError, match="id_check='async' needs a kernel that checks ids on the device"):
        BatchedEmbeddingBag([(10, 8)], kernel_backend="torch", id_check="async")
    assert "id_check='sync'" in repr(BatchedEmbeddingBag([(10, 8)], kernel_backend="torch"))


@requires_triton
def test_triton_runs_when_forced_and_repr_says_so() -> None:
    module = BatchedEmbeddingBag([(10, 8), (6, 8)], optimizer=ROWWISE, kernel_backend="triton", device=DEVICE)
    assert module.backend_name == "triton"
    assert "kernel_backend='triton'" in repr(module)
    assert module.id_check == ("async" if DEVICE.type == "cuda" else "sync")


def _async_module() -> tuple[BatchedEmbeddingBag, BatchedEmbeddingBag]:
    spec = FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=1.0)
    tables = [(20, 4), (30, 4), (25, 4)]
    torch.manual_seed(0)
    tri = BatchedEmbeddingBag(tables, optimizer=spec, kernel_backend="triton", device=DEVICE, id_check="async")
    ref = BatchedEmbeddingBag(tables, optimizer=spec, kernel_backend="torch", device=DEVICE)
    ref.load_state_dict(tri.state_dict())
    return tri, ref


def _t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, device=DEVICE)


@requires_triton
def test_async_check_skips_bad_ids_and_reports_them_at_the_next_call() -> None:
    tri, ref = _async_module()
    before = [w.detach().clone() for w in tri.split_embedding_weights()]
    # B=1; f0 -> t0 (20 rows), f1 -> t1 (30 rows), f2 -> t2 (25 rows): id 27 is bad for t2
    out = tri(_t([1, 29, 27, 3]), _t([0, 1, 2, 4]))  # no error yet, and no host read
    expected = ref(_t([1, 29, 3]), _t([0, 1, 2, 3]))  # the same batch without the bad id
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    after = tri.split_embedding_weights()
    assert torch.equal(
        after[2][[i for i in range(25) if i != 3]], before[2][[i for i in range(25) if i != 3]]
    )
    assert not torch.equal(after[2][3], before[2][3])  # the good id of the bag was updated
    with pytest.raises(
        EmbeddingIdError, match=r"id 27 \(position 2, feature 2\).*table 't2' with 25 rows.*call 1"
    ):
        tri(_t([1, 2, 3]), _t([0, 1, 2, 3]))
    tri(_t([1, 2, 3]), _t([0, 1, 2, 3]))  # reported once; later good batches run
    tri.report_pending_errors()


@requires_triton
@pytest.mark.parametrize(
    ("offsets", "message"),
    [([0, 2, 1, 3], "has a negative length"), ([1, 1, 2, 3], "start at 0"), ([0, 1, 2, 2], "end at len")],
)
def test_async_check_reports_malformed_offsets(offsets: list[int], message: str) -> None:
    tri, _ = _async_module()
    tri(_t([1, 2, 3]), _t(offsets))  # the kernels clamp the bags: nothing is read out of bounds
    with pytest.raises(ValueError, match=message):
        tri.report_pending_errors()


@requires_triton
def test_sync_check_of_triton_raises_at_once() -> None:
    tri = BatchedEmbeddingBag([(20, 4)], optimizer=ROWWISE, kernel_backend="triton", device=DEVICE, id_check="sync")
    with pytest.raises(EmbeddingIdError, match=r"id 20 .*table 't0' with 20 rows"):
        tri(_t([1, 20]), _t([0, 1, 2]))
