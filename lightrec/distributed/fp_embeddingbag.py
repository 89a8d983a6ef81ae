"""Sharded ``FeatureProcessedEmbeddingBagCollection`` (torchrec's ``torchrec.distributed.fp_embeddingbag``).

The collection's tables are sharded like an ``EmbeddingBagCollection``; its position weights are
replicated on every rank and learn from every rank's samples::

    rank s: KJT (its samples)  --positions of every id in its bag, carried as the KJT's weights-->
      input dist (ids and positions travel together, bucketized for row-wise)
      owning rank: weight_i = position_weight[feature][position_i]   (autograd reaches the weights)
      lookup (weighted SUM) --> output dist --> KeyedTensor [B_s, sum D]
    backward: each rank's lookups give its copy of the position weights the gradient of the ids it
      looked up; once the whole backward has run (including the fused embedding updates), the
      copies' gradients are summed over the ranks -- the gradient of the mean of the per-rank
      losses, as for dense parameters -- so every rank's optimizer step keeps them equal.

Positions are taken before the input dist, so row-wise sharding (which splits a bag's ids over
ranks) gets every id's true position: lightrec shards feature-processed tables table-wise,
column-wise and row-wise (torchrec: not row-wise). Data-parallel tables and MEAN pooling are
refused. The position weights are not parameters DDP sees (they are inside the sharded module):
their sum is the collection's own, and the dense optimizer steps them (they are not fused).
State-dict keys are the unsharded collection's: ``_embedding_bag_collection.embedding_bags.<t>.weight``
and ``_feature_processors...``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Function

from lightrec.distributed.comm import Awaitable, LazyAwaitable
from lightrec.distributed.comm.sharding_env import ShardingEnv, resolve_group
from lightrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from lightrec.distributed.planner.plan import ParameterSharding, ShardingType
from lightrec.distributed.sharding.collection_sharder import CollectionSharder
from lightrec.distributed.sharding.work_ahead import StartedInputDist
from lightrec.modules.embedding_configs import PoolingType
from lightrec.modules.feature_processor_ import (
    FeatureProcessorError,
    PositionWeightedModule,
    PositionWeightedModuleCollection,
    positions_in_bags,
    with_weights,
)
from lightrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = ["FeatureProcessedEmbeddingBagCollectionSharder", "ShardedFeatureProcessedEmbeddingBagCollection"]

_EBC = "_embedding_bag_collection."


def _position_weights(processors: nn.Module) -> dict[str, nn.Parameter]:
    """``{feature: position weights}`` of a dict of ``PositionWeightedModule`` s or a collection."""
    if isinstance(processors, PositionWeightedModuleCollection):
        return dict(processors.position_weights.items())
    if isinstance(processors, nn.ModuleDict) and all(isinstance(m, PositionWeightedModule) for m in processors.values()):
        return {f: m.position_weight for f, m in processors.items() if isinstance(m, PositionWeightedModule)}
    raise TypeError(
        "a sharded FeatureProcessedEmbeddingBagCollection takes position-weighted processors "
        "(PositionWeightedModule per feature, or a PositionWeightedModuleCollection); other processors need the "
        f"whole bag after the input dist; got {type(processors).__name__}"
    )


class _SyncContext(Protocol):
    """What :class:`_SumGradsAfterBackward`'s forward leaves on the autograd context."""

    sync: Callable[[], None]


