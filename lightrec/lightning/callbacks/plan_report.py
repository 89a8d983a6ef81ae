"""``PlanReport`` callback: show the sharding plan at fit start, on the console and in TensorBoard.

At ``on_fit_start`` (``RecStrategy.setup`` has planned and sharded the model by then) rank 0

* prints the per-rank plan table (memory used / cap, estimated cost, tables on each rank);
* writes to every ``TensorBoardLogger`` of the trainer, at the current global step:

  ==============  =======  ==================================================================
  tag             kind     content
  ==============  =======  ==================================================================
  ``plan/table``  text     markdown: per-rank table + summary, then one row per table
                           (module, table, sharding type, kernel, ranks, storage, est. cost)
  ``plan/chart``  image    bar chart: table memory and estimated cost per rank (``plan_chart``)
  ``plan/json``   text     the ``ShardingPlan`` JSON in a fenced block (see
                           :func:`load_plan_from_events`)
  ==============  =======  ==================================================================

The numbers come from the planner's cost model: the strategy's ``plan_report`` when it exposes
one (the report of the planning run), otherwise the planner's ``evaluate`` of the plan in use,
applied to the tables of the sharded collections. Nothing here is collective: ranks other than 0
do nothing, so the callback cannot desynchronise the job.

A strategy without a ``ShardingPlan`` (not ``RecStrategy``, e.g. a one-process run of a recipe
whose config lists the callback) gets one info line and no report. A
plan the cost model cannot estimate (a warning says why) is still printed and logged, as the
plan's own per-table listing, without the chart.
"""

from __future__ import annotations

import os
import re
from typing import Any

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util
from typing_extensions import override

from lightrec.distributed.dmp.default_sharders import get_default_sharders
from lightrec.distributed.planner import PlannerReport, ShardingPlan, plan_report_for, topology_for
from lightrec.distributed.planner.report import plan_chart
from lightrec.lightning.contracts import EmbeddingShardingStrategy, PlannedStrategy

__all__ = ["PlanReport", "load_plan_from_events"]

_JSON_BLOCK = re.compile(r"```(?:json)?\s*\n(.*?)\n```", re.DOTALL)


def _mib(x: float) -> str:
    return f"{x / 1024**2:.4g} MiB"


def _tables_markdown(report: PlannerReport) -> str:
    """One markdown row per table: module, table, sharding type, kernel, ranks, storage, est. cost; and
    for plans with tiered tables their cache load factor, expected hit rate and backing-tier bytes."""
    tiered = bool(report.tiered_tables)
    extra = " cache load factor | expected hit rate | host memory | SSD |" if tiered else ""
    lines = [
        "| module | table | sharding | kernel | ranks | storage (all shards) | est. cost (ms/step) |" + extra,
        "|---|---|---|---|---|---|---|" + ("---|---|---|---|" if tiered else ""),
    ]
    for t in report.tables:
        ranks = ",".join(str(r) for r in t.ranks)
        row = (
            f"| {t.module or '(root)'} | {t.table} | {t.sharding_type} | {t.compute_kernel} | {ranks} "
            f"| {_mib(t.storage_bytes)} | {t.cost_s * 1e3:.4g} |"
        )
        if tiered:
            row += (
                f" {t.cache_load_factor:g} | {100 * (t.expected_hit_rate or 0.0):.1f}% | {_mib(t.host_bytes)} "
                f"| {_mib(t.ssd_bytes)} |" if t.tiered else " - | - | - | - |"
            )
        lines.append(row)
    return "\n".join(lines)


def _figure_to_rgb(fig: Any) -> np.ndarray:
    """Render a matplotlib figure on an Agg canvas to ``[H, W, 3]`` uint8 (no pyplot involved)."""
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def load_plan_from_events(path: str | os.PathLike[str], tag: str = "plan/json") -> ShardingPlan:
    """Read back the plan :class:`PlanReport` wrote to a TensorBoard log directory (or event file).

    Raises:
        KeyError: the events hold no ``tag`` text (the run had no ``PlanReport`` callback).
    """
    events = EventAccumulator(os.fspath(path), size_guidance={"tensors": 0}).Reload()
    key = f"{tag}/text_summary"  # SummaryWriter.add_text's tag suffix
    if key not in events.Tags().get("tensors", []):
        raise KeyError(
            f"no {key!r} in the TensorBoard events at {os.fspath(path)!r}; was PlanReport a callback?"
        )
    text = tensor_util.make_ndarray(events.Tensors(key)[-1].tensor_proto).item()
    text = text.decode() if isinstance(text, bytes) else str(text)
    match = _JSON_BLOCK.search(text)
    return ShardingPlan.from_json(match.group(1) if match else text)


