"""The non-finite loss guard of ``RecModule``: refuse a NaN/inf loss *before* backward.

With fused embedding optimizers the tables are updated inside ``loss.backward()`` (the optimizer
runs in the backward pass, row by row), so by the time any ``optimizer.step`` hook could refuse a
step, one NaN batch has already written NaN into every row it touched -- and from there into every
table. The only place to stop it is before backward. ``RecModule.backward`` calls
:func:`nonfinite_ranks` with the loss of the step:

* every rank contributes one flag (``isfinite(loss)``) to one small all-gather, so all ranks take
  the same decision -- one rank skipping backward while the others wait in its all-to-alls or
  DDP's all-reduce would hang them;
* the flags are read on the host: on a GPU that is one host-device synchronisation per step
  (on CPU, and in the all-gather itself, it is a few microseconds; ``docs/reliability.md`` has the
  measured cost on the main job).

Policies (``RecModule(nonfinite_loss=...)``): ``"raise"`` (default) raises
:class:`NonFiniteLossError` on every rank naming the ranks and the step; ``"skip"`` skips the
batch -- no backward on any rank, so the batch changes no weight through either optimizer (with
``accumulate_grad_batches`` only the bad batch's contribution is dropped: the gradients of the good
batches of its window are kept for the window's step; a window without any good batch has its dense
gradients cleared, so its step changes nothing, and under a GradScaler the scaler skips that step;
the LR schedule still advances) -- and counts it;
``None`` turns the check off.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["NONFINITE_POLICIES", "GradientWindow", "NonFiniteLossError", "check_nonfinite_policy", "nonfinite_ranks"]

NonFinitePolicy = Literal["raise", "skip"] | None
NONFINITE_POLICIES = ("raise", "skip", None)


class NonFiniteLossError(FloatingPointError):
    """The training loss is NaN or infinite on at least one rank (raised before backward)."""


def check_nonfinite_policy(policy: object) -> NonFinitePolicy:
    if policy not in NONFINITE_POLICIES:
        raise ValueError(
            f"nonfinite_loss must be 'raise', 'skip' or None (no check), got {policy!r}: 'raise' stops training at "
            "a NaN/inf loss, 'skip' skips that batch on every rank"
        )
    return policy  # type: ignore[return-value]


def nonfinite_ranks(loss: torch.Tensor) -> list[int]:
    """The ranks whose ``loss`` is not finite (``[0]`` or ``[]`` without a process group).

    A collective when a process group of several ranks is initialised: every rank must call it.
    """
    bad = (~torch.isfinite(loss.detach())).any().to(torch.uint8).reshape(1)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [0] if bool(bad.item()) else []
    flags = [torch.empty_like(bad) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, bad)
    return [r for r, f in enumerate(torch.cat(flags).tolist()) if f]


class GradientWindow:
    """What ``nonfinite_loss="skip"`` needs to know about the gradients of an accumulation window.

    A skipped micro-batch keeps the gradients earlier good micro-batches of its window left (non-zero
    ones: ``zero_grad(set_to_none=False)`` leaves zeros) and otherwise clears them, so the window's
    step changes nothing. Under an enabled GradScaler a step without any gradient fails in
    ``scaler.step`` ("No inf checks were recorded for this optimizer"), so the dense gradients are set
    to NaN instead: the scaler skips that step (and backs its scale off, as after any overflow); a
    later good micro-batch of the window drops those stand-ins before its backward.
    """

    def __init__(self) -> None:
        self.has_gradients = False  # a finite loss was back-propagated since the last zero_grad
        self._nan_stand_ins: list[nn.Parameter] = []  # the parameters whose gradients are NaN stand-ins

    def reset(self) -> None:
        """The window's gradients were zeroed (``on_before_zero_grad``, automatic optimization)."""
        self.has_gradients = False
        self._nan_stand_ins = []

    def before_backward(self) -> None:
        for p in self._nan_stand_ins:
            p.grad = None
        self._nan_stand_ins = []

    def after_backward(self) -> None:
        self.has_gradients = True

    def skip(self, parameters: Iterable[nn.Parameter], dense: Iterable[nn.Parameter], scaler: object) -> None:
        """A non-finite micro-batch: keep the window's gradients, or clear them (NaN for ``scaler``)."""
        parameters = list(parameters)
        if self._keeps(parameters):
            return
        for p in parameters:
            p.grad = None
        if isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled():
            self._nan_stand_ins = list(dense)
            for p in self._nan_stand_ins:
                p.grad = torch.full_like(p, float("nan"))

    def _keeps(self, parameters: list[nn.Parameter]) -> bool:
        # The flag alone is enough under automatic optimization; under manual optimization nothing
        # resets it, so the gradients themselves decide (one host sync, on a skipped batch only).
        if not self.has_gradients or self._nan_stand_ins:
            return False
        grads = [p.grad for p in parameters if p.grad is not None]
        flags = [(g.coalesce().values() if g.is_sparse else g).any().reshape(1) for g in grads]
        return bool(torch.cat(flags).any()) if flags else False
