"""Planner report: what the planner decided and why, per rank.

``str(report)`` is a text table and :meth:`PlannerReport.to_markdown` the same as markdown; the
chart of a report (memory and estimated cost per rank) is :func:`lightrec.distributed.planner.chart.plan_chart`.

``PlanReport`` is the former name of :class:`PlannerReport`, kept as an alias so old imports keep
working; the Lightning callback that shows a report is ``lightrec.lightning.PlanReport``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PlanReport", "PlannerReport", "TableReport"]

_ABBREV = {
    "table_wise": "TW",
    "row_wise": "RW",
    "column_wise": "CW",
    "table_row_wise": "TWRW",
    "table_column_wise": "TWCW",
    "data_parallel": "DP",
}


def _gib(x: float) -> str:
    return f"{x / 1024**3:.3g} GiB" if x >= 1024**3 else f"{x / 1024**2:.3g} MiB"


@dataclass
class TableReport:
    """One table's decision: ``cost_s``/``storage_bytes`` are summed over its shards (and replicas)."""

    module: str
    table: str
    sharding_type: str
    compute_kernel: str
    ranks: list[int]
    cost_s: float
    storage_bytes: float


@dataclass
class PlannerReport:
    """Per-rank memory and cost of a plan (what ``EmbeddingShardingPlanner`` decided, and why).

    Attributes:
        compute_device: ``"cpu"`` or ``"cuda"``.
        hbm_bytes, ddr_bytes, hbm_caps, ddr_caps: ``[W]`` use and capacity per rank.
        cost_s: ``[W]`` estimated seconds per training step per rank.
        tables: one :class:`TableReport` per table, in plan order.
        planning_s: wall time of the planner.
        proposer: which proposal won (``"greedy"`` or ``"memory_dp"``).
    """

    compute_device: str
    hbm_bytes: np.ndarray
    ddr_bytes: np.ndarray
    hbm_caps: np.ndarray
    ddr_caps: np.ndarray
    cost_s: np.ndarray
    tables: list[TableReport] = field(default_factory=list)
    planning_s: float = 0.0
    proposer: str = ""

    @property
    def world_size(self) -> int:
        return len(self.cost_s)

    @property
    def max_cost_s(self) -> float:
        return float(self.cost_s.max()) if len(self.cost_s) else 0.0

    @property
    def imbalance(self) -> float:
        """Busiest rank's cost over the mean cost (1.0 = perfectly balanced)."""
        mean = float(self.cost_s.mean()) if len(self.cost_s) else 0.0
        return self.max_cost_s / mean if mean > 0 else 1.0

    def tables_on(self, rank: int) -> list[str]:
        """``"name(TW)"`` entries for the tables with a shard on ``rank``."""
        return [f"{t.table}({_ABBREV[t.sharding_type]})" for t in self.tables if rank in t.ranks]

    def _rows(self, max_tables: int) -> list[list[str]]:
        rows = []
        for r in range(self.world_size):
            names = self.tables_on(r)
            shown = " ".join(names[:max_tables]) + (
                f" ... (+{len(names) - max_tables})" if len(names) > max_tables else ""
            )
            rows.append(
                [
                    str(r),
                    f"{_gib(self.hbm_bytes[r])} / {_gib(self.hbm_caps[r])}",
                    f"{_gib(self.ddr_bytes[r])} / {_gib(self.ddr_caps[r])}",
                    f"{self.cost_s[r] * 1e3:.4g}",
                    shown,
                ]
            )
        return rows

    def _summary(self) -> list[str]:
        kinds = Counter(t.sharding_type for t in self.tables)
        types = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        return [
            f"{len(self.tables)} tables on {self.world_size} ranks ({self.compute_device}); sharding types: {types or '-'}",
            f"estimated cost per step: max {self.max_cost_s * 1e3:.4g} ms, mean "
            f"{float(self.cost_s.mean()) * 1e3:.4g} ms, imbalance (max/mean) {self.imbalance:.3f}",
            f"planned in {self.planning_s:.3f} s (proposal: {self.proposer or '-'})",
        ]

    _HEADER = ["rank", "HBM used / cap", "DDR used / cap", "est. cost (ms/step)", "tables"]

    def to_text(self, max_tables: int = 8) -> str:
        """Aligned text table, one row per rank, then a summary."""
        rows = [self._HEADER] + self._rows(max_tables)
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._HEADER) - 1)]
        lines = [
            " | ".join([c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)] + [r[-1]]) for r in rows
        ]
        lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-" + "-" * 6)
        return "\n".join(lines + [""] + self._summary())

    def __str__(self) -> str:
        return self.to_text()

    def to_markdown(self, max_tables: int = 8) -> str:
        """GitHub markdown table, one row per rank, then the summary as a list."""
        lines = ["| " + " | ".join(self._HEADER) + " |", "|" + "---|" * len(self._HEADER)]
        lines += ["| " + " | ".join(r) + " |" for r in self._rows(max_tables)]
        return "\n".join(lines + [""] + [f"- {s}" for s in self._summary()])

#: Former name of :class:`PlannerReport` (an alias: the same class). Renamed because the Lightning
#: callback ``lightrec.lightning.PlanReport`` has that name.
PlanReport = PlannerReport
