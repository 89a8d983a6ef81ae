"""CombinedOptimizer's param_groups, LR schedulers over it, and zero_grad defaults (review).

torchrec's ``CombinedOptimizer.param_groups`` is the concatenation of its optimizers' groups, built
on each access; lightrec's was a list fixed at construction, so a child that replaced its groups
(torchrec's ``OptimizerWrapper`` re-points them after a load; torch's ``Optimizer.load_state_dict``
builds new group dicts) fell out of reach of a scheduler on the combined optimizer.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from lightrec.kernels.fused_collection import FusedEmbeddingBagCollection
from lightrec.modules import EmbeddingBagConfig
from lightrec.optim import (
    CombinedOptimizer,
    EmbOptimType,
    FusedOptimizerSpec,
    GradientClippingOptimizer,
    KeyedOptimizer,
    KeyedOptimizerWrapper,
    OptimizerWrapper,
    WarmupOptimizer,
    WarmupPolicy,
    WarmupStage,
)
from lightrec.sparse import KeyedJaggedTensor


class _TorchLoadingWrapper(KeyedOptimizerWrapper):
    """Loads a torch-format state dict through torch's own ``Optimizer.load_state_dict`` (new
    group dicts) and points its groups at them, as torchrec's ``OptimizerWrapper`` does."""

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)
        self.param_groups = self._optimizer.param_groups


def _child(lr: float = 1.0) -> tuple[_TorchLoadingWrapper, torch.nn.Parameter]:
    p = torch.nn.Parameter(torch.zeros(3))
    return _TorchLoadingWrapper({"p": p}, lambda ps: torch.optim.SGD(ps, lr=lr)), p


def test_param_groups_follow_a_child_that_replaced_its_groups() -> None:
    child, p = _child()
    other = KeyedOptimizerWrapper(
        {"q": torch.nn.Parameter(torch.zeros(2))}, lambda ps: torch.optim.SGD(ps, lr=2.0)
    )
    combined = CombinedOptimizer([("a", child), ("b", other)])
    scheduler = torch.optim.lr_scheduler.StepLR(combined, step_size=1, gamma=0.5)
    child.load_state_dict(child._optimizer.state_dict())  # the child's group dicts are new objects now
    assert [g is h for g, h in zip(combined.param_groups, [*child.param_groups, *other.param_groups])] == [
        True
    ] * 2
    combined.step()
    scheduler.step()
    assert child._optimizer.param_groups[0]["lr"] == pytest.approx(0.5)  # the lr SGD really uses
    assert other.param_groups[0]["lr"] == pytest.approx(1.0)
    p.grad = torch.ones(3)
    combined.step()
    torch.testing.assert_close(p.detach(), torch.full((3,), -0.5))


@pytest.mark.parametrize("wrap", ["warmup", "clipping"])
def test_a_wrapper_over_the_combined_optimizer_follows_its_groups(wrap: str) -> None:
    child, _ = _child()
    combined = CombinedOptimizer([("a", child)])
    stage = WarmupStage(policy=WarmupPolicy.CONSTANT, max_iters=10, value=0.25)
    wrapper: OptimizerWrapper = (
        WarmupOptimizer(combined, [stage], lr=1.0)
        if wrap == "warmup"
        else GradientClippingOptimizer(combined)
    )
    child.load_state_dict(child._optimizer.state_dict())
    assert wrapper.param_groups[0] is child._optimizer.param_groups[0]
    for group in wrapper.param_groups:
        group["lr"] = 0.125
    wrapper.step()  # the warm-up sets its own lr (0.25) in every group at each step
    assert child._optimizer.param_groups[0]["lr"] == pytest.approx(0.25 if wrap == "warmup" else 0.125)


def test_assigning_the_combined_param_groups_is_refused() -> None:
    child, _ = _child()
    combined = CombinedOptimizer([("a", child)])
    with pytest.raises(TypeError, match="CombinedOptimizer.param_groups.*group\\['lr'\\]"):
        combined.param_groups = [{"params": [], "lr": 3.0}]
    assert child.param_groups[0]["lr"] == 1.0
    combined.param_groups = list(child.param_groups)  # its own groups: nothing to change
    combined.param_groups[0]["lr"] = 0.5  # entries of a group are the child's
    assert child._optimizer.param_groups[0]["lr"] == 0.5


def test_step_lr_over_combined_drives_the_fused_and_the_dense_learning_rate() -> None:
    torch.manual_seed(0)
    ebc = FusedEmbeddingBagCollection(
        [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=6, feature_names=["f"])],
        fused_params=FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=1.0),
        kernel_backend="torch",
    )
    linear = torch.nn.Linear(4, 1)
    dense = KeyedOptimizerWrapper(dict(linear.named_parameters()), lambda ps: torch.optim.SGD(ps, lr=1.0))
    combined = CombinedOptimizer([("ebc", ebc.fused_optimizer), ("dense", dense)])
    scheduler = torch.optim.lr_scheduler.StepLR(combined, step_size=1, gamma=0.5)
    kjt = KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([1], dtype=torch.long), torch.tensor([1]))
    weight = ebc.embedding_bags["t"].weight
    for lr in (1.0, 0.5, 0.25):
        row, bias = weight.detach()[1].clone(), linear.bias.detach().clone()
        (ebc(kjt).values().sum() + linear(torch.zeros(1, 4)).sum()).backward()  # gradient 1 on both
        combined.step()
        combined.zero_grad()
        torch.testing.assert_close(row - weight.detach()[1], torch.full((4,), lr))  # updated in backward
        torch.testing.assert_close(bias - linear.bias.detach(), torch.tensor([lr]))
        scheduler.step()


def test_zero_grad_defaults_to_set_to_none_as_torch() -> None:
    for cls in (KeyedOptimizer, KeyedOptimizerWrapper, OptimizerWrapper, CombinedOptimizer):
        assert inspect.signature(cls.zero_grad).parameters["set_to_none"].default is True, cls
    a = torch.nn.Parameter(torch.ones(2))
    b = torch.nn.Parameter(torch.ones(2))
    combined = CombinedOptimizer([
        ("a", KeyedOptimizerWrapper({"w": a}, lambda ps: torch.optim.SGD(ps, lr=0.1))),
        ("b", GradientClippingOptimizer(KeyedOptimizerWrapper({"w": b}, lambda ps: torch.optim.Adam(ps)))),
    ])  # fmt: skip
    a.grad, b.grad = torch.ones(2), torch.ones(2)
    combined.zero_grad(set_to_none=False)  # passed through every level (torchrec's wrapper drops it)
    assert a.grad is not None and b.grad is not None
    assert not a.grad.any() and not b.grad.any()
    combined.zero_grad()
    assert a.grad is None and b.grad is None
