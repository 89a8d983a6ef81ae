"""Sharded managed-collision embedding collections, pooled and sequence, and their sharders.

The home of torchrec's ``mc_embedding_modules`` (the shared bases) and of what its
``mc_embeddingbag`` / ``mc_embedding`` paths hold (which re-export it)::

    mc_ebc = ManagedCollisionEmbeddingBagCollection(EmbeddingBagCollection(tables, device="meta"), mcc)
    model = DistributedModelParallel(model_with(mc_ebc))   # get_default_sharders() includes this sharder
    pooled, remapped = sharded_mc_ebc(kjt)                 # lazy awaitables; remapped is None unless
                                                           # return_remapped_features=True

A ``ManagedCollisionEmbeddingBagCollection`` (or ``...EmbeddingCollection``) is sharded as one
module: its tables like any sharded collection's, its managed-collision modules next to them (one
per table on each rank holding rows of it), with raw ids routed to their owner before they are
remapped (``lightrec.distributed.sharding.managed_collision``). The forward returns, like torchrec's,
``(embeddings awaitable, remapped-KJT awaitable or None)``; the state dict has the unsharded
module's keys (``_embedding_module.<attr>.<t>.weight``, ``_managed_collision_collection...``).

Decisions equal the unsharded module's when it has the same buckets: buckets are independent
sub-tables, so a rank holding buckets ``[a, b)`` decides exactly as the unsharded module does for
those buckets. A module built with one bucket (torchrec's default) and still empty is re-bucketed
to the world size when sharded row-wise (``MCHManagedCollisionModule.with_buckets``).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import nn

from lightrec.distributed.comm import Awaitable, LazyAwaitable
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs
from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.embedding import FeatureRowsAwaitable, ShardedEmbeddingCollection
from lightrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from lightrec.distributed.mc_modules import ShardedManagedCollisionCollection, check_state_dict
from lightrec.distributed.planner.plan import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    ParameterSharding,
    ShardingType,
    ShardMetadata,
)
from lightrec.distributed.planner.plan.sharder import FusedParamsLike
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.collection_sharder import CollectionSharder
from lightrec.distributed.sharding.common import (
    KJTEmbeddingSharding,
    OutputDist,
    ShardedTable,
    ShardingContext,
)
from lightrec.distributed.sharding.managed_collision import (
    MANAGED_SHARDING_TYPES,
    ManagedIds,
    McLookupState,
    McOutputDist,
    McRoutes,
    WithIds,
    align_managed_plan,
    managed_lookups,
    managed_sharding,
)
from lightrec.distributed.sharding.state_dict import gather_full_state_dict
from lightrec.distributed.sharding.work_ahead import StartedInputDist
from lightrec.modules.embedding_configs import BaseEmbeddingConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.modules.managed_collision.collection import ManagedCollisionCollection
from lightrec.modules.managed_collision.embedding_collections import (
    BaseManagedCollisionEmbeddingCollection,
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from lightrec.modules.managed_collision.mch_module import MCHManagedCollisionModule
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__all__ = [
    "BaseManagedCollisionEmbeddingCollectionSharder",
    "BaseShardedManagedCollisionEmbeddingCollection",
    "ManagedCollisionEmbeddingBagCollectionSharder",
    "ManagedCollisionEmbeddingCollectionSharder",
    "RemappedFeaturesAwaitable",
    "ShardedManagedCollisionEmbeddingBagCollection",
    "ShardedManagedCollisionEmbeddingCollection",
]

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
        # Only MCH modules re-bucket (torchrec's MCHManagedCollisionModule does the same).
        if n > 1 and module.buckets() % n and module.buckets() == 1 and isinstance(module, MCHManagedCollisionModule):
            logger.info("managed-collision table %r: %d buckets for %d row-wise shards", table, n, n)
            module = module.with_buckets(n)
            out_modules[table] = module
        segments = list(module.output_segments)
        out_plan[table] = align_managed_plan(table, plan[table], segments, world_size)
    return out_modules, out_plan


McEmbeddings = LazyAwaitable[KeyedTensor] | LazyAwaitable[dict[str, JaggedTensor]]
"""The plain sharded collection's awaitable: pooled ``KeyedTensor`` or ``{feature: JaggedTensor}``."""


