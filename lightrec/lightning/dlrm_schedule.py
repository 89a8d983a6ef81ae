"""The DLRM learning-rate schedule ``RecModule(warmup_steps=..., decay_start_step=..., decay_steps=...)`` uses."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["dlrm_lr_lambda"]


def dlrm_lr_lambda(
    warmup_steps: int, decay_start_step: int | None, decay_steps: int, decay_power: float = 2.0, min_factor: float = 0.0
) -> Callable[[int], float]:
    """LR multiplier of DLRM training: linear warm-up, constant, then polynomial decay to ``min_factor``.

    ``factor(step)`` is ``(step + 1) / warmup_steps`` during warm-up, 1 until ``decay_start_step``,
    then ``max(min_factor, (1 - (step - decay_start) / decay_steps) ** decay_power)``.
    """
    if warmup_steps < 0 or decay_steps < 0:
        raise ValueError(f"warmup_steps and decay_steps must be >= 0, got {warmup_steps} and {decay_steps}")

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        if decay_start_step is None or decay_steps == 0 or step < decay_start_step:
            return 1.0
        remaining = 1.0 - (step - decay_start_step) / decay_steps
        return max(min_factor, max(remaining, 0.0) ** decay_power)

    return factor
