"""A training step of 0 samples advances a fused Adam's step counter, as fbgemm's ``iter`` does.

A rank whose batch holds no samples runs the lookup's empty path (no kernel call). Its backward used
to leave the counter alone, so after it that rank's bias correction (``1 - beta**t``) lagged the
other ranks' by one for the rest of the run, and a checkpoint saved a different ``step`` per rank.
Reference: fbgemm's Adam over the same batches, ``t`` counting every backward, rows without ids
untouched.
"""

from __future__ import annotations

import pytest
import torch

from lightrec.kernels import TieringConfig
from lightrec.kernels.batched_embedding import BatchedEmbeddingBag
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim import EmbOptimType, FusedOptimizerSpec

LR, B1, B2, EPS = 0.1, 0.9, 0.999, 1e-8
TABLES = [(6, 4), (5, 4)]
# per step, per table, the bags of the batch; step 2 is a batch of 0 samples (offsets [0])
STEPS: list[list[list[list[int]]]] = [
    [[[1], [2]], [[0], [4]]],
    [[], []],
    [[[1, 1], [3]], [[0], [4]]],
    [[], []],
    [[[2], [5]], [[1], [1]]],
]

BACKENDS = ["torch", "tiered"]  # (fbgemm has no CPU Adam; Triton: tests/kernels/test_triton_edge_cases.py)


def _adam_reference(w: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor, t: int, ids: list[int]) -> None:
    """fbgemm's Adam step ``t`` on ``w`` (float64) for a SUM loss: looked-up rows only."""
    for r in sorted(set(ids)):
        g = torch.full_like(w[r], float(ids.count(r)))
        m1[r] = B1 * m1[r] + (1 - B1) * g
        m2[r] = B2 * m2[r] + (1 - B2) * g * g
        w[r] -= LR * (m1[r] / (1 - B1**t)) / ((m2[r] / (1 - B2**t)).sqrt() + EPS)


def check_empty_batches_count(module: BatchedEmbeddingBag, backend: str, device: str = "cpu") -> None:
    """Train ``module`` (fused Adam with LR, B1, B2, EPS over TABLES) through STEPS against the reference."""
    ref_w = [w.detach().double().cpu().clone() for w in module.split_embedding_weights()]
    ref_m1 = [torch.zeros_like(w) for w in ref_w]
    ref_m2 = [torch.zeros_like(w) for w in ref_w]
    for t, per_table in enumerate(STEPS, start=1):
        bags = [bag for table_bags in per_table for bag in table_bags]
        indices = torch.tensor([i for bag in bags for i in bag], dtype=torch.long, device=device)
        lengths = [len(b) for b in bags]
        offsets = torch.tensor([0, *[sum(lengths[: k + 1]) for k in range(len(bags))]], dtype=torch.long, device=device)
        out = module(indices, offsets)
        assert out.shape == (len(per_table[0]), 8)
        out.sum().backward()
        for k, table_bags in enumerate(per_table):
            _adam_reference(ref_w[k], ref_m1[k], ref_m2[k], t, [i for bag in table_bags for i in bag])
        state = module.fused_optimizer.state_dict()["state"]
        for k, w in enumerate(module.split_embedding_weights()):
            assert int(state[f"weights.t{k}"]["step"]) == t, (backend, t)
            torch.testing.assert_close(w.detach().double().cpu(), ref_w[k], atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_of_no_samples_counts_as_a_step(backend: str, tmp_path) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    spec = FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=LR, beta1=B1, beta2=B2, eps=EPS)
    tiering = TieringConfig("ssd", cache_rows=4, ssd_storage_directory=str(tmp_path)) if backend == "tiered" else None
    module = BatchedEmbeddingBag(TABLES, [0, 1], PoolingType.SUM, optimizer=spec, kernel_backend="torch", tiering=tiering)
    assert module.backend_name == backend
    check_empty_batches_count(module, backend)


def test_an_evaluation_forward_of_no_samples_counts_nothing() -> None:
    spec = FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=LR)
    module = BatchedEmbeddingBag(TABLES, [0, 1], PoolingType.SUM, optimizer=spec, kernel_backend="torch")
    with torch.no_grad():
        module(torch.empty(0, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    assert int(module.fused_optimizer.state_dict()["state"]["weights.t0"]["step"]) == 0
