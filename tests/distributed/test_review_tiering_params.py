"""A tiered table's plan and sharder settings: a cache precision spelled as its name and a bad
``cache_min_rows`` (review)."""

from __future__ import annotations

import pytest

from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.planner.plan.cache_params import CacheParams
from lightrec.distributed.planner.plan.plan_types import ParameterSharding
from lightrec.distributed.sharding.tiering import tiering_for
from lightrec.kernels import TieringConfig
from lightrec.modules import EmbeddingBagConfig

TABLE = EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=10, feature_names=["f"])


def _sharding(cache: CacheParams | None = None) -> ParameterSharding:
    return ParameterSharding("table_wise", "key_value", [0], None, cache_params=cache)


@pytest.mark.parametrize("precision", ["FP32", "fp32", "Fp32"])
def test_a_cache_precision_given_by_name_in_any_case_is_the_tables_own(precision: str) -> None:
    got = tiering_for(_sharding(CacheParams(precision=precision)), TABLE, {}, ShardingEnv(1, 0, None))
    assert got == TieringConfig("ssd")


def test_another_precision_is_still_refused() -> None:
    with pytest.raises(ValueError, match=r"table 't0': CacheParams\(precision='fp16'\)"):
        tiering_for(_sharding(CacheParams(precision="fp16")), TABLE, {}, ShardingEnv(1, 0, None))


@pytest.mark.parametrize("bad", ["abc", "4096", 0, -5, True, 2.5])
def test_a_bad_cache_min_rows_names_the_fused_params_key(bad: object) -> None:
    with pytest.raises(ValueError, match=r"fused_params\['cache_min_rows'\] must be a positive int"):
        tiering_for(_sharding(), TABLE, {"cache_min_rows": bad}, ShardingEnv(1, 0, None))


def test_a_good_cache_min_rows_reaches_the_config() -> None:
    got = tiering_for(_sharding(), TABLE, {"cache_min_rows": 16}, ShardingEnv(1, 0, None))
    assert got is not None and got.min_cache_rows == 16
