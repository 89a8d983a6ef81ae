"""Plans of managed-collision tables: row blocks on whole buckets, refused sharding types, and the
planner counting the id map and eviction metadata in a table's memory."""

from __future__ import annotations

import pytest
import torch

from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.distributed import (
    EmbeddingShardingPlanner,
    ManagedCollisionEmbeddingBagCollectionSharder,
    ParameterConstraints,
    Topology,
    column_wise,
    construct_module_sharding_plan,
    get_default_sharders,
    row_wise,
)
from lightrec.distributed.mc_embedding_modules import aligned_module_plan
from lightrec.modules.managed_collision import (
    LFU_EvictionPolicy,
    ManagedCollisionCollection,
    ManagedCollisionEmbeddingBagCollection,
    MCHManagedCollisionModule,
)

ROWS = 1000


def managed(buckets: int = 6, device: str = "meta") -> ManagedCollisionEmbeddingBagCollection:
    configs = [EmbeddingBagConfig(num_embeddings=ROWS, embedding_dim=16, name="t", feature_names=["f"])]
    module = MCHManagedCollisionModule(ROWS, "cpu", LFU_EvictionPolicy(), 10, buckets=buckets)
    return ManagedCollisionEmbeddingBagCollection(
        EmbeddingBagCollection(configs, device=device), ManagedCollisionCollection({"t": module}, configs)
    )


def test_planner_lays_row_blocks_on_whole_buckets() -> None:
    model = torch.nn.Module()
    model.mc = managed()
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=4, compute_device="cpu"),
                                       constraints={"t": ParameterConstraints(sharding_types=["row_wise"])})  # fmt: skip
    with pytest.raises(ValueError, match="'t' has 6 buckets, which 4 row-wise shards cannot split"):
        planner.plan(model, get_default_sharders())
    model.mc = managed(buckets=8)
    spec = planner.plan(model, get_default_sharders()).plan["mc"]["t"].sharding_spec
    assert [(s.shard_offsets[0], s.shard_sizes[0]) for s in spec] == [(0, 250), (250, 250), (500, 250), (750, 250)]
    model.mc = managed(buckets=6)
    planner3 = EmbeddingShardingPlanner(topology=Topology(world_size=3, compute_device="cpu"),
                                        constraints={"t": ParameterConstraints(sharding_types=["row_wise"])})  # fmt: skip
    spec = planner3.plan(model, get_default_sharders()).plan["mc"]["t"].sharding_spec
    assert [s.shard_sizes[0] for s in spec] == [333, 333, 334]  # segments of 166/167 rows, two per rank


def test_planner_counts_the_id_map_in_table_memory() -> None:
    plain = torch.nn.Module()
    plain.mc = EmbeddingBagCollection(managed().embedding_bag_configs(), device="meta")
    model = torch.nn.Module()
    model.mc = managed()
    topo = Topology(world_size=1, compute_device="cpu")
    sharders = get_default_sharders()
    sharder = ManagedCollisionEmbeddingBagCollectionSharder()
    per_row = sharder.row_state_bytes(model.mc)["t"]
    # ids, mapping, counts, last access, victim ranks (saved) + the sorted index (ids, rows): 7 int64;
    # on CPU the native step's hash too: [H, 2] int64 with H the power of two >= 2 * ROWS.
    hash_entries = 1 << (2 * ROWS - 1).bit_length()
    assert per_row == pytest.approx(7 * 8 + 16 * hash_entries / ROWS)
    assert sharder.row_state_bytes(model.mc, "cuda")["t"] == 7 * 8  # the torch-op step keeps no hash
    report = EmbeddingShardingPlanner(topology=topo).evaluate(
        model, sharders, EmbeddingShardingPlanner(topology=topo).plan(model, sharders)
    )
    plain_report = EmbeddingShardingPlanner(topology=topo).evaluate(
        plain, sharders, EmbeddingShardingPlanner(topology=topo).plan(plain, sharders)
    )
    assert report.ddr_bytes[0] - plain_report.ddr_bytes[0] == pytest.approx(ROWS * per_row)


def test_refused_sharding_types_and_bucket_counts_name_the_table() -> None:
    mc = managed()
    sharder = ManagedCollisionEmbeddingBagCollectionSharder()
    assert sharder.sharding_types("cpu") == ["row_wise", "table_wise"]
    plan = construct_module_sharding_plan(mc, {"t": column_wise(ranks=[0, 1])}, world_size=2, device_type="cpu")
    with pytest.raises(ValueError, match="managed-collision table 't' is planned column_wise"):
        aligned_module_plan(mc._managed_collision_collection.modules_by_table(), plan, 2)
    plan = construct_module_sharding_plan(mc, {"t": row_wise()}, world_size=4, device_type="cpu")
    with pytest.raises(ValueError, match="'t' has 6 buckets.*multiple of 4"):
        aligned_module_plan(mc._managed_collision_collection.modules_by_table(), plan, 4)


def test_an_empty_single_bucket_module_is_rebucketed_for_row_wise() -> None:
    mc = managed(buckets=1, device="cpu")
    plan = construct_module_sharding_plan(mc, {"t": row_wise()}, world_size=2, device_type="cpu")
    modules, aligned = aligned_module_plan(mc._managed_collision_collection.modules_by_table(), plan, 2)
    assert modules["t"].buckets() == 2
    assert [s.shard_sizes[0] for s in aligned["t"].sharding_spec] == [500, 500]
    trained = mc._managed_collision_collection.modules_by_table()["t"]
    trained.remap_values(torch.tensor([5, 7]))
    with pytest.raises(ValueError, match="holds ids with buckets=1"):
        aligned_module_plan({"t": trained}, plan, 2)
