"""Fused optimizers of the torch kernel on float16 / bfloat16 tables (``module.half()``, Lightning's
"16-true"): the update runs in float32 and the optimizer state stays float32, as fbgemm and the
Triton kernel do, so the rows match a float64 reference to the table dtype's rounding.

Before: the state was converted with the weights and the update computed in float16, where a
small gradient's square and ``eps=1e-8`` are 0: one backward turned every touched row into ``-inf``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightrec.kernels.batched_embedding import BatchedEmbeddingBag
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec

ROWS, DIM = 10, 8
IDS = torch.tensor([1, 2, 2, 5, 1])
OFFSETS = torch.tensor([0, 2, 3, 5])  # 1 feature, 3 bags; ids 1 and 2 repeat
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _reference(kind: EmbOptimType, w0: torch.Tensor, cotangents: list[torch.Tensor], lr: float) -> torch.Tensor:
    """float64 rows after one step per cotangent: torch's Adagrad / Adam on a dense table (every
    step touches the same rows, so untouched rows see only zero gradients), or fbgemm's row-wise
    Adagrad written out (``m += mean(g^2); w -= lr * g / (sqrt(m) + eps)``)."""
    w = w0.double().clone().requires_grad_()
    opt: torch.optim.Optimizer | None = None
    if kind == EmbOptimType.ADAGRAD:
        opt = torch.optim.Adagrad([w], lr=lr, eps=1e-8)
    elif kind == EmbOptimType.ADAM:
        opt = torch.optim.Adam([w], lr=lr, eps=1e-8)
    momentum = torch.zeros(ROWS, dtype=torch.float64)
    for cot in cotangents:
        w.grad = None
        (F.embedding_bag(IDS, w, OFFSETS[:-1], mode="sum") * cot.double()).sum().backward()
        if opt is not None:
            opt.step()
            continue
        with torch.no_grad():
            g = w.grad
            assert g is not None
            momentum += g.square().mean(dim=1)
            w -= lr * g / (momentum.sqrt() + 1e-8).unsqueeze(1)
    return w.detach()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", [EmbOptimType.ADAGRAD, EmbOptimType.ROWWISE_ADAGRAD, EmbOptimType.ADAM])
def test_half_precision_tables_update_like_a_float64_reference(kind: EmbOptimType, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    lr = 0.05
    module = BatchedEmbeddingBag([(ROWS, DIM)], None, PoolingType.SUM, FusedOptimizerSpec(kind, learning_rate=lr),
                                 kernel_backend="torch").to(dtype)  # fmt: skip
    w0 = module.split_embedding_weights()[0].float().clone()
    gen = torch.Generator().manual_seed(1)
    # Gradients of ~1e-4: their squares (~1e-8) underflow in float16.
    cotangents = [torch.randn(3, DIM, generator=gen) * 1e-4 for _ in range(2)]
    for cot in cotangents:
        (module(IDS, OFFSETS).float() * cot).sum().backward()

    got = module.split_embedding_weights()[0]
    assert got.dtype == dtype
    assert torch.isfinite(got.float()).all()
    for state in module.fused_optimizer.state.values():
        for name, value in state.items():
            if name != "step":
                assert value.dtype == torch.float32, name
    want = _reference(kind, w0, cotangents, lr)
    torch.testing.assert_close(got.double(), want, atol=TOL[dtype], rtol=0)


def test_half_conversion_keeps_float32_state_and_float_restores_it() -> None:
    module = BatchedEmbeddingBag([(ROWS, DIM)], None, PoolingType.SUM,
                                 FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD), kernel_backend="torch")  # fmt: skip
    (module(IDS, OFFSETS) * 1e-3).sum().backward()
    before = next(iter(module.fused_optimizer.state.values()))["momentum1"].clone()
    module.half()
    after_half = next(iter(module.fused_optimizer.state.values()))["momentum1"]
    assert after_half.dtype == torch.float32
    assert torch.equal(after_half, before)  # not rounded through float16 on the way
    module.double()
    assert next(iter(module.fused_optimizer.state.values()))["momentum1"].dtype == torch.float64
