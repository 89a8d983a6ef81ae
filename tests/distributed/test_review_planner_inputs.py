"""Planner inputs a torchrec user gets wrong: typed errors naming the field, the table and the fix."""

from __future__ import annotations

import json
import pickle

import pytest

from lightrec.distributed.planner import (
    EmbeddingShardingPlanner,
    ParameterConstraints,
    PlannerError,
    Topology,
)
from lightrec.distributed.planner.types import PlannerErrorType
from lightrec.distributed.types import ShardingPlan
from tests.planner.stand_in import StandInSharder, tables


def _planner(**kw: object) -> EmbeddingShardingPlanner:
    return EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arg", "value"),
    [("sharding_types", "row_wise"), ("compute_kernels", "fused"), ("pooling_factors", 5.0),
     ("num_poolings", 2.0), ("batch_sizes", 512)],
)  # fmt: skip
def test_constraint_list_field_given_a_bare_value_names_the_field(arg: str, value: object) -> None:
    # was: "must be one of [...], got 'r'" (the string read letter by letter) or "'float' object is not iterable"
    with pytest.raises(TypeError, match=rf"ParameterConstraints\.{arg} must be a list, got .*write {arg}=\["):
        ParameterConstraints(**{arg: value})  # type: ignore[arg-type]


def test_constraint_non_numeric_pooling_factor_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"ParameterConstraints\.pooling_factors must be numbers, got \['a'\]"):
        ParameterConstraints(pooling_factors=["a"])  # type: ignore[list-item]


def test_constraint_min_partition_bool_is_refused() -> None:
    with pytest.raises(ValueError, match="min_partition must be a positive int, got True"):
        ParameterConstraints(min_partition=True)


def test_constraint_lists_as_tuples_still_plan() -> None:
    c = ParameterConstraints(sharding_types=("row_wise",), pooling_factors=(3.0,))  # type: ignore[arg-type]
    plan = _planner(constraints={"t0": c}).plan(tables([(100, 16)]), [StandInSharder()])
    assert plan.plan[""]["t0"].sharding_type == "row_wise"


def _plan_dict() -> dict:
    planner = _planner(constraints={"t0": ParameterConstraints(sharding_types=["row_wise"])})
    return json.loads(planner.plan(tables([(100, 16)]), [StandInSharder()]).to_json())


@pytest.mark.parametrize("key", ["sharding_type", "compute_kernel"])
def test_hand_edited_plan_json_missing_a_key_names_the_table(key: str) -> None:
    data = _plan_dict()
    del data["plan"][""]["t0"][key]
    with pytest.raises(ValueError, match=rf"table 't0' of module '' is not a valid ParameterSharding \(missing key '{key}'\)"):
        ShardingPlan.from_dict(data)


def test_hand_edited_plan_json_bad_shard_names_the_table() -> None:
    data = _plan_dict()
    data["plan"][""]["t0"]["sharding_spec"][0]["rows"] = 3
    with pytest.raises(ValueError, match=r"table 't0' of module ''.*unexpected keyword argument 'rows'"):
        ShardingPlan.from_json(json.dumps(data))


def test_plan_json_whose_plan_is_a_list_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'plan' must map module paths"):
        ShardingPlan.from_dict({"plan": []})


def test_plan_json_round_trip_unchanged() -> None:
    data = _plan_dict()
    assert ShardingPlan.from_dict(data).to_dict() == data


def test_evaluate_a_sharding_type_the_cost_model_does_not_know_names_the_table() -> None:
    data = _plan_dict()
    data["plan"][""]["t0"]["sharding_type"] = "grid_shard"  # a valid ShardingType lightrec does not estimate
    with pytest.raises(ValueError, match=r"plan for table 't0' uses sharding_type='grid_shard'"):
        _planner().evaluate(tables([(100, 16)]), [StandInSharder()], ShardingPlan.from_dict(data))


def test_zero_table_memory_does_not_advise_a_hundred_thousand_ranks() -> None:
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=0)
    with pytest.raises(PlannerError) as info:
        EmbeddingShardingPlanner(topology=topo).plan(tables([(100, 16)]), [StandInSharder()])
    msg = str(info.value)
    assert "use more ranks" not in msg  # was: "use more ranks: about 149760 at this memory per rank"
    assert "every rank has 0 bytes of DDR for tables: set Topology(ddr_cap=...)" in msg


def test_planner_error_type_as_torchrec_and_pickled() -> None:
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=1024)
    with pytest.raises(PlannerError) as info:
        EmbeddingShardingPlanner(topology=topo).plan(tables([(100_000, 64)]), [StandInSharder()])
    assert info.value.error_type is PlannerErrorType.INSUFFICIENT_STORAGE
    back = pickle.loads(pickle.dumps(info.value))  # collective_plan broadcasts it
    assert back.error_type is PlannerErrorType.INSUFFICIENT_STORAGE and back.tables == info.value.tables
    assert {e.name for e in PlannerErrorType} == {"INSUFFICIENT_STORAGE", "STRICT_CONSTRAINTS", "PARTITION", "OTHER"}
