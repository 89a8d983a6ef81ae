"""The Triton backend against the torch backend: outputs, tables and optimizer states, step by step.

Runs on CPU tensors under ``TRITON_INTERPRET=1`` (or on a GPU); see ``tests/triton_support.py``.
Sizes stay tiny: the interpreter runs every program in Python.
"""

from __future__ import annotations

import pytest
import torch

from lightrec.kernels import BatchedEmbedding, BatchedEmbeddingBag, EmbOptimType, FusedOptimizerSpec
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import ROW_RULE_OPTIMIZERS
from tests.kernels.reference import LAYOUTS, Batch, random_batch
from tests.kernels.test_batched_embedding import OPTIMIZER_CASES
from tests.triton_support import DEVICE, requires_triton

pytestmark = requires_triton

# The Triton kernels serve SGD, Adagrad, row-wise Adagrad and Adam; torchrec's LAMB / LARS /
# partial row-wise rules run on the torch and fbgemm backends (refused here: see the test below).
TRITON_OPTIMIZER_CASES = [c for c in OPTIMIZER_CASES if c[0] not in ROW_RULE_OPTIMIZERS]
CASES = [None, *TRITON_OPTIMIZER_CASES]  # None: no fused optimizer (dense gradients)


def _case_id(case: tuple | None) -> str:
    return "dense-grad" if case is None else f"{case[1]}-{case[3]}"


def _spec(case: tuple | None, lr: float = 0.1) -> FusedOptimizerSpec | None:
    if case is None:
        return None
    kind, _, wd, mode = case
    return FusedOptimizerSpec(
        kind, learning_rate=lr, eps=1e-6, weight_decay=wd, weight_decay_mode=mode or "l2"
    )


def _pair(make, **kwargs):  # noqa: ANN001, ANN202
    """The same module on the torch backend and on the Triton backend, with equal weights."""
    torch.manual_seed(0)
    ref = make(kernel_backend="torch", device=DEVICE, **kwargs)
    tri = make(kernel_backend="triton", device=DEVICE, **kwargs)
    tri.load_state_dict(ref.state_dict())
    assert tri.backend_name == "triton" and "kernel_backend='triton'" in repr(tri)
    return ref, tri


def _on_device(b: Batch, ids_dtype: torch.dtype) -> Batch:
    w = b.weights.to(DEVICE) if b.weights is not None else None
    return Batch(b.indices.to(DEVICE, ids_dtype), b.offsets.to(DEVICE, ids_dtype), w, b.batch)


# Compiled on a GPU, the two backends add a hot row's gradients in different orders (torch's CUDA
# kernels with atomics) and contract differently into FMAs: a few float32 ulps, which Adam's
# m / sqrt(v) can blow up where a row's gradients nearly cancel (seen on an H200: 3.6e-6 on a weight
# of 0.13 after two steps of lr 0.3). Under the interpreter the tolerance stays tight.
WEIGHT_ATOL = 1e-5 if DEVICE.type == "cuda" else 1e-6


def _assert_same_state(ref: torch.nn.Module, tri: torch.nn.Module, fused: bool) -> None:
    for w_ref, w_tri in zip(ref.split_embedding_weights(), tri.split_embedding_weights(), strict=True):
        torch.testing.assert_close(w_tri, w_ref, rtol=1e-5, atol=WEIGHT_ATOL)
    if not fused:
        return
    s_ref, s_tri = ref.fused_optimizer.state_dict()["state"], tri.fused_optimizer.state_dict()["state"]
    assert s_ref.keys() == s_tri.keys()
    for name in s_ref:
        assert s_ref[name].keys() == s_tri[name].keys()
        for key in s_ref[name]:
            torch.testing.assert_close(
                torch.as_tensor(s_tri[name][key]).cpu(),
                torch.as_tensor(s_ref[name][key]).cpu(),
                rtol=1e-5,
                atol=1e-7,
            )


