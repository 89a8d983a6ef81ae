"""The kernel interface (``EmbeddingKernel``) that every backend implements.

* Each registered kernel satisfies the protocol; ``register_kernel`` guards its names.
* Row access, per backend and fused optimizer: ``read_rows`` equals the split views after training;
  ``write_rows`` then a lookup reads the written rows; ``reset_rows`` gives rows fresh weights and a
  zero optimizer state, so the next step on them equals that of rows freshly reset in another table
  with another history (what a managed-collision eviction needs), while the other rows keep theirs.
* The prefetch hook: a kernel registered under a new name that prefetches receives, from
  ``SparseDistPipeline.prefetch``, exactly the ids its next lookup reads (2 gloo ranks, sharded).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.kernels import (
    KERNELS,
    BatchedEmbeddingBag,
    EmbeddingKernel,
    EmbOptimType,
    FusedOptimizerSpec,
    RowState,
    fbgemm_supports,
    register_kernel,
)
from lightrec.kernels.torch_backend import TorchBatchedLookup
from lightrec.modules.embedding_configs import PoolingType
from tests.multiprocess import run_ranks
from tests.triton_support import DEVICE, requires_triton

KERNEL_NAMES = [
    "torch",
    pytest.param("fbgemm", marks=pytest.mark.skipif(not fbgemm_available(), reason="fbgemm absent")),
    pytest.param("triton", marks=requires_triton),
]
OPTIMIZERS = [EmbOptimType.SGD, EmbOptimType.ADAGRAD, EmbOptimType.ROWWISE_ADAGRAD, EmbOptimType.ADAM]
TABLES = [(12, 4), (9, 8)]
FTM = [0, 1]  # fbgemm's CPU Adagrad kernels are exact only for tables read by one feature


def _device(kernel: str) -> torch.device:
    return DEVICE if kernel == "triton" else torch.device("cpu")


def _module(kernel: str, kind: EmbOptimType, seed: int = 0) -> BatchedEmbeddingBag:
    spec = FusedOptimizerSpec(kind, learning_rate=0.1, eps=1e-6)
    device = _device(kernel)
    if kernel == "fbgemm":
        reason = fbgemm_supports(spec, device, [d for _, d in TABLES], PoolingType.SUM, FTM)
        if reason:
            pytest.skip(reason)
    torch.manual_seed(seed)
    return BatchedEmbeddingBag(TABLES, FTM, optimizer=spec, kernel_backend=kernel, device=device)


def _step(module: BatchedEmbeddingBag, ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """One lookup of one bag per feature (``ids[f]``) and a backward of its sum of squares."""
    device = module.weights[module.table_names[0]].device
    indices = torch.tensor([i for bag in ids for i in bag], device=device)
    offsets = torch.tensor([0, *torch.tensor([len(b) for b in ids]).cumsum(0).tolist()], device=device)
    out = module(indices, offsets)
    out.square().sum().backward()
    return out.detach()


def test_registered_kernels_satisfy_the_protocol() -> None:
    assert list(KERNELS)[-1] == "torch" and {"fbgemm", "torch", "triton"} <= set(KERNELS)
    module = BatchedEmbeddingBag([(4, 4)], kernel_backend="torch")
    assert isinstance(module.kernel, EmbeddingKernel)
    for name, kernel in KERNELS.items():
        assert kernel.name == name
        assert callable(kernel.supports) and isinstance(kernel.checks_ids_on_device, bool)
    with pytest.raises(ValueError, match="kernel name 'torch' is taken"):

        class Other(TorchBatchedLookup):
            name = "torch"

        register_kernel(Other)


@pytest.mark.parametrize("kind", OPTIMIZERS, ids=lambda k: k.name)
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_read_write_and_reset_rows(kernel: str, kind: EmbOptimType) -> None:
    module = _module(kernel, kind)
    for _ in range(2):
        _step(module, [[1, 2, 3, 5], [4]])
    backend = module.kernel
    rows = torch.tensor([2, 5])
    got = backend.read_rows(0, rows)
    weights = backend.split_embedding_weights()[0]
    assert torch.equal(got.weights, weights[rows.to(weights.device)])
    states = backend.split_optimizer_states()[0]
    assert set(got.states) == {k for k, v in states.items() if v.dim() >= 1}  # Adam's step is not row state
    for name, value in got.states.items():
        assert torch.equal(value, states[name][rows.to(value.device)]) and value.abs().sum() > 0, name

    # write_rows: a lookup reads what was written
    written = RowState(torch.full((2, 4), 0.25), {k: torch.full_like(v, 0.5) for k, v in got.states.items()})
    backend.write_rows(0, rows, written)
    with torch.no_grad():
        out = module(torch.tensor([2, 5, 1], device=weights.device), torch.tensor([0, 2, 3], device=weights.device))
    assert torch.equal(out[0, :4].cpu(), torch.full((4,), 0.5))  # bag {2, 5}, SUM of two written rows

    # reset_rows: fresh weights, zero state; the next step on those rows equals a fresh table's first
    fresh_weights = torch.randn(2, 4, generator=torch.Generator().manual_seed(3))
    module.reset_rows(module.table_names[0], rows, fresh_weights.to(weights.device))
    untouched_before = backend.read_rows(0, torch.tensor([1, 3]))
    reference = _module(kernel, kind, seed=1)  # other values, the same steps (Adam's shared step count)
    for _ in range(2):
        _step(reference, [[1, 2, 3, 5], [4]])
    reference.kernel.reset_rows(0, rows, fresh_weights.to(weights.device))
    for m in (module, reference):
        _step(m, [[5, 2], [3]])
    after, expected = backend.read_rows(0, rows), reference.kernel.read_rows(0, rows)
    torch.testing.assert_close(after.weights, expected.weights, rtol=0, atol=0)
    for name in after.states:
        torch.testing.assert_close(after.states[name], expected.states[name], rtol=0, atol=0)
    untouched_after = backend.read_rows(0, torch.tensor([1, 3]))
    assert torch.equal(untouched_after.weights, untouched_before.weights)  # rows the step did not read
    for name in untouched_after.states:
        assert torch.equal(untouched_after.states[name], untouched_before.states[name])


def test_row_access_errors() -> None:
    module = _module("torch", EmbOptimType.ROWWISE_ADAGRAD)
    with pytest.raises(KeyError, match="no table 'nope'"):
        module.reset_rows("nope", torch.tensor([0]), torch.zeros(1, 4))
    with pytest.raises(KeyError, match="has no row state"):
        module.kernel.write_rows(0, torch.tensor([0]), RowState(torch.zeros(1, 4), {"momentum2": torch.zeros(1)}))


# ------------------------------------------------------------------------------- the prefetch hook
class RecordingKernel(TorchBatchedLookup):
    """The torch kernel, registered as "recording", that wants and records the ids of later lookups."""

    name = "recording"
    prefetches = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.prefetched: list[torch.Tensor] = []
        self.looked_up: list[torch.Tensor] = []

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        self.prefetched.append(indices.clone())

    def lookup(self, batch: Any, weight_inputs: Any, lr: Any) -> torch.Tensor:
        self.looked_up.append(batch.indices.clone())
        return super().lookup(batch, weight_inputs, lr)


def _prefetch_body(rank: int, world_size: int) -> dict[str, Any]:
    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv
    from lightrec.distributed.train_pipeline.sparse_dist_pipeline import SparseDistPipeline
    from tests.distributed.test_dmp import _batch, _mixed_plan, _slice, _tables

    register_kernel(RecordingKernel)
    plan = _mixed_plan(world_size).plan["sparse_arch.embedding_bag_collection"]
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": "sgd", "learning_rate": 0.1},
                                            kernel_backend="recording")  # fmt: skip
    sharded = sharder.shard(_tables("cpu"), plan, ShardingEnv.from_process_group(None))
    kernels = [m.kernel for m in sharded.modules() if isinstance(m, BatchedEmbeddingBag)]
    assert kernels and all(isinstance(k, RecordingKernel) for k in kernels) and sharded.lookups[0].prefetches
    pipeline = SparseDistPipeline([sharded])
    batches = [_slice(_batch(step, 4 * world_size)[1], rank * 4, 4) for step in range(2)]
    sharded(batches[0]).wait().values().sum().backward()
    pipeline.start(batches[1])
    pipeline.progress()
    pipeline.prefetch()  # before the forward of batch 1: each kernel gets the ids it will read
    assert all(len(k.prefetched) == 1 and len(k.looked_up) == 1 for k in kernels)
    sharded(batches[1]).wait().values().sum().backward()
    return {"equal": [torch.equal(k.prefetched[0], k.looked_up[1]) for k in kernels]}


def test_the_prefetch_hook_gets_the_next_lookups_ids() -> None:
    for r in run_ranks(_prefetch_body, 2, timeout=120):
        assert r["equal"] and all(r["equal"]), r
