"""``ManagedCollisionMonitor`` callback: how full the managed-collision tables are, how fast they churn.

Every ``every_n_steps`` training steps (optimizer steps, windows aligned to the trainer's step
counter, and at the end of training) each rank sums the counters
(``mc_stats()``) of the managed-collision modules it holds -- the unsharded ones of a
``ManagedCollisionCollection`` and this rank's shards of a sharded one -- and one ``all_reduce``
(a ``[tables, 6]`` float64 tensor) adds them up over ranks. Rank 0 logs, to every logger of the
trainer (TensorBoard's included), at the step of the window's last batch:

=============================================  ===================================================
tag (``prefix`` = ``"mc/"``)                   value
=============================================  ===================================================
``mc/<table>/occupancy``                       rows holding an id / rows ids may hold (now)
``mc/<table>/evictions``                       ids evicted in the window (their rows reset)
``mc/<table>/insertions``                      ids that got a row in the window
``mc/<table>/default_row_share``               lookups that fell on a default row (an id without
                                               a row yet) / lookups, in the window
``mc/occupancy``, ``mc/evictions``,            the same over all tables
``mc/insertions``, ``mc/default_row_share``
=============================================  ===================================================

An unsharded module trained by several data-parallel ranks is counted once (its counters are
averaged over ranks, not added).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn
from typing_extensions import override

from lightrec.distributed.mc_modules import ShardedManagedCollisionCollection
from lightrec.lightning.callbacks.step_window import WindowedMonitor
from lightrec.modules.managed_collision.collection import ManagedCollisionCollection

__all__ = ["ManagedCollisionMonitor", "managed_collision_counters"]

_FIELDS = ("rows", "occupied", "lookups", "default_lookups", "inserted", "evicted")
_CUMULATIVE = ("lookups", "default_lookups", "inserted", "evicted")


def managed_collision_counters(model: nn.Module) -> dict[str, tuple[dict[str, float], bool]]:
    """``{table: (summed mc_stats of this rank's modules, sharded)}`` over every managed-collision
    collection of ``model``; every rank lists the same tables (sharded ones with zeros where it
    holds no rows)."""
    out: dict[str, tuple[dict[str, float], bool]] = {}

    def add(table: str, stats: dict[str, float], sharded: bool) -> None:
        total, _ = out.get(table, ({f: 0.0 for f in _FIELDS}, sharded))
        for f in _FIELDS:
            total[f] += float(stats.get(f, 0.0))
        out[table] = (total, sharded)

    for module in model.modules():
        if isinstance(module, ShardedManagedCollisionCollection):
            stats = module.stats()
            for table in module.tables():
                add(table, stats.get(table, {}), True)
        elif isinstance(module, ManagedCollisionCollection):
            for table, mc in module.modules_by_table().items():
                add(table, mc.mc_stats(), False)
    return dict(sorted(out.items()))


class ManagedCollisionMonitor(WindowedMonitor):
    """Log occupancy, evictions, insertions and default-row share of managed-collision tables.

    Args:
        every_n_steps: steps per window (optimizer steps), aligned to the trainer's step counter as
            ``lightrec.lightning.callbacks.step_window`` says; the last, shorter window is logged at
            train end.
        prefix: prefix of the logged tags.
        per_table: also log one set of tags per table (not only the totals).

    Every rank must run the callback (one ``all_reduce`` per window); rank 0 writes the logs.
    :attr:`last_metrics` holds the latest window's values on every rank.

    Raises:
        ValueError: ``every_n_steps`` is not a positive int.
    """

    def __init__(self, every_n_steps: int = 50, prefix: str = "mc/", per_table: bool = True) -> None:
        super().__init__("ManagedCollisionMonitor", every_n_steps)
        self.prefix = prefix
        self.per_table = per_table
        self.last_metrics: dict[str, float] = {}
        self._previous: torch.Tensor | None = None  # cumulative counters at the last window's end

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window.reset()
        self._previous = self._reduced(trainer, pl_module)[1]

    def _reduced(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[list[str], torch.Tensor]:
        """``(tables, [tables, 6] counters summed over ranks)``, data-parallel replicas counted once."""
        counters = managed_collision_counters(pl_module)
        tables = list(counters)
        rows = [[stats[f] for f in _FIELDS] for stats, _ in counters.values()]
        local = torch.tensor(rows, dtype=torch.float64).reshape(len(tables), len(_FIELDS))
        world = trainer.world_size
        if world > 1 and tables:
            device = trainer.strategy.root_device
            summed = trainer.strategy.reduce(local.to(device), reduce_op="sum")
            local = summed.cpu() if isinstance(summed, torch.Tensor) else local
            replicated = torch.tensor([not sharded for _, sharded in counters.values()])
            local[replicated] /= world
        return tables, local

    @override
    def _flush(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = self._window.last_step
        self._window.reset()
        tables, now = self._reduced(trainer, pl_module)
        before = self._previous if self._previous is not None and self._previous.shape == now.shape else torch.zeros_like(now)
        self._previous = now
        window = now - before
        col = {f: i for i, f in enumerate(_FIELDS)}
        metrics: dict[str, float] = {}

        def describe(tag: str, now_row: torch.Tensor, window_row: torch.Tensor) -> None:
            rows, lookups = float(now_row[col["rows"]]), float(window_row[col["lookups"]])
            metrics[f"{self.prefix}{tag}occupancy"] = float(now_row[col["occupied"]]) / rows if rows else 0.0
            metrics[f"{self.prefix}{tag}evictions"] = float(window_row[col["evicted"]])
            metrics[f"{self.prefix}{tag}insertions"] = float(window_row[col["inserted"]])
            share = float(window_row[col["default_lookups"]]) / lookups if lookups else 0.0
            metrics[f"{self.prefix}{tag}default_row_share"] = share

        if tables:
            describe("", now.sum(0), window.sum(0))
            if self.per_table:
                for i, table in enumerate(tables):
                    describe(f"{table}/", now[i], window[i])
        self.last_metrics = metrics
        if metrics and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)
