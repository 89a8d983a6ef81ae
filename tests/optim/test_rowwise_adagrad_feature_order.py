"""Row-wise Adagrad on tables whose features read them out of table order (``feature_table_map``
``[1, 0]``): fbgemm 1.8's CPU kernel fails in backward there ("num of rows processed by adagrad: 0
does not match c_block size"), so ``fbgemm_supports`` refuses it and ``kernel_backend="auto"``
picks a kernel that trains it, matching fbgemm's documented row-wise Adagrad rule written out.

Before: ``"auto"`` chose fbgemm and the first ``loss.backward()`` raised.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightrec._fbgemm import fbgemm_available
from lightrec.kernels.batched_embedding import BatchedEmbeddingBag
from lightrec.kernels.fbgemm_backend import fbgemm_supports
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec

pytestmark = pytest.mark.skipif(not fbgemm_available(), reason="fbgemm absent")

SPEC = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.1, eps=1e-3)


@pytest.mark.parametrize("ftm", [[1, 0], [0, 2, 1]])
def test_fbgemm_refuses_cpu_rowwise_adagrad_with_features_out_of_table_order(ftm: list[int]) -> None:
    reason = fbgemm_supports(SPEC, torch.device("cpu"), [8] * len(ftm), PoolingType.SUM, ftm)
    assert reason is not None and "table order" in reason
    # In order it is still fbgemm's, and the other CPU optimizers take any order.
    assert fbgemm_supports(SPEC, torch.device("cpu"), [8] * len(ftm), PoolingType.SUM, sorted(ftm)) is None
    sgd = FusedOptimizerSpec(EmbOptimType.SGD)
    assert fbgemm_supports(sgd, torch.device("cpu"), [8] * len(ftm), PoolingType.SUM, ftm) is None


def test_auto_kernel_trains_rowwise_adagrad_with_features_out_of_table_order() -> None:
    rows, dim, batch = (10, 12), 8, 3
    module = BatchedEmbeddingBag([(r, dim) for r in rows], [1, 0], PoolingType.SUM, SPEC, kernel_backend="auto")
    w = [t.detach().double().clone() for t in module.split_embedding_weights()]
    momentum = [torch.zeros(r, dtype=torch.float64) for r in rows]
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        lengths = torch.randint(1, 4, (2 * batch,), generator=gen)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        ids = torch.randint(0, 5, (int(lengths.sum()),), generator=gen)  # duplicates are common
        cot = torch.randn(batch, 2 * dim, generator=gen, dtype=torch.float64)
        (module(ids, offsets).double() * cot).sum().backward()
        # Reference: dense autograd gradient per table, then m += mean(g^2); w -= lr g / (sqrt(m) + eps)
        # on the rows the batch touched.
        leaves = [t.clone().requires_grad_() for t in w]
        outs = []
        for f, t in enumerate([1, 0]):
            lo, hi = int(offsets[f * batch]), int(offsets[(f + 1) * batch])
            bags = offsets[f * batch : (f + 1) * batch + 1] - lo
            outs.append(F.embedding_bag(ids[lo:hi], leaves[t], bags, mode="sum", include_last_offset=True))
        (torch.cat(outs, dim=1) * cot).sum().backward()
        for t in range(2):
            g = leaves[t].grad
            assert g is not None
            touched = g.ne(0).any(dim=1)
            momentum[t][touched] += g[touched].square().mean(dim=1)
            step = SPEC.learning_rate / (momentum[t].sqrt() + SPEC.eps)
            w[t] = torch.where(touched.unsqueeze(1), w[t] - step.unsqueeze(1) * g, w[t])
    for got, want in zip(module.split_embedding_weights(), w, strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