def _train_side_by_side(ref, tri, batches, widths, lrs, gen) -> None:  # noqa: ANN001
    """Forward, a random linear loss, backward, on both; LR changed between steps; compare each step."""
    fused = ref.optimizer_spec is not None
    for b, lr in zip(batches, lrs, strict=True):
        if fused:
            ref.fused_optimizer.param_groups[0]["lr"] = lr
            tri.fused_optimizer.param_groups[0]["lr"] = lr
        args = (
            (b.indices, b.offsets)
            if b.weights is None or widths is None
            else (b.indices, b.offsets, b.weights)
        )
        out_ref, out_tri = ref(*args), tri(*args)
        torch.testing.assert_close(out_tri, out_ref, rtol=1e-5, atol=1e-6)
        scale = torch.randn(out_ref.shape, generator=gen).to(DEVICE)
        (out_ref * scale).sum().backward()
        (out_tri * scale).sum().backward()
        if not fused:  # dense gradients, then the same plain SGD step on both
            for p_ref, p_tri in zip(ref.parameters(), tri.parameters(), strict=True):
                torch.testing.assert_close(p_tri.grad, p_ref.grad, rtol=1e-5, atol=1e-6)
                with torch.no_grad():
                    p_ref -= lr * p_ref.grad
                    p_tri -= lr * p_tri.grad
                p_ref.grad = p_tri.grad = None
        _assert_same_state(ref, tri, fused)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_pooled_training_matches_torch_backend(case: tuple | None, layout: str, pooling: PoolingType) -> None:
    """Every optimizer and decay mode, mixed dims, shared tables; weighted bags in two layouts;
    int32 ids for one layout; four steps with the LR changed every step."""
    tables, ftm = LAYOUTS[layout]
    ref, tri = _pair(lambda **kw: BatchedEmbeddingBag(tables, ftm, pooling, optimizer=_spec(case), **kw))
    gen = torch.Generator().manual_seed(2)
    ids_dtype = torch.int32 if layout == "uniform" else torch.int64
    weighted = layout != "uniform"
    batches = [
        _on_device(
            random_batch(gen, [r for r, _ in tables], ftm, batch=5, weighted=weighted, max_len=4), ids_dtype
        )
        for _ in range(4)
    ]
    _train_side_by_side(ref, tri, batches, [d for _, d in tables], [0.1, 0.05, 0.2, 0.01], gen)


@pytest.mark.usefixtures("tiles")
@pytest.mark.parametrize("case", [None, TRITON_OPTIMIZER_CASES[4], TRITON_OPTIMIZER_CASES[9]], ids=_case_id)
def test_runs_crossing_tiles_and_partial_tiles(case: tuple | None) -> None:
    """Ids drawn from 3 rows over 9 bags of up to 6 ids: runs of one row are far longer than a
    2-id backward tile, so their owners must read many following tiles."""
    tables, ftm = [(3, 8), (40, 8)], [0, 1, 0]
    ref, tri = _pair(
        lambda **kw: BatchedEmbeddingBag(tables, ftm, PoolingType.SUM, optimizer=_spec(case), **kw)
    )
    gen = torch.Generator().manual_seed(3)
    batches = [_on_device(random_batch(gen, [3, 40], ftm, batch=9, weighted=True, max_len=6), torch.int64)]
    batches.append(
        _on_device(random_batch(gen, [3, 40], ftm, batch=9, weighted=False, max_len=6), torch.int32)
    )
    _train_side_by_side(ref, tri, batches, [8, 8], [0.1, 0.3], gen)


@pytest.mark.usefixtures("tiles")
@pytest.mark.parametrize("case", [None, *TRITON_OPTIMIZER_CASES[::2]], ids=_case_id)
def test_unpooled_training_matches_torch_backend(case: tuple | None) -> None:
    tables, ftm = [(20, 8), (30, 8)], [0, 1, 0]
    ref, tri = _pair(lambda **kw: BatchedEmbedding(tables, ftm, optimizer=_spec(case), **kw))
    gen = torch.Generator().manual_seed(4)
    batches = [
        _on_device(random_batch(gen, [20, 30], ftm, batch=4, weighted=False, max_len=3), dtype)
        for dtype in (torch.int64, torch.int32, torch.int64)
    ]
    _train_side_by_side(ref, tri, batches, None, [0.1, 0.2, 0.05], gen)


