"""The chart of a sharding plan, per rank: what the ``PlanReport`` callback logs and ``lightrec plan --png`` writes.

Two panels over the ranks (one bar group per rank, ticks at the integer ranks only)::

    memory per rank     table memory in the unit that suits the largest bar (KiB ... TiB); a bar
                        per memory kind that holds anything (HBM, DDR and, for tiered tables, SSD);
                        the cap of the table memory as a line only when it is near the bars
                        (within 4x of the largest), else named in the title, so 29 MiB of tables
                        are not drawn under a 128 GiB axis; tiered tables' expected cache hit rates
                        in the title
    cost per rank       estimated ms per training step, with the mean and the imbalance

The figure is built on an Agg canvas (no pyplot, no display), so it renders in any process.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from lightrec.distributed.planner.report import PlannerReport

__all__ = ["memory_unit", "plan_chart"]

_UNITS = (("B", 1), ("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3), ("TiB", 1024**4))
_CAP_NEAR = 4.0  # draw the cap line only when it is at most this many times the largest bar


def memory_unit(largest_bytes: float) -> tuple[str, int]:
    """``(name, bytes per unit)`` of the largest unit in which ``largest_bytes`` is at least 1."""
    name, size = _UNITS[0]
    for unit, unit_size in _UNITS:
        if largest_bytes >= unit_size:
            name, size = unit, unit_size
    return name, size


def _memory_panel(ax: Any, report: PlannerReport, ranks: np.ndarray) -> None:
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


def plan_chart(report: PlannerReport, path: str | os.PathLike[str] | None = None) -> Any:
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
