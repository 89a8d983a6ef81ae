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
    if x >= 1024**4:
        return f"{x / 1024**4:.3g} TiB"
    return f"{x / 1024**3:.3g} GiB" if x >= 1024**3 else f"{x / 1024**2:.3g} MiB"


@dataclass
class TableReport:
    """One table's decision: ``cost_s``/``storage_bytes`` are summed over its shards (and replicas).

    A tiered table (``fused_uvm_caching`` / ``key_value``) also has its cache load factor, the
    expected share of id lookups its cache serves, and the bytes of its backing tier (host memory
    behind a GPU, or SSD); ``storage_bytes`` is then its fast-memory part (cache and slot index).
    """

    module: str
    table: str
    sharding_type: str
    compute_kernel: str
    ranks: list[int]
    cost_s: float
    storage_bytes: float
    cache_load_factor: float | None = None
    expected_hit_rate: float | None = None
    host_bytes: float = 0.0
    ssd_bytes: float = 0.0

    @property
    def tiered(self) -> bool:
        return self.cache_load_factor is not None


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
        ssd_bytes, ssd_caps: ``[W]`` SSD use (``key_value`` tables) and capacity per rank.

    On ``cuda`` the DDR column is the host memory that ``fused_uvm_caching`` tables fill; on ``cpu``
    it is the table memory itself.
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
    ssd_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ssd_caps: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def tiered_tables(self) -> list[TableReport]:
        """The tables the plan keeps in a backing tier behind a cache."""
        return [t for t in self.tables if t.tiered]

    def _has_ssd(self) -> bool:
        return len(self.ssd_bytes) == self.world_size and float(np.max(self.ssd_bytes, initial=0.0)) > 0

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
            ssd = [f"{_gib(self.ssd_bytes[r])} / {_gib(self.ssd_caps[r])}"] if self._has_ssd() else []
            rows.append(
                [
                    str(r),
                    f"{_gib(self.hbm_bytes[r])} / {_gib(self.hbm_caps[r])}",
                    f"{_gib(self.ddr_bytes[r])} / {_gib(self.ddr_caps[r])}",
                    *ssd,
                    f"{self.cost_s[r] * 1e3:.4g}",
                    shown,
                ]
            )
        return rows

    def _header(self) -> list[str]:
        header = list(self._HEADER)
        if self._has_ssd():
            header.insert(3, "SSD used / cap")
        return header

    def _tiered_lines(self) -> list[str]:
        """One line per tiered table: kernel, cache size, expected hit rate, bytes per tier."""
        fast = "HBM" if self.compute_device == "cuda" else "DDR"
        lines = []
        for t in self.tiered_tables:
            backing = f"SSD {_gib(t.ssd_bytes)}" if t.ssd_bytes else f"host DDR {_gib(t.host_bytes)}"
            lines.append(
                f"tiered: {t.table} ({t.compute_kernel}, cache load factor {t.cache_load_factor:g}, expected hit "
                f"rate {100 * (t.expected_hit_rate or 0.0):.1f}%): {fast} {_gib(t.storage_bytes)}, {backing}"
            )
        return lines

    def _summary(self) -> list[str]:
        kinds = Counter(t.sharding_type for t in self.tables)
        types = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        return [
            f"{len(self.tables)} tables on {self.world_size} ranks ({self.compute_device}); sharding types: {types or '-'}",
            f"estimated cost per step: max {self.max_cost_s * 1e3:.4g} ms, mean "
            f"{float(self.cost_s.mean()) * 1e3:.4g} ms, imbalance (max/mean) {self.imbalance:.3f}",
            f"planned in {self.planning_s:.3f} s (proposal: {self.proposer or '-'})",
            *self._tiered_lines(),
        ]

    _HEADER = ["rank", "HBM used / cap", "DDR used / cap", "est. cost (ms/step)", "tables"]

    def to_text(self, max_tables: int = 8) -> str:
        """Aligned text table, one row per rank, then a summary."""
        header = self._header()
        rows = [header] + self._rows(max_tables)
        widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
        lines = [
            " | ".join([c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)] + [r[-1]]) for r in rows
        ]
        lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-" + "-" * 6)
        return "\n".join(lines + [""] + self._summary())

    def __str__(self) -> str:
        return self.to_text()

    def to_markdown(self, max_tables: int = 8) -> str:
        """GitHub markdown table, one row per rank, then the summary as a list."""
        header = self._header()
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in self._rows(max_tables)]
        return "\n".join(lines + [""] + [f"- {s}" for s in self._summary()])

#: Former name of :class:`PlannerReport` (an alias: the same class). Renamed because the Lightning
#: callback ``lightrec.lightning.PlanReport`` has that name.
PlanReport = PlannerReport