def _fixed_batch(lengths: list[int], ids: list[int], batch: int) -> Batch:
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return Batch(torch.tensor(ids, dtype=torch.long), offsets, None, batch)


@pytest.mark.parametrize("kind", ROW_RULE_OPTIMIZERS, ids=lambda k: k.name)
def test_row_rule_optimizers_are_refused_by_name(kind: EmbOptimType) -> None:
    """backend='triton' with LAMB / LARS / partial row-wise: a clear error, not a wrong update."""
    spec = FusedOptimizerSpec(kind, learning_rate=0.1)
    with pytest.raises(ValueError, match=f"do not implement {kind.name}.*torch backend"):
        BatchedEmbeddingBag([(20, 8)], optimizer=spec, backend="triton", device=DEVICE)
    assert BatchedEmbeddingBag([(20, 8)], optimizer=spec, backend="auto", device=DEVICE).backend_name != "triton"


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_empty_bags_zero_ids_and_empty_batch(pooling: PoolingType) -> None:
    spec = FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=0.1)
    tables, ftm = [(10, 4), (12, 4)], [0, 1]
    ref, tri = _pair(lambda **kw: BatchedEmbeddingBag(tables, ftm, pooling, optimizer=spec, **kw))
    gen = torch.Generator().manual_seed(5)
    batches = [
        _on_device(_fixed_batch([0, 2, 0, 0, 3, 0], [1, 1, 4, 4, 9], batch=3), torch.int64),  # empty bags
        _on_device(_fixed_batch([0, 0, 0, 0], [], batch=2), torch.int64),  # a batch without ids
        _on_device(_fixed_batch([1, 1], [0, 11], batch=1), torch.int32),
    ]
    _train_side_by_side(ref, tri, batches, None, [0.1, 0.1, 0.1], gen)
    out = tri(
        torch.zeros(0, dtype=torch.long, device=DEVICE), torch.zeros(1, dtype=torch.long, device=DEVICE)
    )
    assert out.shape == (0, 8)  # a batch of zero samples
    out.sum().backward()
    # Adam's step counts every training backward, a batch of zero samples too (as fbgemm's iter does)
    assert float(tri.fused_optimizer.state_dict()["state"]["weights.t0"]["step"]) == 4


def test_checkpoints_round_trip_between_backends() -> None:
    """Train on triton, continue from its checkpoint on torch (and back): same tables and state."""
    spec = FusedOptimizerSpec(
        EmbOptimType.ADAM, learning_rate=0.05, weight_decay=0.01, weight_decay_mode="decoupled"
    )
    tables, ftm = LAYOUTS["mixed_shared"]
    ref, tri = _pair(lambda **kw: BatchedEmbeddingBag(tables, ftm, PoolingType.SUM, optimizer=spec, **kw))
    gen = torch.Generator().manual_seed(6)
    batches = [
        _on_device(random_batch(gen, [r for r, _ in tables], ftm, 4, True), torch.int64) for _ in range(4)
    ]
    _train_side_by_side(ref, tri, batches[:2], [4, 8, 4], [0.05, 0.05], gen)
    torch.manual_seed(
        1
    )  # fresh modules with other weights and empty state, then load the checkpoints crosswise
    from_tri = BatchedEmbeddingBag(tables, ftm, optimizer=spec, kernel_backend="torch", device=DEVICE)
    from_ref = BatchedEmbeddingBag(tables, ftm, optimizer=spec, kernel_backend="triton", device=DEVICE)
    from_tri.load_state_dict(tri.state_dict())
    from_tri.fused_optimizer.load_state_dict(tri.fused_optimizer.state_dict())
    from_ref.load_state_dict(ref.state_dict())
    from_ref.fused_optimizer.load_state_dict(ref.fused_optimizer.state_dict())
    # torch continuing triton's run and triton continuing torch's run stay together step by step
    _train_side_by_side(from_tri, from_ref, batches[2:], [4, 8, 4], [0.05, 0.05], gen)
    state = from_ref.fused_optimizer.state_dict()["state"]["weights.t0"]
    assert float(state["step"]) == 4 and state["momentum1"].shape == (20, 4)


