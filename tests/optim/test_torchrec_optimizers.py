"""torchrec's LAMB / PartialRowWiseLAMB / PartialRowWiseAdam / LarsSGD (dense and fused),
GradientClippingOptimizer and WarmupOptimizer, checked against rules written out in the tests."""

from __future__ import annotations

import copy

import pytest
import torch

from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from lightrec.modules.fused_embedding_modules import fuse_embedding_optimizer
from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper
from lightrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from lightrec.optim.clipping import GradientClipping, GradientClippingOptimizer
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec, optimizer_class_to_spec
from lightrec.optim.optimizers import LAMB, LarsSGD, PartialRowWiseAdam, PartialRowWiseLAMB
from lightrec.optim.warmup import WarmupOptimizer, WarmupPolicy, WarmupStage
from tests.kernels.reference import ReferenceOptimizer
from tests.multiprocess import run_ranks

DENSE = [
    (LAMB, "lamb", {"lr": 0.05, "weight_decay": 0.01}),
    (PartialRowWiseLAMB, "partial_rowwise_lamb", {"lr": 0.05, "weight_decay": 0.01}),
    (PartialRowWiseAdam, "partial_rowwise_adam", {"lr": 0.05, "weight_decay": 0.01}),
    (LarsSGD, "lars_sgd", {"lr": 0.5, "eta": 0.01, "momentum": 0.8, "weight_decay": 0.01}),
]


@pytest.mark.parametrize(("cls", "kind", "kwargs"), DENSE, ids=[d[1] for d in DENSE])
def test_dense_optimizer_follows_the_row_rule(cls: type, kind: str, kwargs: dict) -> None:
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(5, 3))
    bias = torch.nn.Parameter(torch.randn(4))  # 1-D: one row
    ref_w, ref_b = weight.detach().clone().requires_grad_(True), bias.detach().clone().view(1, 4).requires_grad_(True)
    opt = cls([weight, bias], **kwargs)
    ref = ReferenceOptimizer(kind, [ref_w, ref_b], lr=kwargs["lr"], eps=1e-8, wd=kwargs["weight_decay"],
                             wd_mode="none", eta=kwargs.get("eta", 0.001), momentum=kwargs.get("momentum", 0.9))  # fmt: skip
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        gw, gb = torch.randn(5, 3, generator=g), torch.randn(4, generator=g)
        weight.grad, bias.grad = gw.clone(), gb.clone()
        opt.step()
        ref_w.grad, ref_b.grad = gw.clone(), gb.view(1, 4).clone()
        ref.step([ref_w, ref_b], [torch.arange(5), torch.arange(1)])
    torch.testing.assert_close(weight.detach(), ref_w.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bias.detach(), ref_b.detach().view(4), rtol=1e-5, atol=1e-6)
    assert int(opt.state[weight]["step"]) == 3


def test_zero_row_moves_under_the_trust_ratio_guard() -> None:
    weight = torch.nn.Parameter(torch.zeros(2, 4))
    weight.grad = torch.ones(2, 4)
    LAMB([weight], lr=0.1).step()
    assert torch.all(weight != 0)  # fbgemm's ratio ||w|| / ||r|| = 0 would leave it at zero forever


@pytest.mark.parametrize(
    ("cls", "kwargs", "expected"),
    [
        (LAMB, {"lr": 0.2, "betas": (0.8, 0.99), "weight_decay": 0.1},
         FusedOptimizerSpec(EmbOptimType.LAMB, learning_rate=0.2, beta1=0.8, beta2=0.99, weight_decay=0.1)),
        (PartialRowWiseAdam, {"lr": 0.2, "eps": 1e-6},
         FusedOptimizerSpec(EmbOptimType.PARTIAL_ROWWISE_ADAM, learning_rate=0.2, eps=1e-6)),
        (LarsSGD, {"lr": 0.2, "eta": 0.01, "momentum": 0.5},
         FusedOptimizerSpec(EmbOptimType.LARS_SGD, learning_rate=0.2, eta=0.01, momentum=0.5)),
    ],
)  # fmt: skip
def test_classes_map_to_fused_specs(cls: type, kwargs: dict, expected: FusedOptimizerSpec) -> None:
    assert optimizer_class_to_spec(cls, kwargs) == expected
    assert EmbOptimType.coerce("PARTIAL_ROWWISE_LAMB") == EmbOptimType.PARTIAL_ROWWISE_LAMB


def _ebc() -> EmbeddingBagCollection:
    torch.manual_seed(3)
    return EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=4, feature_names=["f"])])


