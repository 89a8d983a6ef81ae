"""The typed sharding contract (distributed/sharding/common.py): every sharding type is an
``EmbeddingSharding[DistContext, KeyedJaggedTensor, Tensor, Tensor]`` and builds the declared stages."""

from __future__ import annotations

import typing

import pytest
import torch

from lightrec.distributed import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder
from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.planner.plan.builders import (
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_wise,
)
from lightrec.distributed.planner.plan.sharder import PooledTables, SequenceTables, tables_of
from lightrec.distributed.sharding import SHARDING_CLASSES
from lightrec.distributed.sharding.common import (
    DistContext,
    EmbeddingLookup,
    EmbeddingSharding,
    InputDist,
    KJTEmbeddingSharding,
    OutputDist,
)
from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig
from lightrec.sparse import KeyedJaggedTensor
from tests.multiprocess import run_ranks


def _parameters(cls: type) -> tuple[object, ...]:
    """The type arguments ``cls`` gives EmbeddingSharding, through its bases."""
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):  # noqa: B009 - typing's record of Generic[...] bases
            if typing.get_origin(base) is EmbeddingSharding:
                return typing.get_args(base)
    return ()


@pytest.mark.parametrize("sharding_type", sorted(SHARDING_CLASSES))
def test_every_sharding_type_declares_its_stage_types(sharding_type: str) -> None:
    assert _parameters(SHARDING_CLASSES[sharding_type]) == typing.get_args(KJTEmbeddingSharding)
    assert typing.get_args(KJTEmbeddingSharding) == (DistContext, KeyedJaggedTensor, torch.Tensor, torch.Tensor)


def _stage_types(rank: int, world_size: int) -> list[str]:
    out = []
    for pooled in (True, False):
        kind, config = (EmbeddingBagCollection, EmbeddingBagConfig) if pooled else (EmbeddingCollection, EmbeddingConfig)
        configs = [config(name=f"t{i}", num_embeddings=8, embedding_dim=4, feature_names=[f"f{i}"]) for i in range(3)]
        module = kind(configs, device=torch.device("meta"))
        per_table = {"t0": table_wise(rank=1), "t1": row_wise(), "t2": data_parallel()}
        plan = construct_module_sharding_plan(module, per_table, world_size=world_size)
        sharder = EmbeddingBagCollectionSharder() if pooled else EmbeddingCollectionSharder()
        sharded = sharder.shard(module, plan, ShardingEnv.from_process_group(None), torch.device("cpu"))
        assert all(isinstance(s, EmbeddingSharding) for s in sharded.shardings)
        assert all(isinstance(m, InputDist) for m in sharded._input_dists)
        assert all(isinstance(m, EmbeddingLookup) for m in sharded._lookups)
        assert all(isinstance(m, OutputDist) for m in sharded._output_dists)
        # What sharders and planner read of a module is declared (PooledTables / SequenceTables), not probed.
        assert isinstance(sharded, PooledTables) is pooled and isinstance(sharded, SequenceTables) is not pooled
        assert [c.name for c in tables_of(sharded) or []] == ["t0", "t1", "t2"]
        out += [s.name for s in sharded.shardings]
    return out


def test_a_sharded_collection_chains_the_declared_stages() -> None:
    names = run_ranks(_stage_types, 2)[0]
    assert sorted(names) == sorted(["table_wise", "row_wise", "data_parallel"] * 2)
    assert tables_of(torch.nn.Linear(2, 2)) is None
