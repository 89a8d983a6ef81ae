"""torchrec's ``torchrec.optim.warmup``: a learning-rate schedule in stages, as an optimizer wrapper.

::

    optimizer = WarmupOptimizer(CombinedOptimizer([model.fused_optimizer, dense]),
                                stages=[WarmupStage(WarmupPolicy.LINEAR, max_iters=1000, value=0.1),
                                        WarmupStage(WarmupPolicy.POLY, max_iters=10_000, value=2.0)],
                                lr=0.05)

After ``i`` steps in stage ``s`` every param group's ``lr_param`` is ``lr * multiplier(s, i) *
stages[s].lr_scale``; a stage ends after its ``max_iters`` (counted from the first step); after the
last stage the multiplier is 1. Multipliers (``v`` = ``stage.value``, ``n`` = ``max_iters``, ``k`` =
``decay_iters``)::

    LINEAR    v + (1 - v) * i / n          CONSTANT  v          NONE  1
    POLY      max(1 - i / k, 0) ** v       STEP      v ** (i // k)      INVSQRT  1 / sqrt(max(i, 1))
    COSINE_ANNEALING_WARM_RESTARTS         v + (1 - v) * (1 + cos(pi * (i % T) / T)) / 2,  T = sgdr_period

These are torchrec's formulas, except where torchrec fails: POLY past ``decay_iters`` stays at 0
(torchrec: a negative base), INVSQRT at step 0 is 1 (torchrec divides by zero).

The schedule position is saved in the optimizer's ``state_dict`` under ``"__warmup"`` (torchrec's
key), so a resumed run continues the schedule. Learning rates of fused embedding optimizers are
read at every lookup, so they follow the schedule too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum, unique
from typing import Any

import torch

from lightrec.optim.keyed import KeyedOptimizer, OptimizerWrapper, _GroupPair, _StateDict

__all__ = ["WarmupOptimizer", "WarmupPolicy", "WarmupStage"]


@unique
class WarmupPolicy(Enum):
    NONE = "none"
    LINEAR = "linear"
    CONSTANT = "constant"
    POLY = "poly"
    STEP = "step"
    INVSQRT = "inv_sqrt"
    COSINE_ANNEALING_WARM_RESTARTS = "cosine_annealing_warm_restarts"


@dataclass
class WarmupStage:
    """One stage: ``policy`` until step ``max_iters`` (see the module docstring for ``value``,
    ``lr_scale``, ``decay_iters`` and ``sgdr_period``; ``decay_iters <= 0`` means ``max_iters``, or
    1 for STEP; ``sgdr_period`` is the restart period of COSINE_ANNEALING_WARM_RESTARTS)."""

    policy: WarmupPolicy = WarmupPolicy.LINEAR
    max_iters: int = 1
    value: float = 1.0
    lr_scale: float = 1.0
    decay_iters: int = -1
    sgdr_period: int = 1


def _stages(stages: list[WarmupStage]) -> list[WarmupStage]:
    last = 0
    out = []
    for i, stage in enumerate(stages):
        if stage.max_iters <= last:
            raise ValueError(
                f"stages[{i}].max_iters={stage.max_iters} must exceed the previous stage's {last}: max_iters "
                "counts steps from the start, not within the stage"
            )
        last = stage.max_iters
        if stage.policy == WarmupPolicy.COSINE_ANNEALING_WARM_RESTARTS and stage.sgdr_period <= 0:
            raise ValueError(
                f"stages[{i}].sgdr_period={stage.sgdr_period} must be >= 1: it is the restart period in steps"
            )
        decay = stage.decay_iters if stage.decay_iters > 0 else (1 if stage.policy == WarmupPolicy.STEP else stage.max_iters)
        out.append(WarmupStage(stage.policy, stage.max_iters, stage.value, stage.lr_scale, decay, stage.sgdr_period))
    return out + [WarmupStage(WarmupPolicy.NONE, max_iters=1 << 62, value=1.0)]


def _multiplier(stage: WarmupStage, i: int) -> float:
    policy, v = stage.policy, stage.value
    if policy == WarmupPolicy.LINEAR:
        m = v + (1.0 - v) * i / stage.max_iters
    elif policy == WarmupPolicy.CONSTANT:
        m = v
    elif policy == WarmupPolicy.POLY:
        m = math.pow(max(1.0 - i / stage.decay_iters, 0.0), v)
    elif policy == WarmupPolicy.STEP:
        m = math.pow(v, i // stage.decay_iters)
    elif policy == WarmupPolicy.INVSQRT:
        m = 1.0 / math.sqrt(max(i, 1))
    elif policy == WarmupPolicy.COSINE_ANNEALING_WARM_RESTARTS:
        period = stage.sgdr_period
        m = v + (1.0 - v) * 0.5 * (1.0 + math.cos(math.pi * (i % period) / period))
    else:
        m = 1.0
    return m * stage.lr_scale


class WarmupOptimizer(OptimizerWrapper):
    """Sets the learning rate of every param group before each step (see the module docstring).

    Args:
        optimizer: the ``KeyedOptimizer`` to wrap.
        stages: the schedule.
        lr: the base learning rate the multipliers scale.
        lr_param: the param-group key to set.
        param_name: the state-dict name of the schedule position.
    """

    def __init__(
        self,
        optimizer: KeyedOptimizer,
        stages: list[WarmupStage],
        lr: float = 0.1,
        lr_param: str = "lr",
        param_name: str = "__warmup",
    ) -> None:
        super().__init__(optimizer)
        self._stages = _stages(list(stages))
        self._lr, self._lr_param, self._param_name = float(lr), lr_param, param_name
        self._iter, self._stage = 0, 0
        self._set_lr()  # a fused optimizer runs in the first backward, before the first step()

    def _set_lr(self) -> None:
        lr = self._lr * _multiplier(self._stages[self._stage], self._iter)
        for group in self.param_groups:
            group[self._lr_param] = lr

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = super().step(closure)
        self._iter += 1
        if self._iter > self._stages[self._stage].max_iters and self._stage + 1 < len(self._stages):
            self._stage += 1
        self._set_lr()
        return loss

    def _extra_state_names(self) -> set[str]:
        return super()._extra_state_names() | {self._param_name}

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        out["state"] = {**out["state"], self._param_name: {"warmup": torch.tensor([self._iter, self._stage])}}
        return out

    def _without_schedule(self, state_dict: _StateDict) -> tuple[_StateDict, tuple[int, int] | None]:
        """``state_dict`` without the schedule position, and the position (None if not saved)."""
        if not isinstance(state_dict, Mapping) or not isinstance(state_dict.get("state"), Mapping):
            raise KeyError("optimizer state_dict must have 'state' and 'param_groups' entries")
        state = dict(state_dict["state"])
        saved = state.pop(self._param_name, None)
        position = None
        if saved is not None:
            value = saved.get("warmup") if isinstance(saved, Mapping) else None
            it, stage = (-1, -1)
            if isinstance(value, torch.Tensor) and value.numel() == 2:
                it, stage = (int(x) for x in value.tolist())
            if it < 0 or not 0 <= stage < len(self._stages):
                raise ValueError(
                    f"optimizer state_dict entry {self._param_name!r} must be {{'warmup': tensor([iter, stage])}} "
                    f"with a stage of this schedule (0..{len(self._stages) - 1}), got {saved!r}; nothing was loaded; "
                    "load a state dict saved with the same stages"
                )
            position = (it, stage)
        return {**state_dict, "state": state}, position

    def check_state_dict(self, state_dict: _StateDict) -> list[_GroupPair]:
        rest, _ = self._without_schedule(state_dict)
        return super().check_state_dict(rest)

    def load_state_dict(self, state_dict: _StateDict) -> None:
        rest, position = self._without_schedule(state_dict)
        super().load_state_dict(rest)
        if position is not None:
            self._iter, self._stage = position
        self._set_lr()