class PlanReport(pl.Callback):
    """Print the sharding plan on rank 0 and log its table, chart and JSON to TensorBoard at fit start.

    Args:
        max_tables: table names listed per rank in the per-rank table (the rest are counted);
            the per-table section of ``plan/table`` always lists every table.
        log_chart: also render the per-rank chart (``plan/chart``; costs ~0.2 s of matplotlib).
        tag_prefix: prefix of the TensorBoard tags (``"plan"`` gives ``plan/table`` ...).

    After fit start, :attr:`report` holds the planner report that was shown (rank 0 only).
    """

    def __init__(self, max_tables: int = 8, log_chart: bool = True, tag_prefix: str = "plan") -> None:
        if not isinstance(max_tables, int) or max_tables < 1:
            raise ValueError(f"PlanReport(max_tables=...) must be a positive int, got {max_tables!r}")
        self.max_tables = max_tables
        self.log_chart = log_chart
        self.tag_prefix = tag_prefix.rstrip("/")
        self.report: PlannerReport | None = None
        self._warned_no_plan = False

    # ------------------------------------------------------------------ report
    def _report(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, plan: ShardingPlan
    ) -> PlannerReport:
        strategy = trainer.strategy
        sharding = strategy if isinstance(strategy, EmbeddingShardingStrategy) else None  # else: a plan only
        if sharding is not None and sharding.plan_report is not None:
            return sharding.plan_report
        topology = sharding.topology if sharding is not None else None
        if topology is None:
            local = strategy.num_processes if isinstance(strategy, DDPStrategy) else trainer.world_size
            topology = topology_for(trainer.world_size, trainer.strategy.root_device.type, local or trainer.world_size)
        fused = sharding.fused_params if sharding is not None else None
        return plan_report_for(pl_module, plan, topology, get_default_sharders(fused or None))

    def _text(self, report: PlannerReport) -> str:
        return "\n\n".join(
            [
                "### per rank",
                report.to_markdown(self.max_tables),
                f"### per table ({len(report.tables)})",
                _tables_markdown(report),
            ]
        )

    # ------------------------------------------------------------------ hook
    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strategy = trainer.strategy
        plan = strategy.plan if isinstance(strategy, PlannedStrategy) else None
        if not isinstance(plan, ShardingPlan):
            if not self._warned_no_plan:
                rank_zero_info(
                    f"PlanReport: the strategy {type(trainer.strategy).__name__} does not shard the model, so there "
                    "is no sharding plan to report (strategy=lightrec.lightning.RecStrategy() shards it)"
                )
                self._warned_no_plan = True
            return
        if not trainer.is_global_zero:
            return
        try:
            self.report = self._report(trainer, pl_module, plan)
        except (KeyError, TypeError, ValueError) as exc:
            # A plan the cost model cannot read (e.g. tables of a custom sharder) must not stop the
            # run on rank 0 alone: fall back to the plan's own table and keep the JSON.
            rank_zero_warn(
                f"PlanReport: could not estimate the plan ({exc}); logging the plan without estimates"
            )
            self.report = None
        report = self.report
        if report is not None:
            rank_zero_info(
                f"Sharding plan ({report.proposer or 'given'}):\n{report.to_text(self.max_tables)}"
            )
            text = self._text(report)
        else:
            rank_zero_info(f"Sharding plan:\n{plan}")
            text = "```text\n" + str(plan) + "\n```"
        writers = [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not writers:
            return
        step = trainer.global_step
        plan_json = "```json\n" + plan.to_json(indent=2) + "\n```"
        image = None
        if self.log_chart and report is not None and report.world_size > 0:
            image = _figure_to_rgb(plan_chart(report))
        for writer in writers:
            writer.add_text(f"{self.tag_prefix}/table", text, global_step=step)
            writer.add_text(f"{self.tag_prefix}/json", plan_json, global_step=step)
            if image is not None:
                writer.add_image(f"{self.tag_prefix}/chart", image, global_step=step, dataformats="HWC")
            writer.flush()  # visible in TensorBoard right away, not at the first scalar flush
