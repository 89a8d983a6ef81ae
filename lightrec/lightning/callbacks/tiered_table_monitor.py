"""``TieredTableMonitor``: what the caches of tiered tables do, logged every few steps.

Tables larger than memory keep their rows on SSD or in host memory behind a cache of hot rows
(``lightrec.kernels.TieredBatchedLookup``). Every ``every_n_steps`` training steps this callback
sums the counters of every tiered kernel of the model over every rank and logs, for the steps since
the last log, to the trainer's loggers (TensorBoard's scalars):

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
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightrec.kernels.batched_embedding import BatchedEmbedding, BatchedEmbeddingBag
from lightrec.kernels.tiered.backend import TieredBatchedLookup

__all__ = ["TieredTableMonitor", "tiered_kernels"]

_FIELDS = ("requested_ids", "missed_ids", "rows_fetched", "rows_written_back", "bytes_read", "bytes_written",
           "cached_rows", "cache_rows")  # fmt: skip


def tiered_kernels(module: torch.nn.Module) -> list[TieredBatchedLookup]:
    """Every lightrec tiered kernel inside ``module`` (its batched lookups' kernels)."""
    kernels = (m.kernel for m in module.modules() if isinstance(m, (BatchedEmbeddingBag, BatchedEmbedding)) and m.tiered)
    return [k for k in kernels if isinstance(k, TieredBatchedLookup)]


class TieredTableMonitor(pl.Callback):
    """Log the tiered tables' cache statistics (see the module docstring).

    Args:
        every_n_steps: log every this many training steps.
        prefix: tag prefix (``"tiered"`` gives ``tiered/hit_rate`` ...).
    """

    def __init__(self, every_n_steps: int = 10, prefix: str = "tiered") -> None:
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"TieredTableMonitor(every_n_steps=...) must be a positive int, got {every_n_steps!r}")
        self.every_n_steps = every_n_steps
        self.prefix = prefix.rstrip("/")
        self._last: torch.Tensor | None = None
        self._last_step = 0
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
        self._last_step = trainer.global_step

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: object, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step % self.every_n_steps or self._last is None or step == self._last_step:
            return
        now = self._totals(trainer, pl_module)
        d = dict(zip(_FIELDS, (now - self._last).tolist(), strict=True))
        steps = step - self._last_step
        self._last, self._last_step = now, step
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
