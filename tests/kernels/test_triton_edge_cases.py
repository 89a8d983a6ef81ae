"""The Triton backend at its edges: malformed offsets, float64 weights, a hot id, strided gradients.

Runs on CPU tensors under ``TRITON_INTERPRET=1`` (or compiled on a GPU); see ``tests/triton_support.py``.
Each test compares against the torch backend (the plain-PyTorch reference of ``test_batched_embedding``)
or checks what the backend hands the kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from lightrec.kernels import (
    BatchedEmbedding,
    BatchedEmbeddingBag,
    EmbOptimType,
    FusedOptimizerSpec,
    triton_backend,
)
from lightrec.modules.embedding_configs import PoolingType
from tests.kernels.reference import Batch
from tests.kernels.test_triton_backend import CASES, _assert_same_state, _case_id, _on_device, _pair, _spec
from tests.triton_support import DEVICE, requires_triton

pytestmark = requires_triton


@contextmanager
def stale_allocations(int_value: int) -> Iterator[None]:
    """``torch.empty`` hands back blocks that held other data, as the CUDA caching allocator does.

    Integer blocks hold ``int_value`` (a plausible stale key or bag number), float blocks NaN.
    """
    real_empty = torch.empty

    def stale(*args: Any, **kwargs: Any) -> torch.Tensor:
        t = real_empty(*args, **kwargs)
        if t.numel():
            t.fill_(int_value if not t.dtype.is_floating_point else float("nan"))
        return t

    torch.empty = stale  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.empty = real_empty  # type: ignore[assignment]


@pytest.mark.parametrize("stale", [0, 3])  # a row of table 0 / a bag number past F * B
def test_malformed_offsets_update_no_row_and_are_reported(stale: int) -> None:
    """Position 0 lies in no bag (``offsets[0] = 1``): the backward must not touch any row for it
    (a stale key would update row 0 with another bag's gradient, or write out of bounds), and the
    next call reports the bad offsets."""
    spec = FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=1.0)
    module = BatchedEmbeddingBag(
        [(10, 4), (10, 4)], optimizer=spec, kernel_backend="triton", device=DEVICE, id_check="async"
    )
    before = [w.detach().clone() for w in module.split_embedding_weights()]
    ids, offsets = torch.tensor([5, 6, 7], device=DEVICE), torch.tensor([1, 2, 3], device=DEVICE)
    with stale_allocations(stale):
        out = module(ids, offsets)
        out.sum().backward()
    changed = [
        (b != a).any(dim=1).nonzero().flatten().tolist()
        for b, a in zip(before, module.split_embedding_weights(), strict=True)
    ]
    assert changed == [[6], [7]]  # only the rows looked up in some bag
    with pytest.raises(ValueError, match="offsets"):
        module(torch.tensor([1, 2], device=DEVICE), torch.tensor([0, 1, 2], device=DEVICE))


def test_malformed_offsets_leave_unpooled_rows_zero() -> None:
    """Unpooled output rows of ids in no bag are zeros, not whatever the allocator held."""
    module = BatchedEmbedding([(10, 4)], kernel_backend="triton", device=DEVICE, id_check="async")
    ids, offsets = torch.tensor([5, 6, 7], device=DEVICE), torch.tensor([1, 3], device=DEVICE)
    with stale_allocations(0):
        out = module(ids, offsets)
    assert torch.equal(out[0], torch.zeros(4, device=DEVICE))
    torch.testing.assert_close(out[1:], module.split_embedding_weights()[0][[6, 7]].detach())
    with pytest.raises(ValueError, match="offsets"):
        module(ids, torch.tensor([0, 3], device=DEVICE))


def _assert_same_float64_state(ref: torch.nn.Module, tri: torch.nn.Module) -> None:
    """Tables equal to float64 rounding of a float32-state update; states (float32 on Triton, as for
    every weight dtype there, see docs/kernels.md) equal to float32 rounding."""
    for w_ref, w_tri in zip(ref.split_embedding_weights(), tri.split_embedding_weights(), strict=True):
        assert w_tri.dtype == torch.float64
        # atol: one float32 rounding of an update of up to lr (0.3 x 6e-8; compiled kernels on an
        # H200 differed from the torch backend by 2.4e-9 where the interpreter matched to 1e-9)
        torch.testing.assert_close(w_tri, w_ref, rtol=1e-6, atol=2e-8)
    if ref.optimizer_spec is None:
        return
    s_ref, s_tri = ref.fused_optimizer.state_dict()["state"], tri.fused_optimizer.state_dict()["state"]
    for name in s_ref:
        for key in s_ref[name]:
            a, b = torch.as_tensor(s_tri[name][key]).cpu(), torch.as_tensor(s_ref[name][key]).cpu()
            torch.testing.assert_close(a.to(b.dtype), b, rtol=1e-6, atol=1e-9)


def _train(ref: torch.nn.Module, tri: torch.nn.Module, batches: list[Batch], gen: torch.Generator) -> None:
    """Forward, a random linear loss and backward on both; same outputs, tables and state each step."""
    fused = ref.optimizer_spec is not None
    for b in batches:
        args = (b.indices, b.offsets) if b.weights is None else (b.indices, b.offsets, b.weights)
        out_ref, out_tri = ref(*args), tri(*args)
        torch.testing.assert_close(out_tri, out_ref, rtol=1e-6, atol=1e-9)
        scale = torch.randn(out_ref.shape, generator=gen, dtype=out_ref.dtype).to(DEVICE)
        (out_ref * scale).sum().backward()
        (out_tri * scale).sum().backward()
        if not fused:
            for p_ref, p_tri in zip(ref.parameters(), tri.parameters(), strict=True):
                torch.testing.assert_close(p_tri.grad, p_ref.grad, rtol=1e-12, atol=1e-12)
                p_ref.grad = p_tri.grad = None
        _assert_same_float64_state(ref, tri)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_float64_weights_train_like_the_torch_backend(case: tuple | None, pooling: PoolingType) -> None:
    """float64 storage: float64 arithmetic (IEEE division and square root) in every kernel."""
    tables, ftm = [(12, 4), (9, 8)], [0, 1, 0]
    ref, tri = _pair(lambda **kw: BatchedEmbeddingBag(tables, ftm, pooling, optimizer=_spec(case), **kw))
    ref.double()
    tri.double()
    assert tri.split_embedding_weights()[0].dtype == torch.float64
    gen = torch.Generator().manual_seed(11)
    offsets = torch.tensor([0, 2, 2, 5, 6, 9, 10])
    batches = [
        Batch(
            torch.randint(0, 4, (10,), generator=gen).to(DEVICE),
            offsets.to(DEVICE),
            (torch.rand(10, generator=gen, dtype=torch.float64) + 0.5).to(DEVICE) if weighted else None,
            2,
        )
        for weighted in (True, False)
    ]
    _train(ref, tri, batches, gen)


@contextmanager
def launch_overrides(**overrides: int) -> Iterator[None]:
    saved = dict(triton_backend.LAUNCH_OVERRIDES)
    triton_backend.LAUNCH_OVERRIDES.update(overrides)
    try:
        yield
    finally:
        triton_backend.LAUNCH_OVERRIDES.clear()
        triton_backend.LAUNCH_OVERRIDES.update(saved)


@pytest.mark.parametrize("case", [None, *[CASES[i] for i in (1, 5, 10)]], ids=_case_id)
@pytest.mark.parametrize("steps", [1, 3])
def test_hot_id_spanning_many_programs_sums_exactly(case: tuple | None, steps: int) -> None:
    """One row in ~80% of 60 positions, with 2-id tiles: its run spans many programs and levels of
    the backward's reduction (per-program partial sums, reduced again), and must update its row
    once with the whole sum, like the torch backend."""
    tables, ftm = [(8, 4), (6, 8)], [0, 1, 0]
    gen = torch.Generator().manual_seed(12)
    lengths = torch.randint(0, 5, (3 * 8,), generator=gen)
    lengths[:8] = 5  # feature 0's bags alone hold 40 ids of table 0
    n = int(lengths.sum())
    ids = torch.randint(0, 6, (n,), generator=gen)
    ids = torch.where(torch.rand(n, generator=gen) < 0.8, torch.full_like(ids, 3), ids)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    weights = torch.rand(n, generator=gen) + 0.5
    batch = _on_device(Batch(ids, offsets, weights, 8), torch.int64)
    with launch_overrides(forward_block_b=2, backward_block_n=2, backward_steps=steps, num_warps=1):
        levels = triton_backend.reduction_levels(n, 2)
        assert len(levels) >= 3 and levels[-1][2] == 1
        ref, tri = _pair(lambda **kw: BatchedEmbeddingBag(tables, ftm, optimizer=_spec(case), **kw))
        for _ in range(2):
            args = (batch.indices, batch.offsets, batch.weights)
            out_ref, out_tri = ref(*args), tri(*args)
            torch.testing.assert_close(out_tri, out_ref, rtol=1e-5, atol=1e-6)
            scale = torch.randn(out_ref.shape, generator=gen).to(DEVICE)
            (out_ref * scale).sum().backward()
            (out_tri * scale).sum().backward()
            if case is None:
                for p_ref, p_tri in zip(ref.parameters(), tri.parameters(), strict=True):
                    torch.testing.assert_close(p_tri.grad, p_ref.grad, rtol=1e-5, atol=1e-5)
                    p_ref.grad = p_tri.grad = None
            _assert_same_state(ref, tri, case is not None)


def test_reduction_levels_do_not_depend_on_the_ids() -> None:
    """The backward's work per program is bounded by the tile count, whatever the ids: a batch of
    one hot id runs the launches (and per-program tiles) of a batch of distinct ids."""
    for n in (1, 5, 128, 129, 8_000, 65_536 * 26):
        levels = triton_backend.reduction_levels(n, 16)
        assert levels[0][0] == n and levels[-1][2] == 1
        for entries, steps, programs in levels:
            assert steps * 16 <= max(triton_backend._BACKWARD_SPAN, 64) and programs * steps * 16 >= entries
        for (_, _, programs), (entries, _, _) in zip(levels, levels[1:], strict=False):
            assert entries == 2 * programs  # each level reads the pieces of the one before
    assert len(triton_backend.reduction_levels(65_536 * 26, 16)) <= 4


def _spy_backward(monkeypatch: pytest.MonkeyPatch, backend: Any) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    original: Callable[..., Any] = backend.backward

    def spy(grad_out: torch.Tensor, *args: Any) -> Any:
        seen.append(grad_out)
        return original(grad_out, *args)

    monkeypatch.setattr(backend, "backward", spy)
    return seen


def test_column_slice_of_the_gradient_is_read_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup's share of a concatenated output gets a column slice of the wider gradient: the
    kernel reads it with its row stride instead of copying it, and trains like the torch backend."""
    spec = FusedOptimizerSpec(EmbOptimType.ADAGRAD, learning_rate=0.1)
    ref, tri = _pair(lambda **kw: BatchedEmbeddingBag([(10, 4), (10, 8)], optimizer=spec, **kw))
    seen = _spy_backward(monkeypatch, tri._backend)
    ids = torch.tensor([1, 2, 2, 5, 9], device=DEVICE)
    offsets = torch.tensor([0, 2, 3, 4, 5], device=DEVICE)
    side = torch.randn(2, 3, device=DEVICE, requires_grad=True)
    scale = torch.randn(2, 15, device=DEVICE)
    for module in (ref, tri):
        (torch.cat([side, module(ids, offsets)], dim=1) * scale).sum().backward()
    (grad,) = seen
    assert grad.stride() == (15, 1)  # the slice of the [2, 15] gradient itself, no copy
    _assert_same_state(ref, tri, fused=True)


def test_adam_step_counts_past_float32_precision() -> None:
    spec = FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=0.1)
    module = BatchedEmbeddingBag([(10, 4)], optimizer=spec, kernel_backend="triton", device=DEVICE)
    step = module.fused_optimizer.state_dict()["state"]["weights.t0"]["step"]
    assert step.dtype == torch.int64
    step.fill_(2**24)
    module(torch.tensor([1, 2], device=DEVICE), torch.tensor([0, 1, 2], device=DEVICE)).sum().backward()
    assert int(step) == 2**24 + 1


def test_empty_batch_output_has_the_weights_dtype() -> None:
    module = BatchedEmbeddingBag([(10, 4)], kernel_backend="triton", device=DEVICE).double()
    out = module(
        torch.zeros(0, dtype=torch.long, device=DEVICE), torch.zeros(1, dtype=torch.long, device=DEVICE)
    )
    assert out.dtype == torch.float64


def test_a_batch_of_no_samples_advances_adams_step() -> None:
    """A rank's empty batch advances Adam's t as fbgemm's iter does (tests/kernels/test_review_empty_batch_step.py)."""
    from tests.kernels.test_review_empty_batch_step import B1, B2, EPS, LR, TABLES, check_empty_batches_count

    torch.manual_seed(0)
    spec = FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=LR, beta1=B1, beta2=B2, eps=EPS)
    module = BatchedEmbeddingBag(TABLES, [0, 1], PoolingType.SUM, optimizer=spec, kernel_backend="triton", device=DEVICE)
    check_empty_batches_count(module, "triton", device=str(DEVICE))
