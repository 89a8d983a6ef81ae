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

from typing import Literal

import torch
import torch.distributed as dist

__all__ = ["NONFINITE_POLICIES", "NonFiniteLossError", "check_nonfinite_policy", "nonfinite_ranks"]

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
