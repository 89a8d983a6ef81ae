"""A small DLRM RecModule and data shared by the Lightning tests (importable by spawned ranks)."""

from __future__ import annotations

import torch

from lightrec import EmbeddingBagCollection
from lightrec.data import SyntheticCriteo
from lightrec.lightning import RecModule
from lightrec.models import DLRM

DIM = 8


def toy_data(batch_size: int = 64, num_train_batches: int = 8, block_size: int | None = 32) -> SyntheticCriteo:
    return SyntheticCriteo(
        batch_size=batch_size, num_train_batches=num_train_batches, num_val_batches=2, num_test_batches=2,
        num_embeddings_cap=200, seed=3, block_size=block_size,
    )  # fmt: skip


class ToyDLRM(RecModule):
    """DLRM over the synthetic Criteo tables (26 tables, <= 200 rows, dim 8)."""

    def __init__(self, device: str | None = None, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        torch.manual_seed(7)
        tables = toy_data().table_configs(DIM)
        self.model = DLRM(
            embedding_bag_collection=EmbeddingBagCollection(tables, device=device),
            dense_in_features=13,
            dense_arch_layer_sizes=[16, DIM],
            over_arch_layer_sizes=[16, 1],
        )

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:  # noqa: ANN001
        return self.model(dense, sparse)


def mixed_toy_plan(world_size: int, device_type: str = "cpu"):  # noqa: ANN201 - a ShardingPlan
    """A plan of :class:`ToyDLRM`'s tables mixing row-wise, data-parallel and table-wise (on the last rank)."""
    from lightrec.distributed.planner import (
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )
    from lightrec.distributed.types import ShardingPlan

    ebc = ToyDLRM(device="meta").model.sparse_arch.embedding_bag_collection
    kinds = [row_wise(), data_parallel(), table_wise(rank=world_size - 1)]
    per_table = {t.name: kinds[i % 3] for i, t in enumerate(ebc.embedding_bag_configs())}
    return ShardingPlan({"model.sparse_arch.embedding_bag_collection": construct_module_sharding_plan(
        ebc, per_table, world_size=world_size, local_size=world_size, device_type=device_type)})  # fmt: skip
