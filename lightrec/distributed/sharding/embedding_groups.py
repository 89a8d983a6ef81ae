"""torchrec's grouping vocabulary for sharded embeddings: a group of tables one kernel serves
(:class:`GroupedEmbeddingConfig`) and the per-sharding list of feature batches
(:class:`KJTList`), over lightrec's own :class:`~lightrec.distributed.sharding.common.ShardedTable`.

lightrec's shardings group slots themselves (``lookups.GroupedLookup``); these classes exist so
that code written against torchrec's ``embedding_types`` (extensions that inspect a group's
features and widths, or pass a ``KJTList`` through a pipeline) runs unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from lightrec.distributed.planner.plan import EmbeddingComputeKernel
from lightrec.distributed.sharding.common import ShardedTable
from lightrec.modules.embedding_configs import DataType, PoolingType
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["GroupedEmbeddingConfig", "KJTList"]


@dataclass
class GroupedEmbeddingConfig:
    """Tables served by one kernel: same data type, pooling, weighting and compute kernel.

    Attributes:
        data_type: the tables' weight data type.
        pooling: their pooling (``PoolingType.NONE`` for sequence tables).
        is_weighted: whether the features carry per-id weights.
        has_feature_processor: whether a feature processor runs before the lookup.
        compute_kernel: the kernel serving them.
        embedding_tables: the tables, in kernel order.
        fused_params: the kernel's fused parameters (optimizer and such), or None.

    The widths (:meth:`embedding_dims`, :meth:`dim_sum`) are the tables' full ``embedding_dim``:
    a lightrec ``ShardedTable`` describes every shard of a table, and a column-wise shard's own
    width is its ``ShardSlot.cols`` (torchrec's tables here carry the local shard's columns).
    """

    data_type: DataType
    pooling: PoolingType
    is_weighted: bool
    has_feature_processor: bool
    compute_kernel: EmbeddingComputeKernel
    embedding_tables: list[ShardedTable]
    fused_params: dict[str, Any] | None = field(default=None)

    def feature_names(self) -> list[str]:
        """Every table's features, tables in order: ``[sum of len(feature_names)]``."""
        return [f for t in self.embedding_tables for f in t.config.feature_names]

    def num_features(self) -> int:
        return len(self.feature_names())

    def table_names(self) -> list[str]:
        return [t.name for t in self.embedding_tables]

    def embedding_dims(self) -> list[int]:
        """One width per feature (its table's ``embedding_dim``), in :meth:`feature_names` order."""
        return [t.config.embedding_dim for t in self.embedding_tables for _ in t.config.feature_names]

    def embedding_names(self) -> list[str]:
        """The output names of the features (lightrec names a pooled feature's output by the feature)."""
        return self.feature_names()

    def dim_sum(self) -> int:
        """Width of the group's pooled output: the sum of :meth:`embedding_dims`."""
        return sum(self.embedding_dims())


class KJTList:
    """torchrec's list of ``KeyedJaggedTensor`` s, one per sharding (or group), that a pipeline
    moves between streams as one object.

    Args:
        features: the feature batches, in order.
    """

    def __init__(self, features: list[KeyedJaggedTensor]) -> None:
        self.features = list(features)

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, key: int) -> KeyedJaggedTensor:
        return self.features[key]

    def __iter__(self) -> Iterator[KeyedJaggedTensor]:
        return iter(self.features)

    def __repr__(self) -> str:
        return f"KJTList({self.features!r})"

    def record_stream(self, stream: torch.Stream) -> None:
        """Every batch's tensors are used on ``stream`` (``KeyedJaggedTensor.record_stream``)."""
        for kjt in self.features:
            kjt.record_stream(stream)