def test_step_counter_and_state_views_alias_the_storage() -> None:
    spec = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.5)
    module = BatchedEmbeddingBag([(6, 4), (5, 8)], optimizer=spec, kernel_backend="triton", device=DEVICE)
    w0 = module.split_embedding_weights()[0]
    state = module.fused_optimizer.state[w0]["momentum1"]
    assert state.shape == (6,) and state.dtype == torch.float32
    ids, offsets = torch.tensor([2, 2, 4], device=DEVICE), torch.tensor([0, 2, 3], device=DEVICE)
    before = w0[2].clone()
    module(ids, offsets).sum().backward()
    assert not torch.equal(w0[2], before) and float(state[2]) > 0  # the exposed views saw the update
    assert float(state[0]) == 0.0


def test_bf16_weights_keep_float32_state() -> None:
    """Low-precision weights: bf16 rows, fp32 optimizer state, fp32 arithmetic in the kernels."""
    spec = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.1, eps=1e-6)
    ref, tri = _pair(lambda **kw: BatchedEmbeddingBag([(16, 8)], optimizer=spec, **kw))
    tri.to(torch.bfloat16)
    with torch.no_grad():  # the fp32 reference starts from the same (bf16-rounded) rows
        ref.split_embedding_weights()[0].copy_(tri.split_embedding_weights()[0].float())
    state = tri.fused_optimizer.state_dict()["state"]["weights.t0"]["momentum1"]
    assert tri.split_embedding_weights()[0].dtype == torch.bfloat16 and state.dtype == torch.float32
    gen = torch.Generator().manual_seed(8)
    b = _on_device(random_batch(gen, [16], [0], batch=6, weighted=False, max_len=3), torch.int64)
    out_ref, out_tri = ref(b.indices, b.offsets), tri(b.indices, b.offsets)
    assert out_tri.dtype == torch.bfloat16
    torch.testing.assert_close(out_tri.float(), out_ref, rtol=1e-2, atol=1e-2)
    out_ref.sum().backward()
    out_tri.sum().backward()
    torch.testing.assert_close(
        tri.split_embedding_weights()[0].float(), ref.split_embedding_weights()[0], rtol=1e-2, atol=1e-2
    )
    s_ref = ref.fused_optimizer.state_dict()["state"]["weights.t0"]["momentum1"]
    torch.testing.assert_close(state, s_ref, rtol=1e-2, atol=1e-6)


def test_inference_mode_lookup_writes_nothing_for_backward() -> None:
    module = BatchedEmbeddingBag([(10, 4)], optimizer=FusedOptimizerSpec(), kernel_backend="triton", device=DEVICE)
    ref = BatchedEmbeddingBag([(10, 4)], optimizer=FusedOptimizerSpec(), kernel_backend="torch", device=DEVICE)
    ref.load_state_dict(module.state_dict())
    ids, offsets = torch.tensor([1, 3, 3], device=DEVICE), torch.tensor([0, 1, 3], device=DEVICE)
    with torch.inference_mode():
        out = module(ids, offsets)
    assert not out.requires_grad
    torch.testing.assert_close(out, ref(ids, offsets).detach())


def test_deep_copies_and_pickles_train_on_their_own_storage() -> None:
    import copy
    import io

    spec = FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=0.1)
    module = BatchedEmbeddingBag([(10, 4), (6, 4)], optimizer=spec, kernel_backend="triton", device=DEVICE)
    ids, offsets = torch.tensor([1, 2, 1], device=DEVICE), torch.tensor([0, 2, 3], device=DEVICE)
    module(ids, offsets).sum().backward()
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    copies = [copy.deepcopy(module), torch.load(buffer, weights_only=False)]
    for c in copies:  # the parameters alias the copy's own flat buffer, not the original's
        assert c.split_embedding_weights()[0].data_ptr() == c._backend.weight.data_ptr()
        assert c._backend.weight.data_ptr() != module._backend.weight.data_ptr()
    for m in [module, *copies]:
        m(ids, offsets).sum().backward()
    for c in copies:
        _assert_same_state(module, c, fused=True)
