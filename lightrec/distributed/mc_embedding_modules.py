"""Sharded managed-collision embedding collections: what the pooled and sequence ones share.

A ``ManagedCollisionEmbeddingBagCollection`` (or ``...EmbeddingCollection``) is sharded as one
module: its tables like any sharded collection's, its managed-collision modules next to them (one
per table on each rank holding rows of it), with raw ids routed to their owner before they are
remapped (``lightrec.distributed.sharding.mc_sharding``). The forward returns, like torchrec's,
``(embeddings awaitable, remapped-KJT awaitable or None)``; the state dict has the unsharded
module's keys (``_embedding_module.<attr>.<t>.weight``, ``_managed_collision_collection...``).

Decisions equal the unsharded module's when it has the same buckets: buckets are independent
sub-tables, so a rank holding buckets ``[a, b)`` decides exactly as the unsharded module does for
those buckets. A module built with one bucket (torchrec's default) and still empty is re-bucketed
to the world size when sharded row-wise (``MCHManagedCollisionModule.with_buckets``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from lightrec.distributed.comm import LazyAwaitable
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs
from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.mc_modules import ShardedManagedCollisionCollection
from lightrec.distributed.planner.plan import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    ParameterSharding,
    ShardingType,
    ShardMetadata,
)
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.collection_sharder import CollectionSharder
from lightrec.distributed.sharding.common import DistContext, EmbeddingSharding, ShardedTable, ShardingContext
from lightrec.distributed.sharding.mc_dist import McRoutes
from lightrec.distributed.sharding.mc_lookups import McLookupState, WithIds
from lightrec.distributed.sharding.mc_sharding import (
    MANAGED_SHARDING_TYPES,
    align_managed_plan,
    managed_sharding,
)
from lightrec.distributed.sharding.state_dict import gather_full_state_dict
from lightrec.modules.mc_base import ManagedCollisionModule
from lightrec.modules.mc_collection import ManagedCollisionCollection
from lightrec.modules.mc_embedding_modules import BaseManagedCollisionEmbeddingCollection
from lightrec.optim.fused_spec import FusedOptimizerSpec
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = ["BaseManagedCollisionEmbeddingCollectionSharder", "BaseShardedManagedCollisionEmbeddingCollection",
           "RemappedFeaturesAwaitable"]  # fmt: skip

logger = logging.getLogger(__name__)


def _row_shards(sharding: ParameterSharding) -> int:
    return len(sharding.sharding_spec or []) if sharding.sharding_type == ShardingType.ROW_WISE.value else 1


def aligned_module_plan(
    modules: dict[str, ManagedCollisionModule], plan: Mapping[str, ParameterSharding], world_size: int
) -> tuple[dict[str, ManagedCollisionModule], dict[str, ParameterSharding]]:
    """``(modules, plan)`` with row-wise blocks on whole buckets; empty single-bucket modules
    re-bucketed to the number of row-wise shards (torchrec's behaviour).

    Raises:
        KeyError: the plan misses a table; ValueError: see ``align_managed_plan``.
    """
    out_modules, out_plan = dict(modules), {}
    for table, module in modules.items():
        if table not in plan:
            raise KeyError(f"the plan has no entry for managed-collision table {table!r}; plan every table")
        n = _row_shards(plan[table])
        rebucket = getattr(module, "with_buckets", None)
        if n > 1 and module.buckets() % n and module.buckets() == 1 and callable(rebucket):
            logger.info("managed-collision table %r: %d buckets for %d row-wise shards", table, n, n)
            module = rebucket(n)
            out_modules[table] = module
        segments = list(getattr(module, "output_segments", [0, module.output_size()]))
        out_plan[table] = align_managed_plan(table, plan[table], segments, world_size)
    return out_modules, out_plan


class BaseShardedManagedCollisionEmbeddingCollection(ShardedCollectionBase):
    """Common part of the sharded managed-collision collections (module docstring).

    Args:
        module: the unsharded ``ManagedCollisionEmbeddingBagCollection`` / ``...EmbeddingCollection``.
        table_plan, env, device, fused_params, seed, kernel_backend, qcomm_codecs_registry: as
            ``ShardedCollectionBase``.
    """

    _state_prefix = "_embedding_module."
    # Set in __init__ through __dict__ (before nn.Module.__init__); declared for the type checker.
    _mc_routes: McRoutes
    _mc_state: McLookupState
    _mc_buckets_per_rank: dict[str, int]
    _return_remapped_features: bool
    _mc_configs: list[Any]

    def __init__(
        self,
        module: nn.Module,
        table_plan: EmbeddingModuleShardingPlan | Mapping[str, Any],
        env: ShardingEnv,
        device: torch.device,
        fused_params: Mapping[str, Any] | FusedOptimizerSpec | None = None,
        seed: int = 0,
        kernel_backend: str = "auto",
        qcomm_codecs_registry: Mapping[str, QuantizedCommCodecs] | None = None,
    ) -> None:
        if not isinstance(module, BaseManagedCollisionEmbeddingCollection):
            raise TypeError(f"{type(self).__name__} shards managed-collision collections, got {type(module).__name__}")
        mcc = module._managed_collision_collection
        modules, plan = aligned_module_plan(mcc.modules_by_table(), table_plan, env.world_size)
        sharded_mcc = ShardedManagedCollisionCollection(modules, plan, env, device, mcc.need_preprocess)
        features = {c.name: list(c.feature_names) for c in mcc.embedding_configs()}
        return_ids = module.return_remapped_features
        # Plain attributes, set before nn.Module.__init__ runs (which keeps them): _make_sharding reads them.
        self.__dict__["_mc_routes"] = McRoutes(modules, features, mcc.need_preprocess)
        self.__dict__["_mc_state"] = McLookupState(sharded_mcc.local_modules(), module._reset_seed, return_ids)
        self.__dict__["_mc_buckets_per_rank"] = {t: m.buckets() // _row_shards(plan[t]) for t, m in modules.items()}
        self.__dict__["_return_remapped_features"] = return_ids
        self.__dict__["_mc_configs"] = mcc.embedding_configs()
        super().__init__(module._embedding_module, EmbeddingModuleShardingPlan(plan), env, device, fused_params,
                         seed, kernel_backend, qcomm_codecs_registry)  # fmt: skip
        self._managed_collision_collection = sharded_mcc

    def _make_sharding(self, sharding_type: str, tables: list[ShardedTable], context: ShardingContext) -> EmbeddingSharding:
        if sharding_type not in MANAGED_SHARDING_TYPES:  # align_managed_plan refused it already
            raise ValueError(f"managed-collision tables {[t.name for t in tables]} cannot be sharded {sharding_type}")
        return managed_sharding(sharding_type, tables, context, self._mc_routes, self._mc_state,
                                self._mc_buckets_per_rank, self._return_remapped_features)  # fmt: skip

    def _prepare(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        # Hash (input_hash_func) and check the raw ids here, on the rank owning the samples.
        return self._mc_routes.prepare(super()._prepare(features))

    def forward(self, features: KeyedJaggedTensor) -> tuple[Any, Any]:
        """``(embeddings awaitable, remapped-KJT awaitable or None)`` of this rank's samples (torchrec's contract)."""
        out: tuple[Any, Any] = ShardedCollectionBase.forward(self, features)
        return out

    def row_state_tables(self) -> list[tuple[str, list[int], list[tuple[ShardMetadata, torch.Tensor]]]]:
        return self._managed_collision_collection.row_state_tables("_managed_collision_collection.")

    @property
    def return_remapped_features(self) -> bool:
        return bool(self._return_remapped_features)

    def mc_stats(self) -> dict[str, dict[str, float]]:
        """``{table: counters}`` of this rank's managed-collision modules."""
        return self._managed_collision_collection.stats()

    def _split_results(self, results: list[Any]) -> tuple[list[Any], list[Any]]:
        if self._managed_collision_collection.training:
            self._managed_collision_collection.tick()
        embeddings = [r.embeddings if isinstance(r, WithIds) else r for r in results]
        ids = [r.ids for r in results if isinstance(r, WithIds)]
        return embeddings, ids

    def _remapped(
        self, contexts: list[DistContext], ids: list[Any], features: KeyedJaggedTensor, positions: list[int] | None
    ) -> RemappedFeaturesAwaitable | None:
        if not self._return_remapped_features:
            return None
        return RemappedFeaturesAwaitable(contexts, ids, features, positions, self._feature_order)

    def gather_unsharded(self, dst: int | None = 0) -> BaseManagedCollisionEmbeddingCollection | None:
        """The unsharded twin (tables, id maps and eviction state gathered) on rank ``dst`` (collective).

        Returns:
            The unsharded collection on CPU on the receiving rank(s); None elsewhere.
        """
        full = gather_full_state_dict(self.state_dict(), self._env.pg, dst)
        if dst is not None and self._env.rank != dst:
            return None
        twin = self._unsharded_template()
        twin.load_state_dict(full)
        return twin

    def _unsharded_template(self) -> BaseManagedCollisionEmbeddingCollection:
        modules = {}
        for table, route in self._mc_routes.twins.items():
            segments = list(getattr(route, "output_segments", [0, route.output_size()]))
            modules[table] = route.rebuild_with_output_id_range((segments[0], segments[-1]), segments, torch.device("cpu"))
        mcc = ManagedCollisionCollection(modules, self._mc_configs, self._managed_collision_collection.need_preprocess)
        return self._unsharded_class()(self._unsharded_embeddings(), mcc, bool(self._return_remapped_features),
                                       self._mc_state.reset_seed)  # fmt: skip

    def _unsharded_class(self) -> type[BaseManagedCollisionEmbeddingCollection]:
        raise NotImplementedError  # pragma: no cover - both subclasses override it

    def _unsharded_embeddings(self) -> nn.Module:
        raise NotImplementedError  # pragma: no cover - both subclasses override it


