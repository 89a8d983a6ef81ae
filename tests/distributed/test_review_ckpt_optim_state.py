"""Optimizer state that names no parameter survives a sharded checkpoint.

A ``WarmupOptimizer`` keeps its schedule position in ``state_dict()["state"]["__warmup"]`` (as a
``CombinedOptimizer`` part: ``"<prefix>.__warmup"``). The sharded format keyed every state entry by
a parameter, so saving such an optimizer failed (``KeyError: '__warmup'`` on every rank). Here it
is saved and loaded back exactly: every state entry and every param group value equal the ones
before saving, and a resumed run continues the schedule as the uninterrupted run does.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import torch

from tests.multiprocess import run_ranks

STEPS, SAVE_AT = 6, 3


def _stages(lr_scale: float) -> list[Any]:
    from lightrec.optim import WarmupPolicy, WarmupStage

    # at SAVE_AT the schedule is in its second stage: both the step and the stage must come back
    return [
        WarmupStage(WarmupPolicy.LINEAR, max_iters=2, value=0.25, lr_scale=lr_scale),
        WarmupStage(WarmupPolicy.POLY, max_iters=10, value=2.0, decay_iters=8),
    ]


def _warmup_optimizer(sparse: Any, dense: dict[str, torch.nn.Parameter]) -> Any:
    """An outer warm-up (``"__warmup"``) over a combined optimizer whose dense part is a warm-up too
    (``"dense.__warmup"``)."""
    from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, WarmupOptimizer

    inner = WarmupOptimizer(
        KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adagrad(ps, lr=0.05)), _stages(0.5), lr=0.05
    )
    parts = [("sparse", sparse), ("dense", inner)] if sparse is not None else [("dense", inner)]
    return WarmupOptimizer(CombinedOptimizer(parts), _stages(1.0), lr=0.1)


def _assert_same_state(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert set(got["state"]) == set(want["state"])
    for key, entries in want["state"].items():
        assert set(got["state"][key]) == set(entries), key
        for name, value in entries.items():
            other = got["state"][key][name]
            if isinstance(value, torch.Tensor):
                assert isinstance(other, torch.Tensor) and torch.equal(other, value), (key, name)
            else:
                assert other == value, (key, name)
    assert len(got["param_groups"]) == len(want["param_groups"])
    for g, w in zip(got["param_groups"], want["param_groups"], strict=True):
        assert g == w


def test_warmup_position_round_trips_on_one_process(tmp_path: Any) -> None:
    from lightrec.distributed.checkpoint import load_sharded_checkpoint, save_sharded_checkpoint

    def build() -> tuple[torch.nn.Module, Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
        return model, _warmup_optimizer(None, dict(model.named_parameters()))

    def train(model: torch.nn.Module, opt: Any, steps: range) -> list[float]:
        losses = []
        for s in steps:
            x = torch.randn(5, 3, generator=torch.Generator().manual_seed(s))
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    model, opt = build()
    train(model, opt, range(SAVE_AT))
    before = copy.deepcopy(opt.state_dict())  # the live state moves on with training
    assert before["state"]["__warmup"]["warmup"].tolist() == [3, 1]
    assert before["state"]["dense.__warmup"]["warmup"].tolist() == [3, 1]
    path = os.fspath(tmp_path / "step=3.ckpt")
    save_sharded_checkpoint(path, {"state_dict": model.state_dict(), "optimizer_states": [before]}, model, [opt])
    uninterrupted = train(model, opt, range(SAVE_AT, STEPS))

    model2, opt2 = build()
    ckpt = load_sharded_checkpoint(path, model2, [opt2])
    _assert_same_state(ckpt["optimizer_states"][0], before)
    model2.load_state_dict(ckpt["state_dict"])
    opt2.load_state_dict(ckpt["optimizer_states"][0])
    _assert_same_state(opt2.state_dict(), before)
    assert train(model2, opt2, range(SAVE_AT, STEPS)) == uninterrupted


def test_saved_schedule_position_into_optimizer_without_it_is_refused(tmp_path: Any) -> None:
    from lightrec.distributed.checkpoint import (
        CheckpointError,
        load_sharded_checkpoint,
        save_sharded_checkpoint,
    )
    from lightrec.optim import KeyedOptimizerWrapper

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = _warmup_optimizer(None, dict(model.named_parameters()))
    path = os.fspath(tmp_path / "c.ckpt")
    save_sharded_checkpoint(path, {"state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()]}, model, [opt])
    plain = KeyedOptimizerWrapper(dict(model.named_parameters()), lambda ps: torch.optim.Adagrad(ps, lr=0.05))
    with pytest.raises(CheckpointError, match=r"\['__warmup', 'dense.__warmup'\].*names no parameter"):
        load_sharded_checkpoint(path, model, [plain])


# -- 2 gloo ranks, a sharded DLRM (the layout RecStrategy writes) -------------------------------


def _build(world_size: int) -> tuple[Any, Any]:
    from lightrec.distributed import DistributedModelParallel
    from lightrec.optim import in_backward_optimizer_filter
    from tests.distributed.test_dmp import _dlrm, _sharders
    from tests.distributed.test_sharded_checkpoint import _plan

    model = DistributedModelParallel(_dlrm("meta"), device="cpu", plan=_plan(world_size), sharders=_sharders())
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    return model, _warmup_optimizer(model.fused_optimizer, dense)


class _NoScheduler:
    def step(self) -> None:
        pass


def _train(model: Any, opt: Any, steps: range, rank: int, world_size: int) -> list[float]:
    from tests.distributed.test_sharded_checkpoint import _step

    return [_step(model, opt, _NoScheduler(), s, rank, world_size) for s in steps]


def _non_param_state(sd: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sd["state"].items() if "__warmup" in k}


def _save_body(rank: int, world_size: int, path: str) -> dict[str, Any]:
    from lightrec.distributed.checkpoint import save_sharded_checkpoint

    model, opt = _build(world_size)
    _train(model, opt, range(SAVE_AT), rank, world_size)
    before = copy.deepcopy(opt.state_dict())  # the live state moves on with training
    save_sharded_checkpoint(path, {"state_dict": model.state_dict(), "optimizer_states": [before]}, model, [opt])
    return {"before": before, "losses": _train(model, opt, range(SAVE_AT, STEPS), rank, world_size)}


def _load_body(rank: int, world_size: int, path: str) -> dict[str, Any]:
    from lightrec.distributed.checkpoint import load_sharded_checkpoint

    model, opt = _build(world_size)
    ckpt = load_sharded_checkpoint(path, model, [opt])
    loaded = ckpt["optimizer_states"][0]
    model.load_state_dict(ckpt["state_dict"])
    opt.load_state_dict(loaded)
    after = copy.deepcopy(opt.state_dict())
    return {"loaded": loaded, "after": after, "losses": _train(model, opt, range(SAVE_AT, STEPS), rank, world_size)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> dict[str, Any]:
    path = str(tmp_path_factory.mktemp("ckpt") / "step=3.ckpt")
    return {"path": path, "ranks": run_ranks(_save_body, 2, args=(path,), timeout=240)}


@pytest.mark.slow
def test_sharded_resume_on_same_ranks_restores_every_entry(saved: dict[str, Any]) -> None:
    resumed = run_ranks(_load_body, 2, args=(saved["path"],), timeout=240)
    for rank in range(2):
        before = saved["ranks"][rank]["before"]
        assert _non_param_state(before).keys() == {"__warmup", "dense.__warmup"}
        _assert_same_state(resumed[rank]["loaded"], before)
        _assert_same_state(resumed[rank]["after"], before)
        assert resumed[rank]["losses"] == saved["ranks"][rank]["losses"]


@pytest.mark.slow
def test_sharded_resume_on_one_rank_keeps_the_schedule(saved: dict[str, Any], tmp_path: Any) -> None:
    from lightrec.distributed.checkpoint import consolidate_checkpoint

    before = saved["ranks"][0]["before"]
    lrs = sorted({g["lr"] for g in before["param_groups"]})
    full = str(tmp_path / "full.ckpt")
    consolidate_checkpoint(saved["path"], full)
    for path in (saved["path"], full):  # the 2-rank folder and its consolidated file, resumed on 1 rank
        (resumed,) = run_ranks(_load_body, 1, args=(path,), timeout=240)
        for got in (resumed["loaded"], resumed["after"]):
            for key, value in _non_param_state(before).items():
                assert torch.equal(got["state"][key]["warmup"], value["warmup"]), (path, key)
        assert sorted({g["lr"] for g in resumed["after"]["param_groups"]}) == lrs
        assert resumed["losses"] == pytest.approx(saved["ranks"][0]["losses"], rel=1e-5, abs=1e-6)