class _SumGradsAfterBackward(Function):
    """Identity on the output; its backward schedules ``sync`` to run after everything else of this
    backward pass (a final callback that queues another one runs after the callbacks queued before
    it, among them the deferred lookup backwards of the pooled output dists)."""

    @staticmethod
    def forward(ctx: _SyncContext, values: torch.Tensor, sync: Callable[[], None]) -> torch.Tensor:
        ctx.sync = sync
        return values.view_as(values)

    @staticmethod
    def backward(ctx: _SyncContext, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        engine = torch.autograd.Variable._execution_engine
        engine.queue_callback(lambda: engine.queue_callback(ctx.sync))
        return grad, None


class _SyncedAwaitable(LazyAwaitable[KeyedTensor]):
    def __init__(self, inner: LazyAwaitable[KeyedTensor], sync: Callable[[], None]) -> None:
        super().__init__()
        self._inner, self._sync = inner, sync

    def _wait_impl(self) -> KeyedTensor:
        kt = self._inner.wait()
        if not (torch.is_grad_enabled() and kt.values().requires_grad):
            return kt
        values = _SumGradsAfterBackward.apply(kt.values(), self._sync)
        return KeyedTensor(keys=kt.keys(), length_per_key=kt.length_per_key(), values=values, key_dim=1)


class ShardedFeatureProcessedEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """A ``FeatureProcessedEmbeddingBagCollection`` sharded over ranks (see the module docstring;
    arguments as ``ShardedCollectionBase``, ``module`` being the feature-processed collection)."""

    _adopts = FeatureProcessedEmbeddingBagCollection

    def _adopt(
        self, module: nn.Module, table_plan: Mapping[str, ParameterSharding], env: ShardingEnv, device: torch.device
    ) -> tuple[nn.Module, Mapping[str, ParameterSharding]]:
        assert isinstance(module, FeatureProcessedEmbeddingBagCollection)  # checked by the constructor
        ebc = module._embedding_bag_collection
        mean = [c.name for c in ebc.embedding_bag_configs() if c.pooling != PoolingType.SUM]
        replicated = [t for t, ps in table_plan.items() if ps.sharding_type == ShardingType.DATA_PARALLEL.value]
        if mean or replicated:
            raise ValueError(
                f"a sharded FeatureProcessedEmbeddingBagCollection needs SUM pooling and model-parallel tables; "
                f"MEAN tables {mean}, data_parallel tables {replicated}: change the pooling or the plan"
            )
        return ebc, table_plan

    def _adopted(self, module: nn.Module, device: torch.device) -> None:
        assert isinstance(module, FeatureProcessedEmbeddingBagCollection)  # checked by the constructor
        processors = module._feature_processors
        if any(p.device.type == "meta" for p in processors.parameters()):
            processors.to_empty(device=device)
            for m in processors.modules():
                if isinstance(m, (PositionWeightedModule, PositionWeightedModuleCollection)):
                    m.reset_parameters()
        self._feature_processors = processors.to(device)
        self._weights_of = _position_weights(self._feature_processors)
        self._max_lengths = {f: p.numel() for f, p in self._weights_of.items()}
        self._register_state_dict_hook(_torchrec_keys)

    def replicated_state(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """The position weights (equal on every rank: their gradients are summed over the ranks)."""
        return dict(self._feature_processors.state_dict(prefix=f"{prefix}_feature_processors."))

    def _prepare(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Carry each id's position in its bag as its weight through the input dist."""
        features = super()._prepare(features)
        lengths = features.lengths()
        for key, lens in zip(features.keys(), lengths.split(features.stride_per_key())):
            limit = self._max_lengths.get(key)
            if limit is not None and lens.numel() and int(lens.max()) > limit:
                raise FeatureProcessorError(
                    f"feature {key!r} has a bag of {int(lens.max())} ids but its position weights cover "
                    f"max_feature_length={limit} positions; truncate the bags or give a larger max_feature_length"
                )
        positions = positions_in_bags(lengths, features.values().numel()).to(torch.float32)
        return with_weights(features, positions)

    def _lookup_input(self, sharding: int, received: KeyedJaggedTensor) -> KeyedJaggedTensor:
        positions = received.weights().long()
        parts = []
        for key, pos in zip(received.keys(), positions.split(received.length_per_key())):
            weights = self._weights_of.get(key)
            parts.append(weights[pos] if weights is not None else torch.ones(pos.numel(), device=pos.device))
        return with_weights(received, torch.cat(parts) if parts else positions.float())

    def _assemble(
        self, started: StartedInputDist, results: list[Awaitable[torch.Tensor]]
    ) -> LazyAwaitable[KeyedTensor]:
        return _SyncedAwaitable(super()._assemble(started, results), self._sum_position_weight_grads)

    def _sum_position_weight_grads(self) -> None:
        """Sum every rank's position-weight gradients (one all-reduce; ranks without one add zeros)."""
        params = list(self._weights_of.values())
        if self._env.world_size == 1 or not params:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
        dist.all_reduce(flat, group=resolve_group(self._env.pg))
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))  # type: ignore[union-attr]

    def _load_from_state_dict(self, state_dict: dict[str, torch.Tensor], prefix: str, *args: object) -> None:
        for key in [k for k in state_dict if k.startswith(prefix + _EBC)]:
            state_dict[prefix + key[len(prefix + _EBC) :]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args)


def _torchrec_keys(module: nn.Module, state_dict: dict[str, object], prefix: str, local_metadata: object) -> None:
    """``embedding_bags.<t>.weight`` -> ``_embedding_bag_collection.embedding_bags.<t>.weight``."""
    for key in [k for k in state_dict if k.startswith(prefix + "embedding_bags.")]:
        state_dict[prefix + _EBC + key[len(prefix) :]] = state_dict.pop(key)


class FeatureProcessedEmbeddingBagCollectionSharder(CollectionSharder):
    """Builds :class:`ShardedFeatureProcessedEmbeddingBagCollection` s (arguments: ``CollectionSharder``);
    offers every sharding type but data-parallel."""

    _module_class = FeatureProcessedEmbeddingBagCollection
    _sharded_class = ShardedFeatureProcessedEmbeddingBagCollection

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return [t for t in super().sharding_types(compute_device_type) if t != ShardingType.DATA_PARALLEL.value]
