"""Which fused CPU kernel serves a plan's tables, and why: the lines the plan report prints.

On CPU, ``kernel_backend="auto"`` chooses between fbgemm's TBE and the torch kernel with the native
update per case (``lightrec.kernels.cpu_kernel_choice``: intra-op threads, dim bucket, optimizer,
ids per bag). A plan decides which tables are ``fused``; this file asks that choice for them, per
sharder optimizer and dim bucket, so ``lightrec plan`` and the plan report say what will run
before a step is trained. The verdict is the one the kernels take when they are built (the same
cache, the same case), so asking it here costs nothing extra: a case not decided yet is measured
once (well under a second) and remembered by process and by file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from torch import nn

from lightrec.distributed.planner.plan import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    ModuleSharder,
    ShardingPlan,
)
from lightrec.distributed.planner.plan.builders import shardable_modules
from lightrec.distributed.planner.plan.sharder import table_configs
from lightrec.kernels.cpu_kernel_choice import cpu_kernel_lines
from lightrec.optim.fused_spec import FusedOptimizerSpec

__all__ = ["KernelBackendSharder", "cpu_kernel_report"]


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
