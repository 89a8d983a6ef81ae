"""Plan types: printing (TorchRec tutorial), JSON round-trip, validation, shard layout helpers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lightrec.distributed.planner.plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_column_wise,
    table_row_wise,
    table_wise,
)
from lightrec.distributed.types import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    ParameterSharding,
    ShardingEnv,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
    column_wise_shard_sizes,
    row_wise_shard_sizes,
)
from tests.planner.stand_in import tables, tutorial_ebc

TUTORIAL = Path("/work/shared/seeds/intro-to-torchrec-tutorial.txt")


def tutorial_plan_text() -> str:
    """The plan block printed in the TorchRec tutorial (after 'Sharding Plan generated: ')."""
    lines = TUTORIAL.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Sharding Plan generated: module:"))
    block = [lines[start].removeprefix("Sharding Plan generated: ")]
    for line in lines[start + 1 :]:
        if line.startswith("```"):
            break
        block.append(line)
    return "\n".join(block)


def tutorial_plan(device: str) -> ShardingPlan:
    gens = {"product_table": table_wise(rank=0), "user_table": table_wise(rank=0)}
    return ShardingPlan(
        {"": construct_module_sharding_plan(tutorial_ebc(), gens, world_size=1, device_type=device)}
    )


@pytest.mark.skipif(not TUTORIAL.exists(), reason="TorchRec tutorial text not available")
def test_plan_prints_exactly_like_the_seed() -> None:
    assert str(tutorial_plan("cuda")) == tutorial_plan_text()


def test_plan_prints_cpu_placement_and_multiple_modules() -> None:
    plan = tutorial_plan("cpu")
    plan.plan["tower.ebc"] = EmbeddingModuleShardingPlan(
        {"x": ParameterSharding("data_parallel", "dense", [0], None)}
    )
    text = str(plan)
    assert "product_table | [0, 0] | [4096, 64] | rank:0/cpu" in text.splitlines()
    blocks = text.split("\n\n")
    assert blocks[1].splitlines()[0] == "module: tower.ebc"
    assert "x | data_parallel | dense | [0]" in blocks[1]


def test_enums_are_strings() -> None:
    assert f"{ShardingType.ROW_WISE}" == "row_wise" == ShardingType.ROW_WISE
    assert str(EmbeddingComputeKernel.FUSED) == "fused"
    ps = ParameterSharding(ShardingType.TABLE_WISE, EmbeddingComputeKernel.FUSED, [0])
    assert type(ps.sharding_type) is str and ps.sharding_type == "table_wise"
    with pytest.raises(ValueError, match="sharding_type must be one of"):
        ParameterSharding("tablewise", "fused", [0])
    with pytest.raises(ValueError, match="compute_kernel"):
        ParameterSharding("table_wise", "fast", [0])


def test_shard_metadata_validation() -> None:
    s = ShardMetadata([0, 32], [10, 32], "rank:3/cuda:1")
    assert (s.rank, s.device) == (3, "cuda:1")
    with pytest.raises(ValueError, match="placement"):
        ShardMetadata([0, 0], [1, 1], "cuda:0")
    with pytest.raises(ValueError, match="shard_sizes"):
        ShardMetadata([0, 0], [1, -1], "rank:0/cpu")
    with pytest.raises(ValueError, match="disagree"):
        ParameterSharding("table_wise", "fused", [1], [ShardMetadata([0, 0], [1, 1], "rank:0/cpu")])


def test_json_round_trip_and_atomic_save(tmp_path: Path) -> None:
    module = tables([(10, 8), (7, 12), (5, 4), (9, 6), (3, 8)])
    plan = ShardingPlan(
        {
            "a.b": construct_module_sharding_plan(
                module,
                {
                    "t0": row_wise(),
                    "t1": column_wise(ranks=[2, 0, 1]),
                    "t2": data_parallel(),
                    "t3": table_row_wise(host_index=1),
                    "t4": table_column_wise(host_index=0),
                },
                world_size=4,
                local_size=2,
                device_type="cuda",
            )
        }
    )
    again = ShardingPlan.from_json(plan.to_json())
    assert again == plan and str(again) == str(plan)
    path = tmp_path / "plan.json"
    plan.save(path)
    assert ShardingPlan.load(path) == plan
    assert os.listdir(tmp_path) == ["plan.json"]  # no temporary left behind
    assert json.loads(path.read_text())["version"] == 1
    with pytest.raises(ValueError, match="'plan' key"):
        ShardingPlan.from_json('{"tables": {}}')
    assert plan.get_plan_for_module("a.b") is plan.plan["a.b"] and plan.get_plan_for_module("zz") is None


def _reassemble(weight: torch.Tensor, ps: ParameterSharding) -> torch.Tensor:
    """Cut ``weight`` into the plan's shards and paste them into a fresh tensor."""
    out = torch.full_like(weight, float("nan"))
    for s in ps.sharding_spec or []:
        (r0, c0), (nr, nc) = s.shard_offsets, s.shard_sizes
        out[r0 : r0 + nr, c0 : c0 + nc] = weight[r0 : r0 + nr, c0 : c0 + nc].clone()
    return out


