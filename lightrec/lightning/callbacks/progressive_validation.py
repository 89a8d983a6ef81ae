"""``ProgressiveValidation``: score every training batch before training on it, over a sliding window.

Online training has no held-out set that stays current: the data drifts, and yesterday's validation
split says little about now. Progressive validation scores each batch with the model *as it was
before that batch* -- which is exactly the training step's own forward: the logits are computed
from the rows and weights before ``backward`` updates them (the fused embedding optimizer updates
rows inside backward, the dense optimizer after it). So it costs no extra forward, and every sample
is scored once, unseen.

The callback reads the logits ``RecModule.training_step`` returns (``{"loss", "logits"}``) and
keeps the newest ``window`` samples (all ranks together) in :class:`~lightrec.metrics.SlidingWindow`
metrics. Every ``every_n_steps`` steps (default: the trainer's ``log_every_n_steps``, the steps
Lightning writes its logs) every rank computes them (one gather of the windows) and they are logged
to the progress bar and ``trainer.callback_metrics`` (a ``ModelCheckpoint`` may monitor them), and
rank 0 writes them to every logger (TensorBoard) at that step -- and at the last step of a fit
bounded by ``max_steps``:

==========================  ============================================================
tag (``prefix="online/"``)  value
==========================  ============================================================
``online/auc``              AUC of the last ``window`` samples, each scored before training
``online/ne``               normalized entropy of the same samples
``online/<metric>``         any other of ``metrics`` (``calibration``, ``ctr``, ``accuracy``)
==========================  ============================================================

The windows are part of a checkpoint (the callback's ``state_dict``: every rank's window, gathered,
as plain tensors), so a run resumed on the same number of ranks logs the figures the uninterrupted
run would have; resumed with another ``window`` or number of ranks, the window starts empty (with a
warning).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightrec._compat import logging_step
from lightrec.data.batch import Batch
from lightrec.metrics import SlidingWindow

__all__ = ["ProgressiveValidation"]


class ProgressiveValidation(pl.Callback):
    """Log AUC / NE of every training batch scored before the model trained on it (module docstring).

    Args:
        window: samples in the window over all ranks (each rank keeps ``ceil(window / world_size)``).
        metrics: metric names (``"auc"``, ``"ne"``, ``"calibration"``, ``"ctr"``, ``"accuracy"``).
        every_n_steps: compute and log every this many training steps; None: at the trainer's
            ``log_every_n_steps`` (the steps its loggers write).
        prefix: prefix of the logged names.

    Raises:
        ValueError: ``window`` or ``every_n_steps`` is not a positive int, or ``metrics`` is empty.
        TypeError: (during training) the training step did not return its logits.
    """

    #: the ``SlidingWindow`` states a checkpoint keeps, per metric
    _STATES = ("window_preds", "window_labels", "window_weights", "window_seen")

    def __init__(
        self,
        window: int = 100_000,
        metrics: Sequence[str] = ("auc", "ne"),
        every_n_steps: int | None = None,
        prefix: str = "online/",
    ) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"ProgressiveValidation(window=...) must be a positive int (samples), got {window!r}")
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int)
                                          or every_n_steps < 1):  # fmt: skip
            raise ValueError(f"ProgressiveValidation(every_n_steps=...) must be None or a positive int, got {every_n_steps!r}")
        if isinstance(metrics, str) or not metrics:
            raise ValueError(f"ProgressiveValidation(metrics=...) must be a non-empty list of names, got {metrics!r}")
        self.window = window
        self.metric_names = [str(m).lower() for m in metrics]
        for name in self.metric_names:
            SlidingWindow(name, window=1)  # an unknown name fails here, not at the first batch
        self.every_n_steps = every_n_steps
        self.prefix = prefix
        self.metrics: dict[str, SlidingWindow] = {}
        #: The values logged last (every rank).
        self.last_metrics: dict[str, float] = {}
        # a checkpoint's windows ({metric: {state: [world, ...] tensor}}) and last values, applied when training starts
        self._loaded: tuple[dict[str, dict[str, torch.Tensor]], dict[str, float]] | None = None

    @property
    @override
    def state_key(self) -> str:
        # two instances (other windows or metrics) keep their own windows in one checkpoint
        return self._generate_state_key(window=self.window, metrics=self.metric_names, prefix=self.prefix)

    @override
    def state_dict(self) -> dict[str, object]:
        """Every rank's windows (``[world_size, per-rank window]`` CPU tensors; a collective under
        torch.distributed: Lightning calls it on every rank when it saves a checkpoint)."""
        if not self.metrics:
            return {}
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        windows: dict[str, dict[str, torch.Tensor]] = {}
        for name, metric in self.metrics.items():
            windows[name] = {}
            for state in self._STATES:
                local = getattr(metric, state)
                if distributed:
                    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
                    dist.all_gather(parts, local.contiguous())
                    gathered = torch.stack(parts)
                else:
                    gathered = local.unsqueeze(0)
                windows[name][state] = gathered.detach().cpu().clone()
        return {"windows": windows, "last_metrics": dict(self.last_metrics)}

    @override
    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        """Keeps a checkpoint's windows; they replace the empty windows when training starts."""
        windows, last = state_dict.get("windows"), state_dict.get("last_metrics", {})
        if not isinstance(windows, dict) or not isinstance(last, dict):
            raise TypeError(
                f"ProgressiveValidation.load_state_dict(state_dict=...) needs the dict its state_dict() returned "
                f"(with 'windows'), got keys {sorted(map(str, state_dict))}"
            )
        self._loaded = windows, {str(k): float(v) for k, v in last.items()}

    def _restore(self, trainer: pl.Trainer) -> None:
        loaded, self._loaded = self._loaded, None
        if loaded is None:
            return
        (windows, last), world, rank = loaded, max(trainer.world_size, 1), trainer.global_rank
        for name, metric in self.metrics.items():
            saved = windows.get(name)
            shape = None if saved is None else tuple(saved["window_preds"].shape)
            if saved is None or shape != (world, metric.window):
                rank_zero_warn(
                    f"ProgressiveValidation: the checkpoint's {name!r} window ({shape}: ranks x samples) does not "
                    f"match this run's ({world}, {metric.window}); it starts empty",
                    category=UserWarning,
                )
                continue
            for state in self._STATES:
                target = getattr(metric, state)
                target.copy_(saved[state][rank].to(device=target.device, dtype=target.dtype))
        self.last_metrics = last

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            per_rank = max(math.ceil(self.window / max(trainer.world_size, 1)), 1)
            # validate_args off: the checks cost a device sync per step; logits come from a sigmoid
            self.metrics = {name: SlidingWindow(name, per_rank, validate_args=False) for name in self.metric_names}

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for metric in self.metrics.values():
            metric.reset()
            metric.to(pl_module.device)
        self._restore(trainer)  # a resumed fit: the checkpoint's windows

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        logits = outputs.get("logits") if isinstance(outputs, dict) else None
        if not isinstance(logits, torch.Tensor):
            raise TypeError(
                "ProgressiveValidation needs the logits of the training step: return {'loss': loss, 'logits': "
                "logits.detach()} from training_step (RecModule does), got "
                f"{type(outputs).__name__} outputs"
            )
        if not isinstance(batch, Batch):
            raise TypeError(f"ProgressiveValidation reads the labels of a lightrec.data.Batch, got {type(batch).__name__}")
        preds = torch.sigmoid(logits.detach().reshape(-1).float())
        for metric in self.metrics.values():
            metric.update(preds, batch.labels)
        # the Trainer sets log_every_n_steps in its logger connector (no declared attribute for type checkers)
        log_every = max(int(getattr(trainer, "log_every_n_steps", 1)), 1)
        step = logging_step(trainer)
        last = 0 < trainer.max_steps <= trainer.global_step  # the fit's last step: its summary shows the window
        if (step + 1) % (self.every_n_steps or log_every) == 0 or last:
            self._log(trainer, pl_module, batch.batch_size, step)

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch_size: int, step: int) -> None:
        values = {f"{self.prefix}{name}": metric.compute() for name, metric in self.metrics.items()}  # collective
        self.last_metrics = {k: float(v) for k, v in values.items()}
        # callback_metrics and the progress bar through Lightning; the loggers directly, at this step: Lightning
        # writes only at its own logging steps, and would write a value logged between them at the next one
        pl_module.log_dict(values, on_step=True, on_epoch=False, batch_size=batch_size, logger=False)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(self.last_metrics, step=step)
