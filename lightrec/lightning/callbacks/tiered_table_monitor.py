"""``TieredTableMonitor``: what the caches of tiered tables do, logged every few steps.

Tables larger than memory keep their rows on SSD or in host memory behind a cache of hot rows
(``lightrec.kernels.TieredBatchedLookup``). Every ``every_n_steps`` training steps (optimizer
steps: with ``accumulate_grad_batches=k`` a step is ``k`` batches) and at the end of training, this
callback sums the counters of every tiered kernel of the model over every rank and logs, for the
steps since the last log, to the trainer's loggers (TensorBoard's scalars), at the step of the
window's last batch (the step ``self.log`` gives that batch's ``train/loss``):

=================================  ==========================================================
tag                                value
=================================  ==========================================================
``tiered/hit_rate``                share of the ids looked up that were in the cache when their
                                   batch was first seen (its prefetch, else its lookup)
``tiered/rows_fetched_per_step``   rows read from the backing store, per step
``tiered/rows_written_per_step``   dirty rows written back (evictions and flushes), per step
``tiered/mib_per_step``            bytes moved both ways (rows and their optimizer state), MiB
``tiered/cache_fill``              cached rows over cache capacity, now
=================================  ==========================================================

The sum over ranks is one small all-reduce (every rank runs the hook at the same steps). Kernels
of fbgemm's ``MANAGED_CACHING`` (GPU, host-memory tables with fbgemm's CUDA build) keep their own
statistics and are not summed here.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightrec.kernels.batched_embedding import BatchedEmbedding, BatchedEmbeddingBag
from lightrec.kernels.tiered.backend import TieredBatchedLookup
from lightrec.lightning.callbacks.step_window import WindowedMonitor

__all__ = ["TieredTableMonitor", "tiered_kernels"]

_FIELDS = ("requested_ids", "missed_ids", "rows_fetched", "rows_written_back", "bytes_read", "bytes_written",
           "cached_rows", "cache_rows")  # fmt: skip


def tiered_kernels(module: torch.nn.Module) -> list[TieredBatchedLookup]:
    """Every lightrec tiered kernel inside ``module`` (its batched lookups' kernels)."""
    kernels = (m.kernel for m in module.modules() if isinstance(m, (BatchedEmbeddingBag, BatchedEmbedding)) and m.tiered)
    return [k for k in kernels if isinstance(k, TieredBatchedLookup)]


class TieredTableMonitor(WindowedMonitor):
    """Log the tiered tables' cache statistics (see the module docstring).

    Args:
        every_n_steps: steps per window; windows end at the steps ``every_n_steps - 1``,
            ``2 * every_n_steps - 1`` ... of the trainer's step counter (a resumed fit logs where an
            uninterrupted one does), and the last, shorter window at the end of training.
        prefix: tag prefix (``"tiered"`` gives ``tiered/hit_rate`` ...).
    """

    def __init__(self, every_n_steps: int = 10, prefix: str = "tiered") -> None:
        super().__init__("TieredTableMonitor", every_n_steps)
        self.prefix = prefix.rstrip("/")
        self._last: torch.Tensor | None = None  # the summed counters at the start of the window
        self.last_logged: dict[str, float] = {}

    def _totals(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> torch.Tensor:
        stats = [k.stats() for k in tiered_kernels(pl_module)]
        local = torch.tensor([float(sum(getattr(s, f) for s in stats)) for f in _FIELDS],  # the counters, by name
                             dtype=torch.float64)
        if trainer.world_size > 1:
            device = trainer.strategy.root_device
            summed: torch.Tensor = trainer.strategy.reduce(local.to(device), reduce_op="sum")
            return summed.cpu()
        return local

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not tiered_kernels(pl_module):
            rank_zero_warn("TieredTableMonitor: the model has no tiered tables; it logs nothing", category=UserWarning)
        self._last = self._totals(trainer, pl_module)
        self._window.reset()

    @override
    def _flush(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Log the window's figures (every rank calls it at the same step: the sum is a collective)."""
        now = self._totals(trainer, pl_module)
        last = self._last if self._last is not None else torch.zeros_like(now)
        d = dict(zip(_FIELDS, (now - last).tolist(), strict=True))
        steps, step = self._window.steps, self._window.last_step
        self._last = now
        self._window.reset()
        if not trainer.is_global_zero or not now[_FIELDS.index("cache_rows")]:
            return
        metrics = {
            "hit_rate": 1.0 - d["missed_ids"] / d["requested_ids"] if d["requested_ids"] else 1.0,
            "rows_fetched_per_step": d["rows_fetched"] / steps,
            "rows_written_per_step": d["rows_written_back"] / steps,
            "mib_per_step": (d["bytes_read"] + d["bytes_written"]) / steps / 2**20,
            "cache_fill": float(now[_FIELDS.index("cached_rows")] / now[_FIELDS.index("cache_rows")]),
        }
        self.last_logged = metrics
        for logger in trainer.loggers:
            logger.log_metrics({f"{self.prefix}/{k}": v for k, v in metrics.items()}, step=step)