class RemappedFeaturesAwaitable(LazyAwaitable[KeyedJaggedTensor]):
    """The remapped rows of this rank's ids as a KJT (keys: the collection's features, the input's lengths)."""

    def __init__(
        self,
        contexts: list[DistContext],
        ids: list[Any],
        features: KeyedJaggedTensor,
        positions: list[int] | None,
        feature_order: list[str],
    ) -> None:
        super().__init__()
        self._parts = list(zip(contexts, ids))
        self._features = features
        self._positions = positions
        self._feature_order = feature_order

    def _wait_impl(self) -> KeyedJaggedTensor:
        per_feature: dict[str, torch.Tensor] = {}
        for ctx, pending in self._parts:
            rows = pending.wait().view(-1)
            offsets = ctx.sent.offset_per_key()
            for k, key in enumerate(ctx.sent.keys()):
                per_feature[key] = rows[offsets[k] : offsets[k + 1]]
        batch = self._features.stride()
        lengths = self._features.lengths().view(-1, batch) if batch > 0 else self._features.lengths().view(0, 0)
        jts = {}
        for i, f in enumerate(self._feature_order):
            k = i if self._positions is None else self._positions[i]
            jts[f] = JaggedTensor(values=per_feature[f], lengths=lengths[k] if batch > 0 else lengths.view(-1))
        return KeyedJaggedTensor.from_jt_dict(jts)


