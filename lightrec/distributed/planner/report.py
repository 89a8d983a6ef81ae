"""The planner's report of a plan: what it decided and why, per rank -- as text, markdown and a chart.

``str(report)`` is a text table and :meth:`PlannerReport.to_markdown` the same as markdown.
:func:`plan_chart` draws a report: what the ``PlanReport`` callback logs and ``lightrec plan --png``
writes. Two panels over the ranks (one bar group per rank, ticks at the integer ranks only)::

    memory per rank     table memory in the unit that suits the largest bar (KiB ... TiB); a bar
                        per memory kind that holds anything (HBM, DDR and, for tiered tables, SSD);
                        the cap of the table memory as a line only when it is near the bars
                        (within 4x of the largest), else named in the title, so 29 MiB of tables
                        are not drawn under a 128 GiB axis; tiered tables' expected cache hit rates
                        in the title
    cost per rank       estimated ms per training step, with the mean and the imbalance

The figure is built on an Agg canvas (no pyplot, no display), so it renders in any process.

``PlanReport`` is the former name of :class:`PlannerReport`, kept as an alias so old imports keep
working; the Lightning callback that shows a report is ``lightrec.lightning.PlanReport``.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # matplotlib is imported only when a chart is drawn (see plan_chart)
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["PlanReport", "PlannerReport", "TableReport", "memory_unit", "plan_chart"]

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
        kernel_lines: on CPU, which kernel serves the fused tables and why
            (``planning.cpu_kernel_report``); empty elsewhere.

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
    kernel_lines: list[str] = field(default_factory=list)

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
            *(["CPU kernels of the fused tables:", *self.kernel_lines] if self.kernel_lines else []),
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


# ---- the chart ---------------------------------------------------------------------------------
_UNITS = (("B", 1), ("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3), ("TiB", 1024**4))
_CAP_NEAR = 4.0  # draw the cap line only when it is at most this many times the largest bar


def memory_unit(largest_bytes: float) -> tuple[str, int]:
    """``(name, bytes per unit)`` of the largest unit in which ``largest_bytes`` is at least 1."""
    name, size = _UNITS[0]
    for unit, unit_size in _UNITS:
        if largest_bytes >= unit_size:
            name, size = unit, unit_size
    return name, size


def _memory_panel(ax: Axes, report: PlannerReport, ranks: np.ndarray) -> None:
    ssd = report.ssd_bytes if len(report.ssd_bytes) == report.world_size else np.zeros(report.world_size)
    kinds = [
        (k, b)
        for k, b in (("HBM", report.hbm_bytes), ("DDR", report.ddr_bytes), ("SSD", ssd))
        if float(np.max(b)) > 0
    ]
    caps = report.hbm_caps if report.compute_device == "cuda" else report.ddr_caps
    largest = max((float(np.max(b)) for _, b in kinds), default=0.0)
    unit, scale = memory_unit(max(largest, 1.0))
    width = 0.8 / max(len(kinds), 1)
    for i, (kind, used) in enumerate(kinds):
        offset = (i - (len(kinds) - 1) / 2) * width
        ax.bar(ranks + offset, used / scale, width=width, label=kind)
    cap = float(np.max(caps)) if len(caps) else 0.0
    title = "table memory per rank"
    if cap > 0 and (largest == 0 or cap <= _CAP_NEAR * largest):
        edges = np.append(ranks, ranks[-1] + 1) - 0.5
        ax.step(edges, np.append(caps, caps[-1]) / scale, where="post", color="red", linewidth=1, label="cap")
    elif cap > 0:
        cap_unit, cap_scale = memory_unit(cap)
        title += f" (cap {cap / cap_scale:.4g} {cap_unit} per rank, off the scale)"
    hits = [f"{t.table} {100 * (t.expected_hit_rate or 0.0):.0f}%" for t in report.tiered_tables]
    if hits:
        title += "\nexpected cache hit rate: " + ", ".join(hits[:6]) + (" ..." if len(hits) > 6 else "")
    ax.set_ylim(0, max(largest / scale * 1.15, 1e-9) if largest else 1)
    ax.set_ylabel(unit)
    ax.set_title(title)
    if kinds:
        ax.legend(loc="upper right", fontsize="small")


def plan_chart(report: PlannerReport, path: str | os.PathLike[str] | None = None) -> Figure:
    """Bar chart of table memory and estimated cost per rank (see the module docstring).

    Args:
        report: the planner's report of the plan.
        path: when given, also write the chart there as PNG.

    Returns:
        The ``matplotlib.figure.Figure``.
    """
    # matplotlib costs ~0.25 s to import: only a chart that is drawn pays for it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator

    ranks = np.arange(report.world_size)
    fig = Figure(figsize=(max(6.0, 0.25 * report.world_size + 3), 6.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax_mem, ax_cost = fig.subplots(2, 1, sharex=True)
    _memory_panel(ax_mem, report, ranks)
    cost_ms = report.cost_s * 1e3
    ax_cost.bar(ranks, cost_ms, color="tab:green")
    ax_cost.axhline(
        float(cost_ms.mean()),
        color="black",
        linestyle="--",
        linewidth=1,
        label=f"mean (imbalance {report.imbalance:.2f})",
    )
    ax_cost.set_ylim(0, max(float(cost_ms.max()) * 1.15, 1e-9))
    ax_cost.set_ylabel("ms / step (estimated)")
    ax_cost.set_xlabel("rank")
    ax_cost.set_title("estimated cost per rank")
    ax_cost.legend(loc="upper right", fontsize="small")
    step = max(1, int(np.ceil(report.world_size / 32)))  # at most ~32 labels on a wide cluster
    ax_cost.xaxis.set_major_locator(FixedLocator(ranks[::step].tolist()))
    ax_cost.set_xlim(-0.5, report.world_size - 0.5)
    if path is not None:
        fig.savefig(os.fspath(path), format="png", dpi=100)
    return fig