@pytest.mark.parametrize("world_size,local_size", [(1, 1), (2, 2), (3, 3), (4, 2), (6, 3)])
@pytest.mark.parametrize("rows,cols", [(10, 8), (5, 64), (1, 4), (13, 7)])
def test_helper_shards_tile_the_table(world_size: int, local_size: int, rows: int, cols: int) -> None:
    module = tables([(rows, cols)])
    cw_ranks = list(range(min(world_size, cols)))
    gens = {
        "tw": table_wise(rank=world_size - 1),
        "rw": row_wise(),
        "cw": column_wise(ranks=cw_ranks),
        "twrw": table_row_wise(host_index=world_size // local_size - 1),
        "twcw": table_column_wise(host_index=0),
    }
    weight = torch.randn(rows, cols)
    for name, gen in gens.items():
        ps = gen(module.embedding_bag_configs()[0], local_size, world_size, "cpu")
        torch.testing.assert_close(_reassemble(weight, ps), weight, msg=name)
        assert [s.rank for s in ps.sharding_spec] == ps.ranks
        areas = sum(s.shard_sizes[0] * s.shard_sizes[1] for s in ps.sharding_spec)
        assert areas == rows * cols, name  # shards do not overlap
    assert gens["rw"](module.embedding_bag_configs()[0], local_size, world_size, "cpu").ranks == list(
        range(world_size)
    )


def test_helper_shapes_and_errors() -> None:
    cfg = tables([(10, 64)]).embedding_bag_configs()[0]
    rw = row_wise()(cfg, 4, 4, "cuda")
    assert [s.shard_sizes for s in rw.sharding_spec] == [[3, 64], [3, 64], [3, 64], [1, 64]]
    assert [s.placement for s in rw.sharding_spec] == [f"rank:{r}/cuda:{r}" for r in range(4)]
    custom = row_wise(sizes_placement=([6, 4], "cpu"))(cfg, 2, 2, "cuda")
    assert [s.shard_offsets for s in custom.sharding_spec] == [[0, 0], [6, 0]]
    assert custom.sharding_spec[1].placement == "rank:1/cpu"
    cw = column_wise(ranks=[1, 0, 1])(cfg, 2, 2, "cpu")
    assert [s.shard_sizes[1] for s in cw.sharding_spec] == [24, 20, 20]
    twrw = table_row_wise(host_index=1)(cfg, 2, 4, "cuda")
    assert twrw.ranks == [2, 3] and twrw.sharding_spec[1].placement == "rank:3/cuda:1"
    dp = data_parallel()(cfg, 3, 3, "cpu")
    assert (dp.ranks, dp.sharding_spec, dp.compute_kernel) == ([0, 1, 2], None, "dense")
    with pytest.raises(ValueError, match=r"table_wise\(rank=...\)"):
        table_wise(rank=2)(cfg, 2, 2, "cpu")
    with pytest.raises(ValueError, match="add up"):
        row_wise(sizes_placement=([3, 3], "cpu"))(cfg, 2, 2, "cpu")
    with pytest.raises(ValueError, match="host_index"):
        table_row_wise(host_index=2)(cfg, 2, 4, "cpu")
    with pytest.raises(KeyError, match="nope"):
        construct_module_sharding_plan(tables([(4, 4)]), {"nope": table_wise(rank=0)}, world_size=1)
    # a tensor works as well as a config (only the shape is read)
    assert table_wise(rank=0)(torch.empty(3, 5), 1, 1, "cpu").sharding_spec[0].shard_sizes == [3, 5]


@given(rows=st.integers(1, 10_000), n=st.integers(1, 70))
def test_row_wise_sizes_cover_rows_in_blocks(rows: int, n: int) -> None:
    sizes = row_wise_shard_sizes(rows, n)
    block = -(-rows // n)
    assert len(sizes) == n and sum(sizes) == rows
    full = [s for s in sizes if s == block]
    assert sizes[: len(full)] == full and all(0 <= s < block for s in sizes[len(full) :])


@given(cols=st.integers(1, 1024), n=st.integers(1, 64))
def test_column_wise_sizes_balanced_and_aligned(cols: int, n: int) -> None:
    if n > cols:
        with pytest.raises(ValueError, match="column-wise shards"):
            column_wise_shard_sizes(cols, n)
        return
    sizes = column_wise_shard_sizes(cols, n)
    unit = 4 if cols % 4 == 0 and cols // 4 >= n else 1
    assert sum(sizes) == cols and len(sizes) == n and min(sizes) > 0
    assert max(sizes) - min(sizes) <= unit and all(s % unit == 0 for s in sizes)


def test_sharding_env_from_local_and_validation() -> None:
    env = ShardingEnv.from_local(4, 3)
    assert (env.world_size, env.rank, env.pg) == (4, 3, None)
    with pytest.raises(ValueError, match="rank"):
        ShardingEnv.from_local(2, 2)
