"""Data-parallel "sharding": every rank holds the whole table and looks up its own samples.

No input or output communication: the lookup runs on the local KJT and returns
``[B_local, sum D]`` (or one row per id). The gradient is synchronised in backward, per table, by
:class:`DataParallelTableSync`:

1. the kernel computes the table's dense gradient from the local batch (plain autograd);
2. a post-accumulate-grad hook all-reduces it and divides by the world size -- the gradient of the
   *mean* of the per-rank losses, exactly what DDP gives dense parameters and what the
   model-parallel shardings give their rows (docs/sharding.md);
3. the table's fused optimizer rule (``lightrec.kernels.sparse_update``) updates the rows whose
   averaged gradient is non-zero, and the gradient is freed.

So data-parallel tables behave like every other table of the collection: updated inside backward,
their optimizer state exposed and checkpointed through ``fused_optimizer``, invisible to the dense
optimizer (``in_backward_optimizer_filter``) and to DDP. All replicas start identical (the shard
initialisation is seeded, or copied from the unsharded module) and stay identical.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.comm import Awaitable, NoWait
from lightrec.distributed.comm.failures import collective_guard, timeout_of
from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.sharding.common import (
    DistContext,
    InputDist,
    KeySelector,
    KJTEmbeddingSharding,
    KJTOutputDist,
    ShardedTable,
    ShardingContext,
    check_blocks,
    rows_by_feature,
)
from lightrec.distributed.sharding.lookups import GroupedLookup, grouped_lookup
from lightrec.kernels.batched_embedding import EmbeddingFusedOptimizer
from lightrec.kernels.sparse_update import apply_sparse_update
from lightrec.optim.fused_spec import FusedOptimizerSpec
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "DataParallelTableSync",
    "DpEmbeddingSharding",
    "DpEmbeddingDist",
    "DpSparseFeaturesDist",
]

_SIDE_GROUPS: dict[int, dist.ProcessGroup] = {}


def side_group(pg: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """A second process group over the same ranks, for collectives issued from backward hooks
    (they then never interleave with the embedding all-to-alls of the main group). Collective:
    every rank of the default group must call it in the same order (sharding is collective)."""
    if not dist.is_initialized() or dist.get_world_size(pg) == 1:
        return pg
    key = id(pg)
    if key not in _SIDE_GROUPS:
        ranks = dist.get_process_group_ranks(pg or dist.group.WORLD)
        # the user's timeout (torch's default would be 30 minutes whatever the user set)
        _SIDE_GROUPS[key] = dist.new_group(ranks=ranks, backend=dist.get_backend(pg), timeout=timeout_of(pg))
    return _SIDE_GROUPS[key]


class DpSparseFeaturesDist(InputDist[DistContext]):
    """Input dist of data-parallel tables: select the features locally; nothing is sent."""

    def __init__(self, feature_indices: list[int], keep_weights: bool) -> None:
        super().__init__()
        self._select = KeySelector(feature_indices, keep_weights)

    def forward(self, kjt: KeyedJaggedTensor, positions: list[int] | None = None) -> DistContext:
        sent = self._select(kjt, positions)
        return DistContext(sent, NoWait[Awaitable[KeyedJaggedTensor]](NoWait(sent)))


class DpEmbeddingDist(KJTOutputDist):
    """Output dist of data-parallel tables: the local result is already final (pooled ``[B, D]``,
    or sequence rows already in input order)."""

    def forward(
        self, embeddings: torch.Tensor, received: Awaitable[KeyedJaggedTensor], ctx: DistContext
    ) -> Awaitable[torch.Tensor]:
        return NoWait(embeddings)


class DataParallelTableSync:
    """Average, then apply, the gradient of replicated tables inside backward (module docstring).

    Args:
        lookup: the grouped lookup whose (non-fused) kernels hold the replicas.
        specs: ``{table: fused optimizer}``.
        env: the sharding environment; ``attr``: ``"embedding_bags"`` or ``"embeddings"``.
    """

    def __init__(
        self, lookup: GroupedLookup, specs: dict[str, FusedOptimizerSpec], env: ShardingEnv, attr: str
    ) -> None:
        self._world_size = env.world_size
        self._group = side_group(env.pg)
        self.optimizers: list[EmbeddingFusedOptimizer] = []
        by_spec: dict[str, tuple[FusedOptimizerSpec, dict[str, nn.Parameter], list[dict]]] = {}
        for kernel, shards in lookup.kernel_tables():
            for (table, _), param in zip(shards, kernel.weights.values()):
                spec = specs[table]
                state = _new_state(spec, param)
                entry = by_spec.setdefault(repr(spec), (spec, {}, []))
                entry[1][f"{attr}.{table}.weight"] = param
                entry[2].append(state)
        # (optimizer, replica, its state): what _install hooks, again on a deep copy's replicas.
        self._updates: list[tuple[EmbeddingFusedOptimizer, nn.Parameter, dict[str, torch.Tensor]]] = []
        for spec, params, states in by_spec.values():
            optimizer = EmbeddingFusedOptimizer(spec, params, states)
            self.optimizers.append(optimizer)
            self._updates += [(optimizer, param, state) for param, state in zip(params.values(), states)]
        self._install()

    def _install(self) -> None:
        """Mark each replica like a fused parameter (the dense optimizer must leave it alone) and hook
        its update into backward."""
        for optimizer, param, state in self._updates:
            param._in_backward_optimizers = [optimizer]  # type: ignore[attr-defined]
            param.register_post_accumulate_grad_hook(self._make_hook(optimizer, state))

    def __deepcopy__(self, memo: dict[int, object]) -> DataParallelTableSync:
        # A deep-copied Parameter has neither hooks nor attributes (Parameter.__deepcopy__): copy the
        # optimizers, replicas and states through ``memo`` (so they are the copied model's), then hook
        # the copies, or a copied model (DistributedModelParallel.copy) would never train these tables.
        twin = DataParallelTableSync.__new__(DataParallelTableSync)
        memo[id(self)] = twin
        for name, value in self.__dict__.items():  # the side group is shared, as the copy's collectives are
            setattr(twin, name, value if name == "_group" else copy.deepcopy(value, memo))
        twin._install()
        return twin

    def _make_hook(self, optimizer: EmbeddingFusedOptimizer, state: dict):  # noqa: ANN202
        spec, world, group = optimizer.spec, self._world_size, self._group

        def hook(param: torch.Tensor) -> None:
            grad = param.grad
            param.grad = None
            if grad is None:
                return
            grad = grad.contiguous()
            if world > 1:
                with collective_guard("all_reduce of data-parallel table gradients", group):
                    dist.all_reduce(grad, group=group)
                grad.div_(world)
            rows = grad.ne(0).any(dim=1).nonzero().squeeze(1)
            if "step" in state:
                state["step"] += 1
            step = int(state["step"]) if "step" in state else 1
            lr = float(optimizer.param_groups[0]["lr"])
            moments = {k: v for k, v in state.items() if k != "step"}
            apply_sparse_update(spec, lr, step, param.detach(), moments, rows, grad.index_select(0, rows))

        return hook


def _new_state(spec: FusedOptimizerSpec, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    rows, dim = weight.shape
    state: dict[str, torch.Tensor] = {}
    for name in spec.state_names:
        state[name] = torch.zeros(spec.state_shape(name, rows, dim), dtype=weight.dtype, device=weight.device)
    if spec.uses_step:
        state["step"] = torch.zeros((), dtype=torch.float32)
    return state


class DpEmbeddingSharding(KJTEmbeddingSharding):
    """Replicated tables (see the module docstring).

    The tables' kernels are plain autograd kernels; ``optimizers`` gives each table's fused rule.
    """

    name = "data_parallel"

    def __init__(self, tables: list[ShardedTable], context: ShardingContext) -> None:
        # The replica kernels compute plain gradients; the fused rule runs in DataParallelTableSync.
        self.specs = {t.name: t.optimizer or FusedOptimizerSpec() for t in tables}
        for t in tables:
            t.optimizer = None
            check_blocks(t, self.name)
        super().__init__(tables, context)
        self.slots = self.whole_table_slots(self.env.rank)
        self.sync: DataParallelTableSync | None = None

    def create_input_dist(self) -> InputDist[DistContext]:
        return DpSparseFeaturesDist([s.feature_index for s in self.slots], self.is_weighted)

    def create_lookup(self) -> GroupedLookup:
        lookup = grouped_lookup(self, self.slots, self.width, 1.0, lookup_mean=True)
        self.sync = DataParallelTableSync(lookup, self.specs, self.env, self.attr)
        return lookup

    def create_output_dist(self) -> KJTOutputDist:
        return DpEmbeddingDist()

    def output_layout(self) -> list[tuple[str, int, int]]:
        return [(s.feature, 0, s.cols) for s in self.slots]

    def feature_rows(self, rows: torch.Tensor, ctx: DistContext) -> dict[str, torch.Tensor]:
        return rows_by_feature(rows, ctx, self.slots)
