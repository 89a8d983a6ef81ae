"""Tiered tables on CUDA: an HBM cache over host memory (and over SSD) against the in-memory CUDA table.

Marked ``gpu`` (``-m gpu``): skipped without a CUDA device. What they check where one is lent:

* lightrec's own cache kernel (``kernel_backend="torch"``) on CUDA, backing ``"host"`` (pinned host
  memory, copies on a side stream) and ``"ssd"``: with a tiny cache, 30 steps of every fused
  optimizer, with the next batch prefetched during each backward, give the same outputs, weights
  and optimizer state as the same kernel fully in HBM (fp32 on one device: bit-identical is
  expected, as on CPU; a tolerance would hide a lost write-back);
* fbgemm's ``MANAGED_CACHING`` (fbgemm's CUDA build) for ``fused_uvm_caching``: the same training
  close to the in-memory fbgemm table (fbgemm's cache kernels order their updates differently,
  hence a tolerance), and the rows read back from it equal.
"""

from __future__ import annotations

import pytest
import torch

from lightrec._fbgemm import fbgemm_serves_cuda
from lightrec.kernels import BatchedEmbeddingBag, TieringConfig
from lightrec.modules import PoolingType
from tests.kernels.tiered.test_kernel import CACHE_ROWS, FTM, SPECS, TABLES, _assert_same_tables, _batches

pytestmark = pytest.mark.gpu


def _to(batch: tuple[torch.Tensor, ...], device: str) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(device) for t in batch)


@pytest.mark.parametrize("backing", ["host", "ssd"])
@pytest.mark.parametrize("optimizer", list(SPECS))
def test_hbm_cache_equals_the_table_in_hbm(optimizer: str, backing: str, tmp_path) -> None:
    tiering = TieringConfig(backing, cache_rows=CACHE_ROWS, ssd_storage_directory=str(tmp_path))
    tiered = BatchedEmbeddingBag(TABLES, FTM, PoolingType.SUM, SPECS[optimizer], kernel_backend="torch",
                                 device="cuda", tiering=tiering)  # fmt: skip
    memory = BatchedEmbeddingBag(TABLES, FTM, PoolingType.SUM, SPECS[optimizer], kernel_backend="torch", device="cuda")
    memory.load_state_dict(tiered.state_dict())
    assert tiered.kernel.device.type == "cuda" and tiered.kernel.store.kind == backing
    batches = [_to(b, "cuda") for b in _batches(31, [r for r, _ in TABLES], FTM, batch=24)]
    for step in range(30):
        out, ref = tiered(*batches[step]), memory(*batches[step])
        assert torch.equal(out, ref), step
        tiered.prefetch(*batches[step + 1][:2])  # copies on the side stream during this backward
        out.square().sum().backward()
        ref.square().sum().backward()
    torch.cuda.synchronize()
    _assert_same_tables(tiered, memory)
    stats = tiered.kernel.stats()
    assert stats.rows_written_back > 0 and stats.rows_fetched > CACHE_ROWS


@pytest.mark.skipif(not fbgemm_serves_cuda(), reason="fbgemm's CUDA build absent")
def test_fbgemm_managed_caching_trains_like_the_table_in_hbm() -> None:
    spec = SPECS["rowwise_adagrad"]
    tiering = TieringConfig("host", cache_load_factor=0.1, min_cache_rows=1)
    tiered = BatchedEmbeddingBag(TABLES, FTM, PoolingType.SUM, spec, kernel_backend="fbgemm", device="cuda",
                                 tiering=tiering)  # fmt: skip
    memory = BatchedEmbeddingBag(TABLES, FTM, PoolingType.SUM, spec, kernel_backend="fbgemm", device="cuda")
    assert tiered.backend_name == "fbgemm_managed_caching"
    memory.load_state_dict(tiered.state_dict())
    batches = [_to(b, "cuda") for b in _batches(31, [r for r, _ in TABLES], FTM, batch=24)]
    for step in range(30):
        out, ref = tiered(*batches[step]), memory(*batches[step])
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        tiered.prefetch(*batches[step + 1][:2])
        out.square().sum().backward()
        ref.square().sum().backward()
    for a, b in zip(tiered.split_embedding_weights(), memory.split_embedding_weights(), strict=True):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-4, atol=1e-5)
