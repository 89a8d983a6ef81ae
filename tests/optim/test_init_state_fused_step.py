"""``init_state()`` before loading a checkpoint (the sharded-checkpoint pattern) keeps a fused
Adam's ``"step"`` state the kernel's own counter, so the loaded step count reaches the kernel and
the resumed run continues exactly; a dense optimizer's counters go back to their values before.

Before: ``init_state`` replaced every ``"step"`` entry with a new zero tensor, detaching the fused
optimizer's state from the kernel: the checkpoint's step was copied into the orphan and the kernel
restarted Adam's bias correction at t=1 (rows off by ~0.04 after one step).
"""

from __future__ import annotations

import copy

import pytest
import torch

from lightrec.kernels.batched_embedding import BatchedEmbeddingBag
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec

IDS, OFFSETS = torch.tensor([1, 2, 2, 4]), torch.tensor([0, 1, 3, 4])


def _module(kind: EmbOptimType, seed: int) -> BatchedEmbeddingBag:
    torch.manual_seed(seed)
    spec = FusedOptimizerSpec(kind, learning_rate=0.05)
    return BatchedEmbeddingBag([(10, 8), (6, 8)], [0, 1, 0], PoolingType.SUM, spec, kernel_backend="torch")


def _train(module: BatchedEmbeddingBag, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.cat([IDS, IDS % 6, IDS])
    offsets = torch.cat([OFFSETS[:-1], OFFSETS[:-1] + 4, OFFSETS + 8])
    for _ in range(steps):
        (module(ids, offsets) * torch.randn(3, 24, generator=gen)).sum().backward()


@pytest.mark.parametrize("kind", [EmbOptimType.ADAM, EmbOptimType.LAMB, EmbOptimType.PARTIAL_ROWWISE_ADAM])
def test_resume_after_init_state_continues_the_fused_step_count(kind: EmbOptimType) -> None:
    trained = _module(kind, 0)
    _train(trained, 3, 1)
    model_sd = copy.deepcopy(trained.state_dict())
    optim_sd = copy.deepcopy(trained.fused_optimizer.state_dict())

    resumed = _module(kind, 7)
    combined = CombinedOptimizer([resumed.fused_optimizer])
    combined.init_state()
    resumed.load_state_dict(model_sd)
    combined.load_state_dict(optim_sd)
    assert int(resumed.kernel.split_optimizer_states()[0]["step"]) == 3

    _train(trained, 2, 2)
    _train(resumed, 2, 2)
    for a, b in zip(trained.split_embedding_weights(), resumed.split_embedding_weights(), strict=True):
        assert torch.equal(a, b)


def test_init_state_leaves_a_trained_fused_step_count_alone() -> None:
    module = _module(EmbOptimType.ADAM, 0)
    _train(module, 2, 1)
    module.fused_optimizer.init_state()
    assert int(module.kernel.split_optimizer_states()[0]["step"]) == 2
    saved = module.fused_optimizer.state_dict()["state"]["weights.t0"]["step"]
    assert saved is module.kernel.split_optimizer_states()[0]["step"]


def test_init_state_puts_a_dense_step_count_back() -> None:
    lin = torch.nn.Linear(3, 2)
    opt = KeyedOptimizerWrapper(dict(lin.named_parameters()), lambda ps: torch.optim.Adam(ps, lr=0.1))
    opt.init_state()
    assert float(opt.state[lin.weight]["step"]) == 0.0  # created by init_state: a fresh count
    for _ in range(2):
        lin(torch.ones(1, 3)).sum().backward()
        opt.step()
    opt.init_state()
    assert float(opt.state[lin.weight]["step"]) == 2.0  # existing count kept