class BaseManagedCollisionEmbeddingCollectionSharder(CollectionSharder):
    """Sharder of managed-collision collections: row-wise and table-wise, fused kernels.

    Args:
        e_sharder: the embedding collection's sharder (its ``fused_params`` and kernel backend are used).
        mc_sharder: accepted for torchrec's signature (the managed-collision state is sharded with the tables).
        fused_params / kernel_backend: as ``CollectionSharder`` when no ``e_sharder`` is given.
        qcomm_codecs_registry: accepted for torchrec's signature; lightrec's collectives are not quantized.
    """

    def __init__(
        self,
        e_sharder: CollectionSharder | None = None,
        mc_sharder: Any = None,
        qcomm_codecs_registry: dict[str, Any] | None = None,
        *,
        fused_params: Mapping[str, Any] | FusedOptimizerSpec | None = None,
        kernel_backend: str = "auto",
    ) -> None:
        if e_sharder is not None:
            fused_params = e_sharder.fused_params or None
            kernel_backend = e_sharder.kernel_backend
        super().__init__(fused_params, kernel_backend)
        self._e_sharder = e_sharder
        self._mc_sharder = mc_sharder

    def sharding_types(self, compute_device_type: str) -> list[str]:
        super().sharding_types(compute_device_type)  # checks the device type
        return list(MANAGED_SHARDING_TYPES)

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        super().compute_kernels(sharding_type, compute_device_type)
        return [EmbeddingComputeKernel.FUSED.value]

    def shardable_parameters(self, module: nn.Module) -> dict[str, Any]:
        inner = getattr(module, "_embedding_module", module)
        return super().shardable_parameters(inner)

    def finalize_module_plan(self, module: nn.Module, plan: EmbeddingModuleShardingPlan, world_size: int) -> EmbeddingModuleShardingPlan:
        """Row-wise blocks on whole buckets (the planner calls this on every plan it builds)."""
        mcc = getattr(module, "_managed_collision_collection", None)
        if not isinstance(mcc, ManagedCollisionCollection):
            return plan
        _, aligned = aligned_module_plan(mcc.modules_by_table(), plan, world_size)
        return EmbeddingModuleShardingPlan(aligned)

    def row_state_bytes(self, module: nn.Module, device_type: str = "cpu") -> dict[str, float]:
        """Bytes per table row of the managed-collision state (id map, eviction metadata, search index;
        on CPU the native step's hash too)."""
        mcc = getattr(module, "_managed_collision_collection", None)
        if not isinstance(mcc, ManagedCollisionCollection):
            return {}
        out = {}
        for table, m in mcc.modules_by_table().items():
            rows = m.output_size()
            tensors = [*m.buffers(), *m.parameters()]
            out[table] = m.index_bytes_per_row(device_type) + float(sum(t.element_size() * (t.numel() // rows) for t in tensors
                                                             if t.dim() >= 1 and t.shape[0] == rows))  # fmt: skip
        return out
