"""Gradients of learned per-id weights through the batched kernels (feature processors need them):
equal to torch.nn.functional.embedding_bag's, computed from the rows before the fused update."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.kernels import BatchedEmbeddingBag
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec
from tests.kernels.reference import LAYOUTS, pooled_reference, random_batch

BACKENDS = ["torch", pytest.param("fbgemm", marks=pytest.mark.skipif(not fbgemm_available(), reason="fbgemm absent"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["uniform", "mixed_shared"])
@pytest.mark.parametrize("fused", [True, False])
def test_per_sample_weight_gradient(backend: str, layout: str, fused: bool) -> None:
    tables, ftm = LAYOUTS[layout]
    pooling = PoolingType.MEAN if layout == "mixed_shared" else PoolingType.SUM
    spec = FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=0.5) if fused else None
    if backend == "fbgemm" and (spec is None or layout == "mixed_shared"):
        pytest.skip("fbgemm serves fused lookups of dims that are multiples of 4 without shared tables here")
    torch.manual_seed(0)
    module = BatchedEmbeddingBag(tables, ftm, pooling, optimizer=spec, backend=backend)
    ref_w = [w.detach().clone().requires_grad_(True) for w in module.split_embedding_weights()]
    b = random_batch(torch.Generator().manual_seed(1), [r for r, _ in tables], ftm, batch=4, weighted=True)
    weights = b.weights.clone().requires_grad_(True)
    ref_weights = b.weights.clone().requires_grad_(True)
    scale = torch.randn(4, sum(tables[t][1] for t in ftm))
    (module(b.indices, b.offsets, weights) * scale).sum().backward()
    ref = pooled_reference(ref_w, ftm, dataclasses.replace(b, weights=ref_weights), pooling.value.lower())
    (ref * scale).sum().backward()
    torch.testing.assert_close(weights.grad, ref_weights.grad, rtol=1e-5, atol=1e-6)
    if fused:  # the rows moved after the weight gradient was taken from them
        assert not torch.equal(module.split_embedding_weights()[0], ref_w[0].detach())
