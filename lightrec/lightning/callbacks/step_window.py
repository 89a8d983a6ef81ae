"""``StepWindow`` and ``WindowedMonitor``: the windows of optimizer steps the monitor callbacks log at.

``RecThroughputMonitor``, ``ManagedCollisionMonitor`` and ``TieredTableMonitor`` log one row per
window of ``every_n_steps`` training steps, with one rule between them:

- a step is a batch that stepped the optimizer: with ``accumulate_grad_batches=k`` it is ``k``
  batches (Lightning's ``log_every_n_steps`` counts the same way);
- windows end at the steps ``every_n_steps - 1``, ``2 * every_n_steps - 1`` ... of the trainer's
  step counter, so a resumed fit logs where an uninterrupted one does (its first window is shorter);
- a row is logged at the step of the window's last batch, the step ``LightningModule.log`` gives
  that batch's ``train/loss``; the last, shorter window is logged at the end of training.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import lightning.pytorch as pl
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightrec._compat import logging_step

__all__ = ["StepWindow", "WindowedMonitor", "check_every_n_steps"]


def check_every_n_steps(owner: str, every_n_steps: object) -> int:
    """``every_n_steps`` if it is a positive int (not a bool); else a ValueError naming ``owner``."""
    if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
        raise ValueError(f"{owner}(every_n_steps=...) must be a positive int, got {every_n_steps!r}")
    return every_n_steps


class StepWindow:
    """Counts the optimizer steps of the current window (see the module docstring).

    Call :meth:`batch_start` from ``on_train_batch_start`` and :meth:`batch_end` from
    ``on_train_batch_end``; when ``batch_end`` returns True the window ends at this batch: log it at
    :attr:`last_step` over :attr:`steps` steps, then :meth:`reset`. At ``on_train_end`` a window
    with ``steps > 0`` is the last, shorter one.
    """

    def __init__(self, every_n_steps: int) -> None:
        self.every_n_steps = every_n_steps
        self.steps = 0  # optimizer steps in the window
        self.last_step = 0  # the logging step of the window's last batch
        self._global_step = 0  # trainer.global_step at the start of the current batch

    def reset(self) -> None:
        self.steps = 0

    def batch_start(self, trainer: pl.Trainer) -> None:
        self._global_step = trainer.global_step

    def batch_end(self, trainer: pl.Trainer) -> bool:
        """Count this batch if it stepped the optimizer; True when it ends a window."""
        if trainer.accumulate_grad_batches > 1 and trainer.global_step == self._global_step:
            return False  # an accumulating batch: its step is the batch that steps
        self.steps += 1
        # read here: by on_train_end Lightning has moved its step counter past the last batch
        self.last_step = logging_step(trainer)
        return (self.last_step + 1) % self.every_n_steps == 0


class WindowedMonitor(pl.Callback, ABC):
    """A callback that logs one row per :class:`StepWindow`: subclasses write :meth:`_flush`
    (read ``self._window.steps`` / ``self._window.last_step``, then ``self._window.reset()``).

    ``_flush`` runs on every rank at the same batches (it may hold a collective).
    """

    def __init__(self, owner: str, every_n_steps: int) -> None:
        self.every_n_steps = check_every_n_steps(owner, every_n_steps)
        self._window = StepWindow(every_n_steps)

    @abstractmethod
    def _flush(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Log the window that ends at this batch (or the last, shorter one at train end)."""

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, batch_idx: int
    ) -> None:
        self._window.batch_start(trainer)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: object, batch_idx: int
    ) -> None:
        if self._window.batch_end(trainer):
            self._flush(trainer, pl_module)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._window.steps:
            self._flush(trainer, pl_module)