@pytest.mark.parametrize(("cls", "kind", "kwargs"), DENSE, ids=[d[1] for d in DENSE])
def test_fused_table_trains_like_the_marked_unfused_one(cls: type, kind: str, kwargs: dict) -> None:
    """Every row is read every step, so the dense rule (all rows) and the fused one (touched rows) agree."""
    plain, fused = _ebc(), _ebc()
    apply_optimizer_in_backward(cls, plain.parameters(), kwargs)
    holder = torch.nn.Module()
    holder.ebc = fused
    fuse_embedding_optimizer(holder, cls, kwargs, "cpu")
    for step in range(3):
        kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([0, 1, 2, 3, step % 4]), lengths=torch.tensor([2, 3]))
        scale = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
        (plain(kjt).values() * scale).sum().backward()
        (holder.ebc(kjt).values() * scale).sum().backward()
    torch.testing.assert_close(holder.ebc.state_dict()["embedding_bags.t.weight"], plain.embedding_bags["t"].weight.detach(),
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def _keyed(params: list[torch.nn.Parameter]) -> KeyedOptimizerWrapper:
    return KeyedOptimizerWrapper({f"p{i}": p for i, p in enumerate(params)}, lambda ps: torch.optim.SGD(ps, lr=1.0))


@pytest.mark.parametrize("norm_type", [2.0, 1.0, "inf"])
def test_gradient_clipping_norm_matches_torch(norm_type: float | str) -> None:
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    ref = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    grads = [torch.tensor([3.0, -4.0, 1.0]), torch.tensor([[2.0, 0.5], [-1.0, 6.0]])]
    for p, r, g in zip(params, ref, grads):
        p.grad, r.grad = g.clone(), g.clone()
    opt = GradientClippingOptimizer(_keyed(params), GradientClipping.NORM, max_gradient=2.0, norm_type=norm_type)
    opt.step()
    torch.nn.utils.clip_grad_norm_(ref, max_norm=2.0, norm_type=float(norm_type))
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.detach(), -r.grad, rtol=1e-5, atol=1e-6)  # SGD(lr=1) from zeros


def test_gradient_clipping_value_and_errors() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([5.0, -0.5, -7.0])
    GradientClippingOptimizer(_keyed([p]), GradientClipping.VALUE, max_gradient=1.0).step()
    assert p.detach().tolist() == [-1.0, 0.5, 1.0]
    with pytest.raises(ValueError, match="max_gradient must be > 0"):
        GradientClippingOptimizer(_keyed([p]), GradientClipping.NORM, max_gradient=0.0)


def _global_clip_body(rank: int, world_size: int) -> list[float]:
    import torch.distributed as dist

    shard = torch.nn.Parameter(torch.zeros(2))
    shard.grad = torch.tensor([3.0, 4.0]) if rank == 0 else torch.tensor([0.0, 12.0])  # full norm 13
    opt = GradientClippingOptimizer(_keyed([shard]), GradientClipping.NORM, max_gradient=1.3,
                                    enable_global_grad_clip=True, param_to_pgs={shard: [dist.group.WORLD]})  # fmt: skip
    opt.step()
    return shard.detach().tolist()


def test_global_gradient_clipping_on_two_ranks() -> None:
    results = run_ranks(_global_clip_body, world_size=2, timeout=120)
    scale = 1.3 / (13.0 + 1e-6)
    assert results[0] == pytest.approx([-3.0 * scale, -4.0 * scale]) and results[1] == pytest.approx([0.0, -12.0 * scale])


def test_warmup_schedule_resume_and_fused_lr() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    stages = [WarmupStage(WarmupPolicy.LINEAR, max_iters=4, value=0.2), WarmupStage(WarmupPolicy.STEP, max_iters=8,
                                                                                    value=0.5, decay_iters=2)]  # fmt: skip
    fused = FusedOptimizerSpec(EmbOptimType.SGD)  # a fused table's optimizer shares the combined groups
    holder = torch.nn.Module()
    holder.ebc = _ebc()
    fuse_embedding_optimizer(holder, torch.optim.SGD, {"lr": fused.learning_rate}, "cpu")
    opt = WarmupOptimizer(CombinedOptimizer([("dense", _keyed([p])), ("emb", holder.ebc.fused_optimizer)]), stages, lr=1.0)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        assert holder.ebc.fused_optimizer.param_groups[0]["lr"] == lrs[-1]
        p.grad = torch.zeros(1)
        opt.step()
    linear = [0.2 + 0.8 * i / 4 for i in range(5)]
    step = [0.5 ** (i // 2) for i in range(5, 9)]
    assert lrs == pytest.approx(linear + step + [1.0])
    saved = copy.deepcopy(opt.state_dict())
    assert saved["state"]["__warmup"]["warmup"].tolist() == [10, 2]
    fresh = WarmupOptimizer(CombinedOptimizer([("dense", _keyed([p])), ("emb", holder.ebc.fused_optimizer)]), stages)
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == 1.0 * 0.1  # lr=0.1 default scales the restored position (last stage: 1)
    with pytest.raises(ValueError, match="must exceed the previous stage's 4"):
        WarmupOptimizer(_keyed([p]), [WarmupStage(max_iters=4), WarmupStage(max_iters=4)])