class BaseShardedManagedCollisionEmbeddingCollection(
    ShardedCollectionBase["tuple[McEmbeddings, RemappedFeaturesAwaitable | None]"], abc.ABC
):
    """Common part of the sharded managed-collision collections (module docstring).

    Args:
        module: the unsharded ``ManagedCollisionEmbeddingBagCollection`` / ``...EmbeddingCollection``.
        table_plan, env, device, fused_params, seed, kernel_backend, qcomm_codecs_registry: as
            ``ShardedCollectionBase``.
    """

    _state_prefix = "_embedding_module."
    _adopts = BaseManagedCollisionEmbeddingCollection
    _unsharded_class: type[BaseManagedCollisionEmbeddingCollection]  # set by the pooled / sequence subclass
    # Set by _adopt, before the tables are sharded (_make_sharding reads them).
    _mc_routes: McRoutes
    _mc_state: McLookupState
    _mc_buckets_per_rank: dict[str, int]
    _return_remapped_features: bool
    _mc_configs: list[BaseEmbeddingConfig]
    _mc_ids: list[ManagedIds]  # set by _adopted, one per sharding

    def _adopt(
        self, module: nn.Module, table_plan: Mapping[str, ParameterSharding], env: ShardingEnv, device: torch.device
    ) -> tuple[nn.Module, Mapping[str, ParameterSharding]]:
        assert isinstance(module, BaseManagedCollisionEmbeddingCollection)  # checked by the constructor
        mcc = module._managed_collision_collection
        modules, plan = aligned_module_plan(mcc.modules_by_table(), table_plan, env.world_size)
        sharded_mcc = ShardedManagedCollisionCollection(modules, plan, env, device, mcc.need_preprocess)
        features = {c.name: list(c.feature_names) for c in mcc.embedding_configs()}
        return_ids = module.return_remapped_features
        self._mc_routes = McRoutes(modules, features, mcc.need_preprocess)
        self._mc_state = McLookupState(sharded_mcc.local_modules(), module._reset_seed, return_ids)
        self._mc_buckets_per_rank = {t: m.buckets() // _row_shards(plan[t]) for t, m in modules.items()}
        self._return_remapped_features = return_ids
        self._mc_configs = mcc.embedding_configs()
        # A plain attribute until _adopted registers it after the tables (the module order of before).
        self.__dict__["_mc_pending"] = sharded_mcc
        return module._embedding_module, EmbeddingModuleShardingPlan(plan)

    def _adopted(self, module: nn.Module, device: torch.device) -> None:
        # The remap in front of each plain lookup; the remapped rows sent back after each output dist.
        self._mc_ids = managed_lookups(self._shardings, list(self._lookups), self._mc_state, self._env.rank)
        for i, (ids, inner) in enumerate(zip(self._mc_ids, list(self._output_dists))):
            assert isinstance(inner, OutputDist)  # every sharding's create_output_dist returns one
            self._output_dists[i] = McOutputDist(inner, ids, self._env.pg, self._return_remapped_features)
        self._managed_collision_collection = self.__dict__.pop("_mc_pending")
        # The tables load before the id maps (torch loads the children in order): a managed-collision
        # state that does not fit (other buckets, ids outside their bucket) must fail before them.
        self.register_load_state_dict_pre_hook(_check_managed_collisions_first)

    def _make_sharding(self, sharding_type: str, tables: list[ShardedTable], context: ShardingContext) -> KJTEmbeddingSharding:
        if sharding_type not in MANAGED_SHARDING_TYPES:  # align_managed_plan refused it already
            raise ValueError(f"managed-collision tables {[t.name for t in tables]} cannot be sharded {sharding_type}")
        return managed_sharding(sharding_type, tables, context, self._mc_routes, self._mc_buckets_per_rank,
                                self._return_remapped_features)  # fmt: skip

    def _lookup_input(self, sharding: int, received: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The received raw ids as this rank's rows (evicted rows reset): what the lookup reads."""
        return self._mc_ids[sharding](received)

    def _prepare(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        # Hash (input_hash_func) and check the raw ids here, on the rank owning the samples.
        return self._mc_routes.prepare(super()._prepare(features))

    def forward(self, features: KeyedJaggedTensor) -> tuple[McEmbeddings, RemappedFeaturesAwaitable | None]:
        """``(embeddings awaitable, remapped-KJT awaitable or None)`` of this rank's samples (torchrec's contract)."""
        return ShardedCollectionBase.forward(self, features)

    def row_state_tables(self) -> list[tuple[str, list[int], list[tuple[ShardMetadata, torch.Tensor]]]]:
        return self._managed_collision_collection.row_state_tables("_managed_collision_collection.")

    @property
    def return_remapped_features(self) -> bool:
        return bool(self._return_remapped_features)

    def mc_stats(self) -> dict[str, dict[str, float]]:
        """``{table: counters}`` of this rank's managed-collision modules."""
        return self._managed_collision_collection.stats()

    def _assemble(
        self, started: StartedInputDist, results: list[Awaitable[torch.Tensor]]
    ) -> tuple[McEmbeddings, RemappedFeaturesAwaitable | None]:
        """``(the plain collection's awaitable of the embeddings, the remapped KJT's or None)``; the
        plain collection is the next class in the subclass's bases (pooled or sequence)."""
        if self._managed_collision_collection.training:
            self._managed_collision_collection.tick()
        embeddings = [r.embeddings if isinstance(r, WithIds) else r for r in results]
        ids = [r.ids for r in results if isinstance(r, WithIds)]
        # the next class of the subclass's bases: ShardedEmbeddingBagCollection / ShardedEmbeddingCollection
        out = cast(McEmbeddings, super()._assemble(started, embeddings))  # type: ignore[safe-super]
        if not self._return_remapped_features:
            return out, None
        return out, RemappedFeaturesAwaitable(started, ids, self._feature_order)

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
            segments = list(route.output_segments)
            modules[table] = route.rebuild_with_output_id_range((segments[0], segments[-1]), segments, torch.device("cpu"))
        mcc = ManagedCollisionCollection(modules, self._mc_configs, self._managed_collision_collection.need_preprocess)
        return self._unsharded_class(self._unsharded_embeddings(), mcc, bool(self._return_remapped_features),
                                     self._mc_state.reset_seed)  # fmt: skip

    @abc.abstractmethod
    def _unsharded_embeddings(self) -> nn.Module:
        """The plain (unsharded) embedding collection this one's tables would fill."""


def _check_managed_collisions_first(
    module: nn.Module, state_dict: dict[str, object], prefix: str, *args: object
) -> None:
    """Load pre-hook of the sharded managed-collision collections: their id maps' entries of
    ``state_dict`` are checked before anything is copied (``mc_modules.check_state_dict``)."""
    collection = module._managed_collision_collection
    assert isinstance(collection, ShardedManagedCollisionCollection)  # set by _adopted
    check_state_dict(collection, state_dict, f"{prefix}_managed_collision_collection.")


class RemappedFeaturesAwaitable(FeatureRowsAwaitable[KeyedJaggedTensor]):
    """The remapped rows of this rank's ids as a KJT (keys: the collection's features, the input's lengths).

    Args:
        started / feature_order: see :class:`~lightrec.distributed.embedding.FeatureRowsAwaitable`.
        ids: per sharding (``started.contexts``), the pending remapped ids of the ids it sent.
    """

    def __init__(self, started: StartedInputDist, ids: list[Awaitable[torch.Tensor]], feature_order: list[str]) -> None:
        super().__init__(started, feature_order)
        self._parts = list(zip(started.contexts, ids))

    def _wait_impl(self) -> KeyedJaggedTensor:
        per_feature: dict[str, torch.Tensor] = {}
        for ctx, pending in self._parts:
            rows = pending.wait().view(-1)
            offsets = ctx.sent.offset_per_key()
            for k, key in enumerate(ctx.sent.keys()):
                per_feature[key] = rows[offsets[k] : offsets[k + 1]]
        self._parts = []  # release the inputs once resolved
        return KeyedJaggedTensor.from_jt_dict(self._jagged(per_feature))


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
        mc_sharder: object = None,
        qcomm_codecs_registry: Mapping[str, QuantizedCommCodecs] | None = None,
        *,
        fused_params: FusedParamsLike = None,
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

    def shardable_parameters(self, module: nn.Module) -> dict[str, BaseEmbeddingConfig]:
        inner = module._embedding_module if isinstance(module, BaseManagedCollisionEmbeddingCollection) else module
        return super().shardable_parameters(inner)

    def finalize_module_plan(self, module: nn.Module, plan: EmbeddingModuleShardingPlan, world_size: int) -> EmbeddingModuleShardingPlan:
        """Row-wise blocks on whole buckets (the planner calls this on every plan it builds)."""
        if not isinstance(module, BaseManagedCollisionEmbeddingCollection):
            return plan
        mcc = module._managed_collision_collection
        _, aligned = aligned_module_plan(mcc.modules_by_table(), plan, world_size)
        return EmbeddingModuleShardingPlan(aligned)

    def row_state_bytes(self, module: nn.Module, device_type: str = "cpu") -> dict[str, float]:
        """Bytes per table row of the managed-collision state (id map, eviction metadata, search index;
        on CPU the native step's hash too)."""
        if not isinstance(module, BaseManagedCollisionEmbeddingCollection):
            return {}
        mcc = module._managed_collision_collection
        out = {}
        for table, m in mcc.modules_by_table().items():
            rows = m.output_size()
            tensors = [*m.buffers(), *m.parameters()]
            out[table] = m.index_bytes_per_row(device_type) + float(sum(t.element_size() * (t.numel() // rows) for t in tensors
                                                             if t.dim() >= 1 and t.shape[0] == rows))  # fmt: skip
        return out


class ShardedManagedCollisionEmbeddingBagCollection(  # type: ignore[misc]  # forward: (embeddings, remapped ids), torchrec's contract
    BaseShardedManagedCollisionEmbeddingCollection, ShardedEmbeddingBagCollection
):
    """A ``ManagedCollisionEmbeddingBagCollection`` sharded row-wise or table-wise.

    ``forward(kjt) -> (awaitable of KeyedTensor [B_local, sum D], awaitable of the remapped KJT or None)``.
    """

    _unsharded_class = ManagedCollisionEmbeddingBagCollection

    def _unsharded_embeddings(self) -> nn.Module:
        return EmbeddingBagCollection(self.embedding_bag_configs(), is_weighted=self._is_weighted)


class ShardedManagedCollisionEmbeddingCollection(  # type: ignore[misc]  # forward: (embeddings, remapped ids), torchrec's contract
    BaseShardedManagedCollisionEmbeddingCollection, ShardedEmbeddingCollection
):
    """A ``ManagedCollisionEmbeddingCollection`` sharded row-wise or table-wise.

    ``forward(kjt) -> (awaitable of {feature: JaggedTensor}, awaitable of the remapped KJT or None)``.
    """

    _unsharded_class = ManagedCollisionEmbeddingCollection

    def _unsharded_embeddings(self) -> nn.Module:
        return EmbeddingCollection(self.embedding_configs())


class ManagedCollisionEmbeddingBagCollectionSharder(BaseManagedCollisionEmbeddingCollectionSharder):
    """Builds :class:`ShardedManagedCollisionEmbeddingBagCollection` s.

    Args:
        ebc_sharder: an ``EmbeddingBagCollectionSharder`` whose fused optimizer and kernel backend
            the tables use (torchrec's argument); or give ``fused_params`` / ``kernel_backend``.
        mc_sharder, qcomm_codecs_registry: torchrec's arguments (see the base class).
    """

    _module_class = ManagedCollisionEmbeddingBagCollection
    _sharded_class = ShardedManagedCollisionEmbeddingBagCollection

    def __init__(self, ebc_sharder: CollectionSharder | None = None, mc_sharder: object = None,
                 qcomm_codecs_registry: Mapping[str, QuantizedCommCodecs] | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(ebc_sharder, mc_sharder, qcomm_codecs_registry, **kwargs)


class ManagedCollisionEmbeddingCollectionSharder(BaseManagedCollisionEmbeddingCollectionSharder):
    """Builds :class:`ShardedManagedCollisionEmbeddingCollection` s (``ec_sharder``: an
    ``EmbeddingCollectionSharder``; other arguments as :class:`ManagedCollisionEmbeddingBagCollectionSharder`)."""

    _module_class = ManagedCollisionEmbeddingCollection
    _sharded_class = ShardedManagedCollisionEmbeddingCollection

    def __init__(self, ec_sharder: CollectionSharder | None = None, mc_sharder: object = None,
                 qcomm_codecs_registry: Mapping[str, QuantizedCommCodecs] | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(ec_sharder, mc_sharder, qcomm_codecs_registry, **kwargs)
