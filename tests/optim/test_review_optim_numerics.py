"""Review of lightrec.optim against torchrec's / fbgemm's / torch's semantics, step by step.

Every reference below is written out here from the published formulas (not from lightrec's code).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from lightrec.optim import (
    LAMB,
    CombinedOptimizer,
    GradientClipping,
    GradientClippingOptimizer,
    KeyedOptimizerWrapper,
    LarsSGD,
    PartialRowWiseAdam,
    PartialRowWiseLAMB,
    RowWiseAdagrad,
    WarmupOptimizer,
    WarmupPolicy,
    WarmupStage,
    apply_optimizer_in_backward,
    in_backward_optimizer_filter,
)

# ---------------------------------------------------------------- KeyedOptimizer / CombinedOptimizer


def _param(seed: int, shape: tuple[int, ...] = (3, 4), dtype: torch.dtype = torch.float32) -> torch.nn.Parameter:
    gen = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(shape, generator=gen, dtype=dtype))


_Factory = Callable[[list[torch.Tensor]], torch.optim.Optimizer]


@pytest.mark.parametrize(
    "factory",
    [lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), lambda ps: torch.optim.Adam(ps, lr=0.1),
     lambda ps: torch.optim.Adagrad(ps, lr=0.1)],
    ids=["sgd_momentum", "adam", "adagrad"],
)  # fmt: skip
def test_init_state_with_gradients_already_present_then_step_matches_fresh_optimizer(factory: _Factory) -> None:
    p_init, p_fresh = _param(0), _param(0)
    grad = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with_init = KeyedOptimizerWrapper({"w": p_init}, factory)
    fresh = KeyedOptimizerWrapper({"w": p_fresh}, factory)
    p_init.grad, p_fresh.grad = grad.clone(), grad.clone()
    with_init.init_state()
    assert torch.equal(p_init.grad, grad)  # the caller's gradient is put back
    with_init.step()
    fresh.step()
    torch.testing.assert_close(p_init, p_fresh, rtol=0, atol=0)
    for key, value in fresh.state_dict()["state"]["w"].items():
        torch.testing.assert_close(with_init.state_dict()["state"]["w"][key], value)


def test_load_state_dict_into_reordered_params_continues_like_the_original() -> None:
    a, b = _param(0), _param(1, (5,))
    grads = [(torch.randn(3, 4), torch.randn(5)) for _ in range(6)]
    opt = KeyedOptimizerWrapper({"a": a, "b": b}, lambda ps: torch.optim.Adam(ps, lr=0.05))
    for ga, gb in grads[:3]:
        a.grad, b.grad = ga.clone(), gb.clone()
        opt.step()
    sd = opt.state_dict()
    a2 = torch.nn.Parameter(a.detach().clone())
    b2 = torch.nn.Parameter(b.detach().clone())
    opt2 = KeyedOptimizerWrapper({"b": b2, "a": a2}, lambda ps: torch.optim.Adam(ps, lr=0.01))
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == 0.05
    for ga, gb in grads[3:]:
        a.grad, b.grad, a2.grad, b2.grad = ga.clone(), gb.clone(), ga.clone(), gb.clone()
        opt.step()
        opt2.step()
    torch.testing.assert_close(a2, a, rtol=0, atol=0)
    torch.testing.assert_close(b2, b, rtol=0, atol=0)


def test_combined_optimizer_lr_scheduler_drives_every_child_and_state_dict_prefixes_names() -> None:
    a, b = _param(0), _param(1)
    c = CombinedOptimizer([
        ("dense", KeyedOptimizerWrapper({"w": a}, lambda ps: torch.optim.SGD(ps, lr=1.0))),
        ("sparse", KeyedOptimizerWrapper({"w": b}, lambda ps: torch.optim.Adagrad(ps, lr=0.5))),
    ])  # fmt: skip
    sched = torch.optim.lr_scheduler.LambdaLR(c, lambda i: 0.5**i)
    for step in range(3):
        a.grad, b.grad = torch.ones(3, 4), torch.ones(3, 4)
        a_before = a.detach().clone()
        c.step()
        torch.testing.assert_close(a_before - a.detach(), torch.full((3, 4), 0.5**step))
        sched.step()
    assert [g["lr"] for g in c.param_groups] == [0.125, 0.0625]
    assert set(c.state_dict()["state"]) == {"sparse.w"}  # SGD without momentum keeps no state
    c.zero_grad()
    assert a.grad is None and b.grad is None


# ------------------------------------------------------------------------------------ warm-up


def _torchrec_multiplier(stage: WarmupStage, i: int, decay: int) -> float:
    """torchrec's published per-policy formulas (decay = the stage's effective decay_iters)."""
    v = stage.value
    if stage.policy == WarmupPolicy.LINEAR:
        m = v + (1 - v) * i / stage.max_iters
    elif stage.policy == WarmupPolicy.CONSTANT:
        m = v
    elif stage.policy == WarmupPolicy.POLY:
        m = (1 - i / decay) ** v
    elif stage.policy == WarmupPolicy.STEP:
        m = v ** (i // decay)
    elif stage.policy == WarmupPolicy.INVSQRT:
        m = 1 / math.sqrt(i)
    elif stage.policy == WarmupPolicy.COSINE_ANNEALING_WARM_RESTARTS:
        t = stage.sgdr_period
        m = v + (1 - v) * 0.5 * (1 + math.cos(math.pi * (i % t) / t))
    else:
        m = 1.0
    return m * stage.lr_scale


def _expected_lrs(stages: list[WarmupStage], lr: float, steps: int) -> list[float]:
    decays = [s.decay_iters if s.decay_iters > 0 else (1 if s.policy == WarmupPolicy.STEP else s.max_iters)
              for s in stages]  # fmt: skip
    out, stage = [], 0
    for i in range(steps + 1):  # lr before step i+1 (i steps done)
        if stage < len(stages) and i > stages[stage].max_iters:
            stage += 1
        out.append(lr if stage == len(stages) else lr * _torchrec_multiplier(stages[stage], i, decays[stage]))
    return out


@pytest.mark.parametrize(
    "stages",
    [
        [WarmupStage(WarmupPolicy.LINEAR, max_iters=5, value=0.2, lr_scale=2.0)],
        [WarmupStage(WarmupPolicy.CONSTANT, max_iters=3, value=0.3)],
        [WarmupStage(WarmupPolicy.POLY, max_iters=6, value=2.0)],
        [WarmupStage(WarmupPolicy.POLY, max_iters=6, value=0.5, decay_iters=10)],
        [WarmupStage(WarmupPolicy.STEP, max_iters=8, value=0.5, decay_iters=3)],
        [WarmupStage(WarmupPolicy.STEP, max_iters=4, value=0.9)],
        [WarmupStage(WarmupPolicy.LINEAR, max_iters=2, value=0.0), WarmupStage(WarmupPolicy.INVSQRT, max_iters=9)],
        [WarmupStage(WarmupPolicy.COSINE_ANNEALING_WARM_RESTARTS, max_iters=10, value=0.1, sgdr_period=4)],
        [WarmupStage(WarmupPolicy.LINEAR, max_iters=3, value=0.5),
         WarmupStage(WarmupPolicy.STEP, max_iters=7, value=0.5, decay_iters=2, lr_scale=0.5),
         WarmupStage(WarmupPolicy.POLY, max_iters=12, value=1.0, decay_iters=12)],
    ],
)  # fmt: skip
def test_warmup_lr_curve_matches_torchrec_formulas_step_by_step(stages: list[WarmupStage]) -> None:
    p = _param(0)
    opt = WarmupOptimizer(KeyedOptimizerWrapper({"w": p}, lambda ps: torch.optim.SGD(ps, lr=1.0)), stages, lr=0.3)
    expected = _expected_lrs(stages, 0.3, 16)
    seen = [opt.param_groups[0]["lr"]]
    for _ in range(16):
        p.grad = torch.zeros_like(p)
        opt.step()
        seen.append(opt.param_groups[0]["lr"])
    assert seen == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert seen[-1] == pytest.approx(0.3)  # after the last stage: the base lr


def test_warmup_cosine_stage_rejects_a_non_positive_period() -> None:
    with pytest.raises(ValueError, match="sgdr_period=0"):
        WarmupOptimizer(KeyedOptimizerWrapper({"w": _param(0)}, lambda ps: torch.optim.SGD(ps, lr=1.0)),
                        [WarmupStage(WarmupPolicy.COSINE_ANNEALING_WARM_RESTARTS, max_iters=4, sgdr_period=0)])  # fmt: skip


def _warmup_in_combined(p: torch.nn.Parameter) -> tuple[WarmupOptimizer, CombinedOptimizer]:
    inner = KeyedOptimizerWrapper({"w": p}, lambda ps: torch.optim.SGD(ps, lr=1.0))
    warm = WarmupOptimizer(inner, [WarmupStage(WarmupPolicy.LINEAR, max_iters=10, value=0.0)], lr=1.0)
    other = KeyedOptimizerWrapper({"w": _param(5)}, lambda ps: torch.optim.Adam(ps, lr=0.1))
    return warm, CombinedOptimizer([("dense", warm), ("other", other)])


def test_warmup_schedule_position_survives_a_combined_optimizer_checkpoint() -> None:
    p = _param(0)
    warm, combined = _warmup_in_combined(p)
    for _ in range(4):
        p.grad = torch.ones_like(p)
        combined.step()
    sd = combined.state_dict()
    assert "dense.__warmup" in sd["state"]
    warm2, combined2 = _warmup_in_combined(_param(0))
    combined2.load_state_dict(sd)
    assert warm2.param_groups[0]["lr"] == pytest.approx(0.4)
    assert combined2.state_dict()["state"]["dense.__warmup"]["warmup"].tolist() == [4, 0]


# ----------------------------------------------------------------------------------- clipping


def _clip_pair(dtype: torch.dtype, norm_type: float) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    ours = [_param(i, (4, 3), dtype) for i in range(3)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        g = torch.randn(4, 3, generator=torch.Generator().manual_seed(10 + i), dtype=dtype) * 5
        a.grad, b.grad = g.clone(), g.clone()
    return ours, ref


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_norm_clipping_matches_torch_clip_grad_norm(dtype: torch.dtype, norm_type: float) -> None:
    ours, ref = _clip_pair(dtype, norm_type)
    fused = torch.nn.Parameter(torch.ones(2, 2, dtype=dtype))  # trained in backward: never has a .grad
    params = {f"p{i}": p for i, p in enumerate(ours)} | {"table": fused}
    opt = GradientClippingOptimizer(KeyedOptimizerWrapper(params, lambda ps: torch.optim.SGD(ps, lr=0.0)),
                                    clipping=GradientClipping.NORM, max_gradient=1.5, norm_type=norm_type)  # fmt: skip
    expected_norm = torch.nn.utils.clip_grad_norm_(ref, max_norm=1.5, norm_type=norm_type)
    torch.testing.assert_close(opt.clip_grad_norm_().to(dtype), expected_norm)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=0 if dtype == torch.float64 else 1e-6, atol=1e-15)
    assert fused.grad is None


def test_value_clipping_matches_torch_clip_grad_value_and_norm_below_max_is_untouched() -> None:
    ours, ref = _clip_pair(torch.float32, 2.0)
    opt = GradientClippingOptimizer(KeyedOptimizerWrapper({f"p{i}": p for i, p in enumerate(ours)},
                                                          lambda ps: torch.optim.SGD(ps, lr=0.0)),
                                    clipping=GradientClipping.VALUE, max_gradient=2.0)  # fmt: skip
    opt.step()
    torch.nn.utils.clip_grad_value_(ref, 2.0)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    small, _ = _clip_pair(torch.float32, 2.0)
    grads = [p.grad.clone() for p in small]  # type: ignore[union-attr]
    GradientClippingOptimizer(KeyedOptimizerWrapper({f"p{i}": p for i, p in enumerate(small)},
                                                    lambda ps: torch.optim.SGD(ps, lr=0.0)),
                              clipping=GradientClipping.NORM, max_gradient=1e6).step()  # fmt: skip
    for p, g in zip(small, grads, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)


# ------------------------------------------------------------------------ row-wise optimizers


def _grads(n: int, shape: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(123)
    out = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(n)]
    out[1][0] = 0.0  # a row without gradient in one step
    return out


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_rowwise_adagrad_matches_fbgemm_exact_rowwise_adagrad_formula(weight_decay: float) -> None:
    lr, eps = 0.1, 1e-8
    p = _param(0, (4, 6), torch.float64)
    w, acc = p.detach().clone(), torch.zeros(4, dtype=torch.float64)
    opt = RowWiseAdagrad([p], lr=lr, eps=eps, weight_decay=weight_decay)
    for g in _grads(5, (4, 6)):
        p.grad = g.clone()
        opt.step()
        # fbgemm (weight_decay_mode L2): the decayed gradient enters the mean square; the weight is
        # scaled by (1 - multiplier * wd) and moved by multiplier * raw gradient
        acc += (g + weight_decay * w).square().mean(dim=1)
        multiplier = (lr / (acc.sqrt() + eps)).unsqueeze(1)
        w = (1 - multiplier * weight_decay) * w - multiplier * g
        torch.testing.assert_close(p.detach(), w, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(opt.state[p]["sum"], acc, rtol=1e-12, atol=1e-12)


def _moment_reference(kind: str, steps: list[torch.Tensor], w: torch.Tensor, lr: float, b1: float, b2: float,
                      eps: float, wd: float) -> torch.Tensor:  # fmt: skip
    m1 = torch.zeros_like(w)
    m2 = torch.zeros(w.shape[0], 1, dtype=w.dtype) if kind != "lamb" else torch.zeros_like(w)
    for t, g in enumerate(steps, start=1):
        m1 = b1 * m1 + (1 - b1) * g
        sq = g * g if kind == "lamb" else (g * g).mean(dim=1, keepdim=True)
        m2 = b2 * m2 + (1 - b2) * sq
        r = (m1 / (1 - b1**t)) / ((m2 / (1 - b2**t)).sqrt() + eps) + wd * w
        if kind == "adam":
            w = w - lr * r
        else:
            trust = w.norm(dim=1, keepdim=True) / r.norm(dim=1, keepdim=True)
            w = w - lr * trust * r
    return w


@pytest.mark.parametrize(("cls", "kind"), [(LAMB, "lamb"), (PartialRowWiseLAMB, "partial_lamb"),
                                           (PartialRowWiseAdam, "adam")])  # fmt: skip
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_moment_optimizers_match_fbgemm_formulas_over_several_steps(
    cls: type[LAMB], kind: str, weight_decay: float
) -> None:
    p = _param(3, (4, 6), torch.float64)
    grads = [torch.randn(4, 6, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in range(5)]
    expected = _moment_reference(kind, grads, p.detach().clone(), 0.05, 0.8, 0.95, 1e-8, weight_decay)
    opt = cls([p], lr=0.05, betas=(0.8, 0.95), eps=1e-8, weight_decay=weight_decay)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    torch.testing.assert_close(p.detach(), expected, rtol=1e-10, atol=1e-12)
    assert int(opt.state[p]["step"]) == 5


def test_lars_sgd_matches_fbgemm_formula_over_several_steps() -> None:
    lr, eta, mom, wd = 0.1, 0.01, 0.9, 0.001
    p = _param(4, (3, 5), torch.float64)
    w, m = p.detach().clone(), torch.zeros(3, 5, dtype=torch.float64)
    opt = LarsSGD([p], lr=lr, eta=eta, momentum=mom, weight_decay=wd)
    for s in range(4):
        g = torch.randn(3, 5, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
        p.grad = g.clone()
        opt.step()
        wn, gn = w.norm(dim=1, keepdim=True), g.norm(dim=1, keepdim=True)
        m = mom * m + lr * eta * wn / (gn + wd * wn) * (g + wd * w)
        w = w - m
        torch.testing.assert_close(p.detach(), w, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- apply_optimizer_in_backward


def test_apply_optimizer_in_backward_steps_each_parameter_during_backward() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(6, 4), torch.nn.Linear(4, 1))
    ref = torch.nn.Sequential(torch.nn.Embedding(6, 4), torch.nn.Linear(4, 1))
    ref.load_state_dict(model.state_dict())
    apply_optimizer_in_backward(torch.optim.Adagrad, model[0].parameters(), {"lr": 0.3})
    ref_opt = torch.optim.Adagrad(ref[0].parameters(), lr=0.3)
    x = torch.tensor([0, 2, 2, 5])
    for _ in range(3):
        model(x).sum().backward()
        ref(x).sum().backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert model[0].weight.grad is None  # consumed in backward
        torch.testing.assert_close(model[0].weight, ref[0].weight)
        model[1].zero_grad()
        ref[1].zero_grad()
    dense = [n for n, _ in in_backward_optimizer_filter(model.named_parameters())]
    fused = [n for n, _ in in_backward_optimizer_filter(model.named_parameters(), include=True)]
    assert dense == ["1.weight", "1.bias"] and fused == ["0.weight"]
