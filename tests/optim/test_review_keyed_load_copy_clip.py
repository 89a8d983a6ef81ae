"""Keyed optimizers as a torchrec user drives them, against plain torch references: loading a state
dict that names unknown parameters, deep copies after an LR scheduler, the warm-up schedule and its
saved position, gradient clipping, and the row-wise optimizers on channels_last parameters."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch

from lightrec.optim.clipping import GradientClipping, GradientClippingOptimizer
from lightrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from lightrec.optim.rowwise_adagrad import RowWiseAdagrad
from lightrec.optim.rowwise_optimizers import LAMB, LarsSGD, PartialRowWiseAdam, PartialRowWiseLAMB
from lightrec.optim.warmup import WarmupOptimizer, WarmupPolicy, WarmupStage


def _params(names: tuple[str, ...] = ("a", "b"), seed: int = 0) -> dict[str, torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.nn.Parameter(torch.randn(3, 2, generator=g)) for n in names}


def _set_grads(params: dict[str, torch.nn.Parameter], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params.values():
        p.grad = torch.randn(p.shape, generator=g)


def _momentum_sgd(params: dict[str, torch.nn.Parameter]) -> KeyedOptimizerWrapper:
    return KeyedOptimizerWrapper(params, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))


# --- a state dict naming parameters the optimizer does not have -------------------------------------


def test_combined_optimizer_refuses_state_of_an_unknown_parameter_and_changes_nothing() -> None:
    params = _params(("a",))
    combined = CombinedOptimizer([("dense", _momentum_sgd(params))])
    _set_grads(params, 1)
    combined.step()
    before = combined.state_dict()["state"]["dense.a"]["momentum_buffer"].clone()
    saved = copy.deepcopy(combined.state_dict())
    saved["state"]["dense.a"]["momentum_buffer"].fill_(7.0)
    saved["state"]["sparse.t1.weight"] = {"momentum_buffer": torch.zeros(3, 2)}  # another model's table
    with pytest.raises(KeyError, match=r"sparse\.t1\.weight"):
        combined.load_state_dict(saved)
    with pytest.raises(KeyError, match=r"sparse\.t1\.weight"):
        combined.check_state_dict(saved)
    assert torch.equal(combined.state_dict()["state"]["dense.a"]["momentum_buffer"], before)


def test_keyed_optimizer_refuses_state_of_an_unknown_parameter_and_changes_nothing() -> None:
    params = _params(("a",))
    opt = _momentum_sgd(params)
    _set_grads(params, 1)
    opt.step()
    before = opt.state[params["a"]]["momentum_buffer"].clone()
    saved = copy.deepcopy(opt.state_dict())
    saved["state"]["a"]["momentum_buffer"].fill_(7.0)
    saved["state"]["renamed.b"] = {"momentum_buffer": torch.zeros(3, 2)}
    with pytest.raises(KeyError, match=r"renamed\.b"):
        opt.load_state_dict(saved)
    assert torch.equal(opt.state[params["a"]]["momentum_buffer"], before)


def test_combined_warmup_round_trip_still_loads_its_schedule_position() -> None:
    def build(params: dict[str, torch.nn.Parameter]) -> CombinedOptimizer:
        warm = WarmupOptimizer(_momentum_sgd(params), [WarmupStage(WarmupPolicy.LINEAR, max_iters=4, value=0.5)], lr=1.0)
        return CombinedOptimizer([("dense", warm)])

    params = _params(("a",))
    opt = build(params)
    for i in range(2):
        _set_grads(params, i)
        opt.step()
    fresh = build(_params(("a",)))
    fresh.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert fresh.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.5 + 0.5 * 2 / 4


# --- deep copies and pickles after an LR scheduler ---------------------------------------------------


def test_deepcopy_after_an_lr_scheduler_steps_the_copy_like_torch() -> None:
    params = {"a": torch.nn.Parameter(torch.ones(2))}
    opt = KeyedOptimizerWrapper(params, lambda ps: torch.optim.SGD(ps, lr=1.0))
    torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    ref_param = torch.nn.Parameter(torch.ones(2))
    ref = torch.optim.SGD([ref_param], lr=1.0)
    torch.optim.lr_scheduler.StepLR(ref, step_size=1)

    twin, ref_twin = copy.deepcopy(opt), copy.deepcopy(ref)
    twin.params["a"].grad = torch.ones(2)
    ref_twin.param_groups[0]["params"][0].grad = torch.ones(2)
    twin.step()
    ref_twin.step()
    assert torch.equal(twin.params["a"].detach(), ref_twin.param_groups[0]["params"][0].detach())  # the copy moved
    assert torch.equal(params["a"].detach(), ref_param.detach())  # the original did not
    restored = pickle.loads(pickle.dumps(opt))
    assert restored.state_dict()["param_groups"] == opt.state_dict()["param_groups"]


# --- warm-up --------------------------------------------------------------------------------------


def test_warmup_sets_the_documented_lr_at_every_step_and_resumes_mid_stage() -> None:
    stages = [
        WarmupStage(WarmupPolicy.LINEAR, max_iters=3, value=0.1),
        WarmupStage(WarmupPolicy.STEP, max_iters=6, value=0.5, decay_iters=2),
    ]
    base = 2.0

    def expected(i: int) -> float:  # torchrec's formulas; i counts steps from the start
        if i <= 3:
            return base * (0.1 + 0.9 * i / 3)
        if i <= 6:
            return base * 0.5 ** (i // 2)
        return base

    params = _params()
    opt = WarmupOptimizer(KeyedOptimizerWrapper(params, lambda ps: torch.optim.Adam(ps, lr=9.0)), stages, lr=base)
    seen = [opt.param_groups[0]["lr"]]
    for i in range(4):
        _set_grads(params, i)
        opt.step()
        seen.append(opt.param_groups[0]["lr"])
    resumed_params = {k: torch.nn.Parameter(v.detach().clone()) for k, v in params.items()}
    resumed = WarmupOptimizer(KeyedOptimizerWrapper(resumed_params, lambda ps: torch.optim.Adam(ps, lr=9.0)), stages, lr=base)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    for i in range(4, 9):
        _set_grads(params, i)
        _set_grads(resumed_params, i)
        opt.step()
        resumed.step()
        seen.append(opt.param_groups[0]["lr"])
        assert resumed.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert seen == pytest.approx([expected(i) for i in range(10)], rel=1e-12)
    for k in params:
        assert torch.equal(params[k], resumed_params[k])


def test_warmup_refuses_a_position_outside_its_schedule_and_changes_nothing() -> None:
    params = _params(("a",))
    opt = WarmupOptimizer(_momentum_sgd(params), [WarmupStage(WarmupPolicy.LINEAR, max_iters=4, value=0.5)], lr=1.0)
    _set_grads(params, 0)
    opt.step()
    before = opt.state[params["a"]]["momentum_buffer"].clone()
    saved = copy.deepcopy(opt.state_dict())
    saved["state"]["a"]["momentum_buffer"].fill_(7.0)
    saved["state"]["__warmup"] = {"warmup": torch.tensor([20, 5])}  # saved with more stages
    with pytest.raises(ValueError, match="__warmup"):
        opt.load_state_dict(saved)
    assert torch.equal(opt.state[params["a"]]["momentum_buffer"], before)
    assert opt.param_groups[0]["lr"] == 0.5 + 0.5 / 4


# --- gradient clipping ------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf"), "inf"])
def test_clip_norm_matches_torch_with_a_parameter_without_gradient(norm_type: float | str) -> None:
    params = _params(("a", "b", "c"))
    _set_grads(params, 5)
    params["c"].grad = None
    ref = {k: torch.nn.Parameter(v.detach().clone()) for k, v in params.items()}
    for k in ("a", "b"):
        ref[k].grad = params[k].grad.clone()  # type: ignore[union-attr]
    opt = GradientClippingOptimizer(
        KeyedOptimizerWrapper(params, lambda ps: torch.optim.SGD(ps, lr=1.0)),
        GradientClipping.NORM,
        max_gradient=0.5,
        norm_type=norm_type,
    )
    norm = opt.clip_grad_norm_()
    ref_norm = torch.nn.utils.clip_grad_norm_(list(ref.values()), 0.5, norm_type=norm_type)
    torch.testing.assert_close(norm, ref_norm)
    for k in ("a", "b"):
        torch.testing.assert_close(params[k].grad, ref[k].grad)
    assert params["c"].grad is None


@pytest.mark.parametrize("norm_type", [0, -1.0, float("nan"), "fro"])
def test_clip_refuses_a_norm_type_that_is_no_norm(norm_type: float | str) -> None:
    with pytest.raises(ValueError, match="norm_type"):
        GradientClippingOptimizer(
            KeyedOptimizerWrapper(_params(), lambda ps: torch.optim.SGD(ps, lr=1.0)),
            GradientClipping.NORM,
            norm_type=norm_type,
        )


# --- row-wise optimizers on channels_last parameters ----------------------------------------------


@pytest.mark.parametrize("cls", [RowWiseAdagrad, LAMB, PartialRowWiseLAMB, PartialRowWiseAdam, LarsSGD])
def test_rowwise_optimizers_step_a_channels_last_conv_weight_as_a_contiguous_one(cls: type) -> None:
    torch.manual_seed(0)
    weight = torch.randn(4, 3, 2, 2)
    flat = torch.nn.Parameter(weight.clone())
    last = torch.nn.Parameter(weight.clone().to(memory_format=torch.channels_last))
    opt_flat, opt_last = cls([flat], lr=0.1), cls([last], lr=0.1)
    for _ in range(3):
        grad = torch.randn(4, 3, 2, 2)
        flat.grad = grad.clone()
        last.grad = grad.clone().to(memory_format=torch.channels_last)
        opt_flat.step()
        opt_last.step()
    assert last.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(last.detach(), flat.detach(), rtol=0, atol=0)
    assert not math.isclose(float(flat.detach().sum()), float(weight.sum()))  # both moved
