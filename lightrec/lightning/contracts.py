"""What ``RecStrategy`` and the LightningModules it trains know of each other, declared once.

Neither side imports the other: ``rec_strategy.py`` and ``rec_module.py`` both import this file,
and the callbacks read the strategy and the module through it too::

    module side (RecModule implements it; any LightningModule may)
      ShardedModelProvider.sharding_request() -> ShardingRequest
          what the strategy's sharders and planner should know beyond the module's tables:
          the embedding optimizer of tables the module builds, the planner constraints of its tiered tables
      ServingModelProvider.for_serving(model) -> nn.Module
          the part of the model that serves requests (the export callback and the CLI take it)

    collection side (sharded collections, fused collections and kernels, DistributedModelParallel)
      FusedOptimizerModule.fused_optimizer
          the in-backward optimizer of a module's tables: RecModule puts it into its optimizer,
          the summary and the throughput monitor count its tables and state

    strategy side (RecStrategy implements it)
      EmbeddingShardingStrategy: plan / plan_report / topology / fused_params
          a module that builds its own tables asks ``trainer.strategy`` whether they are sharded
          (then it builds them on ``meta`` for the sharders); PlanReport reads the plan from it

    data side (every lightrec DataModule implements them; a user's may)
      TableDescribingData.table_configs(embedding_dim) -> [EmbeddingBagConfig]
          the tables its features need: the recipes size the model's tables from it
      DenseWidthData.num_dense_features
          the width ``I`` of its batches' dense features
      CheckedData.check_data()
          raises FileNotFoundError naming what is missing before a run starts
      BatchSizedData.batch_size
          the per-rank batch size the planner's cost model uses, where kept (``RecStrategy``, ``lightrec plan``)

A LightningModule that is not a ``ShardedModelProvider`` meets ``RecStrategy`` as Lightning's
``ModelParallelStrategy`` meets a module: it must bring what the strategy parallelises -- here at
least one embedding collection the sharders shard, built in ``__init__`` or ``configure_model``
-- or the strategy refuses it with an :class:`UnshardableModuleError` naming the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from torch import nn

from lightrec.distributed.planner import ParameterConstraints, PlannerReport, Topology
from lightrec.distributed.planner.plan import ShardingPlan
from lightrec.modules.embedding_configs import BaseEmbeddingConfig
from lightrec.optim import KeyedOptimizer

__all__ = [
    "BatchSizedData",
    "CheckedData",
    "DenseWidthData",
    "EmbeddingShardingStrategy",
    "PlannedStrategy",
    "FusedOptimizerModule",
    "ServingModelProvider",
    "ShardedModelProvider",
    "ShardingRequest",
    "TableDescribingData",
    "UnshardableModuleError",
    "planning_batch_size",
]


@dataclass(frozen=True)
class ShardingRequest:
    """What a module asks of the strategy that shards it, beyond its embedding collections.

    Attributes:
        fused_params: the torchrec-style fused optimizer of the tables the module builds (e.g.
            ``{"optimizer": "ROWWISE_ADAGRAD", "learning_rate": 0.05, "eps": 1e-8}``), handed to the
            default sharders so the planner counts its state in table memory; None: the sharders'
            own (the strategy's ``fused_params`` win either way).
        constraints: ``{table: ParameterConstraints}`` for the planner (tiered tables' kernels); the
            strategy's own constraints win for the tables they name.
    """

    fused_params: dict[str, object] | None = None
    constraints: dict[str, ParameterConstraints] = field(default_factory=dict)


@runtime_checkable
class ShardedModelProvider(Protocol):
    """A LightningModule that tells the sharding strategy what it needs (``RecModule`` is one)."""

    def sharding_request(self) -> ShardingRequest:
        """What the strategy's sharders and planner should know (see :class:`ShardingRequest`)."""
        ...


@runtime_checkable
class ServingModelProvider(Protocol):
    """A LightningModule whose served model is a part of its trained model (``RecModule`` is one)."""

    def for_serving(self, model: nn.Module) -> nn.Module:
        """The part of ``model`` (this module's model) that serves requests."""
        ...


@runtime_checkable
class FusedOptimizerModule(Protocol):
    """A module whose tables are updated inside backward by its own optimizer (torchrec's name)."""

    @property
    def fused_optimizer(self) -> KeyedOptimizer | None:
        """The optimizer that updates the module's rows in backward (None: plain gradients)."""
        ...


@runtime_checkable
class PlannedStrategy(Protocol):
    """A Lightning strategy with a sharding plan: all ``PlanReport`` needs to log one (an
    :class:`EmbeddingShardingStrategy` also gives the planner's report, topology and optimizer)."""

    @property
    def plan(self) -> ShardingPlan | None:
        """The sharding plan in use, or None."""
        ...


@runtime_checkable
class EmbeddingShardingStrategy(Protocol):
    """A Lightning strategy that shards the embedding collections of the module it trains (``RecStrategy``)."""

    plan_report: PlannerReport | None
    """The planner's report when the strategy planned (after ``setup``), else None."""

    @property
    def plan(self) -> ShardingPlan | None:
        """The sharding plan in use (after ``setup``) or the one given."""
        ...

    @property
    def topology(self) -> Topology | None:
        """The topology given to plan for (None: the world the strategy runs)."""
        ...

    @property
    def fused_params(self) -> dict[str, object]:
        """The fused embedding optimizer of the strategy's default sharders (empty: their default)."""
        ...


@runtime_checkable
class TableDescribingData(Protocol):
    """A DataModule that describes the embedding tables its features need (every lightrec one)."""

    def table_configs(self, embedding_dim: int) -> Sequence[BaseEmbeddingConfig]:
        """One config per table, ``embedding_dim`` wide, naming the features it reads."""
        ...


@runtime_checkable
class DenseWidthData(Protocol):
    """A DataModule that knows the width of its batches' dense features without loading one."""

    @property
    def num_dense_features(self) -> int:
        """``I``: columns of ``batch.dense_features`` (``[B, I]``)."""
        ...


@runtime_checkable
class BatchSizedData(Protocol):
    """A DataModule that keeps its per-rank batch size (e.g. ``CriteoDataModule``); others plan with
    the planner's default batch."""

    batch_size: int


def planning_batch_size(datamodule: object) -> int | None:
    """The per-rank batch a sharding plan is sized for: the int ``batch_size`` of a
    :class:`BatchSizedData`, else None (the planner's default). ``lightrec plan`` and ``RecStrategy``
    both ask here, so they print the same plan numbers."""
    batch_size = datamodule.batch_size if isinstance(datamodule, BatchSizedData) else None
    return batch_size if isinstance(batch_size, int) and not isinstance(batch_size, bool) else None


@runtime_checkable
class CheckedData(Protocol):
    """A DataModule that checks its inputs exist before a run starts (files, folders)."""

    def check_data(self) -> None:
        """Raise ``FileNotFoundError`` naming what is missing and how to get it."""
        ...


class UnshardableModuleError(TypeError):
    """A LightningModule under ``RecStrategy`` holds nothing the strategy shards and declares nothing
    (not a ``RecModule``, not a :class:`ShardedModelProvider`)."""
