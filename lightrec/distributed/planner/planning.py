"""Plan a model, and report on any plan: the functions every entry point that shards a model calls.

So a model is planned the same way whichever entry point is used::

    DistributedModelParallel(module)          get_default_sharders() -> plan_sharding(collective=True)
    RecStrategy(fused_params=..., ...)         get_default_sharders(fused_params, kernel_backend)
                                               -> plan_sharding(topology, constraints, collective=True)
    lightrec plan <config>                     get_default_sharders(fused_params) -> plan_sharding(...)
    PlanReport callback (a given plan)         plan_report_for(model, plan, topology, sharders)

:func:`plan_sharding` returns the plan together with the planner's :class:`PlannerReport`
(:class:`PlanningResult`); :func:`topology_for` builds the ``Topology`` of a world from its size,
ranks per host and device type. The sharders come from the caller
(``lightrec.distributed.get_default_sharders`` for the collections lightrec shards), so this file
never depends on the sharded modules.

On CPU every report also says which kernel serves the plan's ``fused`` tables, and why
(:func:`cpu_kernel_report`): ``kernel_backend="auto"`` chooses between fbgemm's TBE and the torch
kernel with the native update per case (``lightrec.kernels.cpu_kernel_choice``), and the verdict
asked here is the one the kernels take when they are built (the same cache, the same case), so
``lightrec plan`` and the plan report say what will run at no extra cost.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch.distributed as dist
from torch import nn

from lightrec.distributed.planner.plan import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    ModuleSharder,
    ShardingPlan,
)
from lightrec.distributed.planner.plan.builders import shardable_modules
from lightrec.distributed.planner.plan.sharder import PooledTables, SequenceTables, table_configs
from lightrec.distributed.planner.planners import EmbeddingShardingPlanner
from lightrec.distributed.planner.report import PlannerReport
from lightrec.distributed.planner.types import ParameterConstraints, Topology
from lightrec.kernels.cpu_kernel_choice import cpu_kernel_lines
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.optim.fused_spec import FusedOptimizerSpec

__all__ = ["KernelBackendSharder", "PlanningResult", "cpu_kernel_report", "plan_report_for", "plan_sharding",
           "topology_for"]  # fmt: skip


def topology_for(world_size: int, device_type: str, local_world_size: int | None = None) -> Topology:
    """The ``Topology`` of ``world_size`` ranks on ``device_type`` devices, with the defaults of
    that device (memory caps, bandwidths).

    Args:
        world_size: number of ranks.
        device_type: ``"cuda"`` plans for GPU memory; anything else (``"cpu"``) for host memory.
        local_world_size: ranks per host; None, or a count that does not divide ``world_size``,
            means one host.
    """
    local = local_world_size if local_world_size and world_size % local_world_size == 0 else None
    return Topology(
        world_size=world_size,
        local_world_size=local,
        compute_device="cuda" if device_type == "cuda" else "cpu",
    )


@dataclass(frozen=True)
class PlanningResult:
    """A plan and the planner's report of it.

    Attributes:
        plan: one module plan per shardable module (an empty module plan for modules without tables).
        report: per-rank memory and estimated cost of ``plan``; None when there were no tables.
    """

    plan: ShardingPlan
    report: PlannerReport | None


def plan_sharding(
    module: nn.Module,
    sharders: Sequence[ModuleSharder],
    topology: Topology,
    constraints: Mapping[str, ParameterConstraints] | None = None,
    batch_size: int | None = None,
    collective: bool = False,
    pg: dist.ProcessGroup | None = None,
) -> PlanningResult:
    """Plan every shardable module of ``module`` with ``EmbeddingShardingPlanner``.

    Args:
        module: the model (its collections may be on ``meta``).
        sharders: which module types are sharded, and their fused optimizers (storage model).
        topology: the cluster the plan is for.
        constraints: ``{table name: ParameterConstraints}``.
        batch_size: per-rank batch size of the cost model (default: the planner's).
        collective: plan on rank 0 of ``pg`` and broadcast the plan and report, so every rank
            uses the identical plan (collective; ``topology.world_size`` must be the group's size).
            False: plan in this process alone.
        pg: the process group of a collective plan (None: the default group).

    Raises:
        PlannerError: no plan fits the topology (on every rank, when collective).
    """
    planner = EmbeddingShardingPlanner(
        topology=topology, batch_size=batch_size, constraints=dict(constraints) if constraints else None
    )
    if collective:
        plan = planner.collective_plan(module, list(sharders), pg)
    else:
        plan = planner.plan(module, list(sharders))
    report = planner.last_report
    if report is not None and topology.compute_device == "cpu":
        # The verdict each rank's kernels take when they are built (same cache), said up front.
        report.kernel_lines = cpu_kernel_report(module, sharders, plan)
    return PlanningResult(plan, report)


def _unsharded_twin(sharded: nn.Module) -> nn.Module | None:
    """An unsharded ``meta`` collection with the tables of ``sharded`` (None: not a known kind)."""
    if isinstance(sharded, PooledTables):
        return EmbeddingBagCollection(list(sharded.embedding_bag_configs()), is_weighted=sharded.is_weighted(), device="meta")
    if isinstance(sharded, SequenceTables):
        return EmbeddingCollection(list(sharded.embedding_configs()), device="meta")
    return None


def _unsharded_model(model: nn.Module, plan: ShardingPlan) -> tuple[nn.Module, list[str]]:
    """A module tree holding, at each path of ``plan``, a meta collection with the same tables.

    The planner's ``evaluate`` reads table configs from unsharded collections, and a sharded model
    holds only sharded ones; ``meta`` tables cost no memory.

    Returns:
        ``(root, paths of the plan that could not be rebuilt)``.
    """
    root: nn.Module = nn.Module()
    skipped: list[str] = []
    for path in plan.plan:
        try:
            sharded = model.get_submodule(path)
        except AttributeError:
            skipped.append(path)
            continue
        twin = _unsharded_twin(sharded)
        if twin is None:
            skipped.append(path)
        elif path == "":
            return twin, [p for p in plan.plan if p != ""]
        else:
            parent = root
            *parents, name = path.split(".")
            for part in parents:
                if not hasattr(parent, part):
                    parent.add_module(part, nn.Module())
                parent = parent.get_submodule(part)
            parent.add_module(name, twin)
    return root, skipped


def plan_report_for(
    model: nn.Module,
    plan: ShardingPlan,
    topology: Topology,
    sharders: Sequence[ModuleSharder],
) -> PlannerReport:
    """The planner's :class:`PlannerReport` of ``plan`` (any plan, e.g. one given by hand) on ``model``.

    Args:
        model: the module the plan's paths are relative to (sharded or not).
        plan: the plan in use.
        topology: the cluster (world size, device, memory caps) the report is drawn against.
        sharders: the sharders of the plan's modules; their fused optimizer's state counts towards
            table memory (``lightrec.distributed.get_default_sharders(fused_params)``).

    Raises:
        ValueError: ``topology.world_size`` is smaller than a rank the plan uses.
    """
    unsharded, skipped = _unsharded_model(model, plan)
    if skipped:
        warnings.warn(
            f"plan_report_for: modules {skipped} are not (sharded) EmbeddingBagCollection/EmbeddingCollection; "
            "their tables are left out of the report",
            stacklevel=2,
        )
    report = EmbeddingShardingPlanner(topology=topology).evaluate(unsharded, list(sharders), plan)
    if topology.compute_device == "cpu":
        report.kernel_lines = cpu_kernel_report(unsharded, sharders, plan)
    return report


# ---- which fused CPU kernel serves the plan's tables ---------------------------------------------
@runtime_checkable
class KernelBackendSharder(Protocol):
    """A sharder that says which lookup kernels its shards run (lightrec's collection sharders)."""

    kernel_backend: str


def _spec(sharder: ModuleSharder) -> FusedOptimizerSpec:
    # As the sharded collections read it (tiering keys ignored); none given: their default, SGD.
    return FusedOptimizerSpec.coerce(sharder.fused_params or None) or FusedOptimizerSpec()


def cpu_kernel_report(module: nn.Module, sharders: Sequence[ModuleSharder], plan: ShardingPlan) -> list[str]:
    """Lines saying which kernel serves the ``fused`` tables of ``plan`` on CPU, and why.

    Args:
        module: the planned model (its collections may be on ``meta``).
        sharders: the sharders the plan was made with (their fused optimizer and kernel backend).
        plan: the plan; only its ``fused`` tables are reported (tiered, dense and data-parallel
            tables run other kernels).

    Returns:
        ``[]`` when no fused table is planned; else per sharder optimizer a header line, then one
        line per dim bucket (``cpu_kernel_lines``), or one line naming the forced backend.
    """
    groups: dict[tuple[str, str], tuple[FusedOptimizerSpec, list[int]]] = {}
    for path, (collection, sharder) in shardable_modules(module, list(sharders)).items():
        module_plan = plan.plan.get(path, EmbeddingModuleShardingPlan())
        fused = [config.embedding_dim for name, config in table_configs(sharder, collection).items()
                 if name in module_plan and module_plan[name].compute_kernel == EmbeddingComputeKernel.FUSED.value]  # fmt: skip
        if not fused:
            continue
        backend = sharder.kernel_backend if isinstance(sharder, KernelBackendSharder) else "auto"
        spec = _spec(sharder)
        key = (backend, spec.optimizer.value)
        groups.setdefault(key, (spec, []))[1].extend(fused)
    lines = []
    for (backend, optimizer), (spec, dims) in sorted(groups.items()):
        if backend != "auto":
            lines.append(f"fused {optimizer} ({len(dims)} tables): kernel_backend={backend!r} (chosen by the sharder)")
            continue
        lines.append(f"fused {optimizer}, kernel_backend='auto':")
        lines.extend(cpu_kernel_lines(dims, spec))
    return lines
