"""Tiered tables sharded over 2 gloo ranks: row-wise, table-wise and column-wise shards of
``key_value`` (SSD) and ``fused_uvm_caching`` (host memory) tables with tiny caches equal the same
plan in memory (``fused``) after 30 steps of every fused optimizer, with the next batch's rows
prefetched through ``SparseDistPipeline`` during each backward; torchrec's names reach the kernels
(``ParameterSharding(cache_params=, key_value_params=)``, sharder ``fused_params``); the plan's
JSON round-trips them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightrec.distributed.planner import (
    CacheAlgorithm,
    CacheParams,
    KeyValueParams,
    ParameterSharding,
    ShardingPlan,
)
from lightrec.distributed.planner.plan import EmbeddingModuleShardingPlan
from tests.multiprocess import run_ranks

OPTIMIZERS = {
    "sgd": {"optimizer": "exact_sgd", "learning_rate": 0.1},
    "adagrad": {"optimizer": "exact_adagrad", "learning_rate": 0.1, "eps": 1e-6},
    "rowwise_adagrad": {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1, "eps": 1e-6},
    "adam": {"optimizer": "adam", "learning_rate": 0.01},
}
ROWS = {"t0": 3000, "t1": 2000, "t2": 2500}


def _plan(ebc: Any, world_size: int, kernel: str, tmp: str) -> Any:
    from lightrec.distributed.planner import column_wise, construct_module_sharding_plan, row_wise, table_wise

    uvm = "fused" if kernel == "fused" else "fused_uvm_caching"
    plan = construct_module_sharding_plan(
        ebc,
        {"t0": row_wise(compute_kernel=kernel), "t1": table_wise(rank=1, compute_kernel=kernel),
         "t2": column_wise(ranks=[0, 1], compute_kernel=uvm)},
        world_size=world_size,
    )  # fmt: skip
    if kernel == "key_value":  # per-table settings in the plan win over the sharder's fused_params
        plan["t1"].cache_params = CacheParams(algorithm=CacheAlgorithm.LFU, load_factor=0.05)
        plan["t1"].key_value_params = KeyValueParams(ssd_storage_directory=f"{tmp}/rank@rank")
    return plan


def _batches(rank: int, steps: int) -> list[Any]:
    from lightrec.sparse import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 4, (3 * 12,), generator=gen)
        values = []
        for f, rows in enumerate(ROWS.values()):
            n = int(lengths[f * 12 : (f + 1) * 12].sum())
            hot, cold = torch.randint(0, 30, (n,), generator=gen), torch.randint(0, rows, (n,), generator=gen)
            values.append(torch.where(torch.rand(n, generator=gen) < 0.5, hot, cold))
        out.append(KeyedJaggedTensor(["f0", "f1", "f2"], torch.cat(values), lengths=lengths))
    return out


def _body(rank: int, world_size: int, tmp: str) -> dict[str, Any]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv
    from lightrec.distributed.train_pipeline.sparse_dist_pipeline import SparseDistPipeline
    from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig

    configs = [EmbeddingBagConfig(num_embeddings=r, embedding_dim=8, name=t, feature_names=[f"f{i}"])
               for i, (t, r) in enumerate(ROWS.items())]  # fmt: skip
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    batches = _batches(rank, 31)
    out: dict[str, Any] = {}
    for name, optimizer in OPTIMIZERS.items():
        models = {}
        for kernel in ("fused", "key_value"):
            fused_params = {**optimizer, "cache_load_factor": 0.04, "cache_min_rows": 40,
                            "ssd_storage_directory": tmp, "cache_algorithm": "lru"}  # fmt: skip
            ebc = EmbeddingBagCollection(configs, device="meta")
            sharder = EmbeddingBagCollectionSharder(fused_params, kernel_backend="torch")
            models[kernel] = sharder.shard(ebc, _plan(ebc, world_size, kernel, tmp), env, seed=7)
        tiered = models["key_value"]
        pipeline = SparseDistPipeline([tiered])
        kernels = [m for m in tiered.modules() if getattr(m, "tiered", False)]
        for step in range(30):
            a = tiered(batches[step]).wait().values()
            b = models["fused"](batches[step]).wait().values()
            assert torch.equal(a, b), f"{name} step {step}: {(a - b).abs().max()}"
            pipeline.start(batches[step + 1])  # the next batch's ids reach their ranks ...
            pipeline.progress()
            pipeline.prefetch()  # ... and its rows are fetched during this backward
            a.square().sum().backward()
            b.square().sum().backward()
        pipeline.cancel()
        sa, sb = tiered.state_dict(), models["fused"].state_dict()
        for key in sb:
            for (_, x), (_, y) in zip(sa[key].shards, sb[key].shards, strict=True):
                assert torch.equal(x, y), key
        oa, ob = tiered.fused_optimizer.state_dict()["state"], models["fused"].fused_optimizer.state_dict()["state"]
        for key in ob:
            for state in ob[key]:
                assert torch.equal(torch.as_tensor(oa[key][state]), torch.as_tensor(ob[key][state])), (key, state)
        stats = [k.kernel.stats() for k in kernels]
        out[name] = {
            "kernels": sorted({(k.backend_name, k.tiering.backing, k.tiering.algorithm) for k in kernels}),
            "fetched": sum(s.rows_fetched for s in stats),
            "written": sum(s.rows_written_back for s in stats),
            "cache_rows": sorted(s.cache_rows for s in stats),
        }
    return out


def test_sharded_tiered_tables_equal_the_in_memory_plan(tmp_path) -> None:
    results = run_ranks(_body, 2, args=(str(tmp_path),), timeout=600)
    for rank, result in enumerate(results):
        for name, info in result.items():
            assert ("tiered", "host", "lru") in info["kernels"], (rank, name)  # t2's column shard
            assert ("tiered", "ssd", "lru") in info["kernels"], (rank, name)  # t0's row shard
            assert info["fetched"] > sum(info["cache_rows"]) and info["written"] > 0, (rank, name, info)
    assert ("tiered", "ssd", "lfu") in results[1]["rowwise_adagrad"]["kernels"]  # t1 on rank 1, from the plan
    assert (tmp_path / "rank1").is_dir()  # KeyValueParams' directory with @rank resolved


def test_plan_json_round_trips_tiered_kernels() -> None:
    plan = ShardingPlan(
        {
            "sparse.ebc": EmbeddingModuleShardingPlan(
                {
                    "t0": ParameterSharding(
                        "row_wise", "key_value", [0, 1], None,
                        cache_params=CacheParams(algorithm="lfu", load_factor=0.05, prefetch_pipeline=True),
                        key_value_params=KeyValueParams(ssd_storage_directory="/ssd/@local_rank"),
                    ),
                    "t1": ParameterSharding("table_wise", "fused_uvm_caching", [1], None, CacheParams(load_factor=0.2)),
                }
            )
        }
    )  # fmt: skip
    again = ShardingPlan.from_json(plan.to_json())
    assert again == plan
    assert again.plan["sparse.ebc"]["t0"].cache_params.algorithm is CacheAlgorithm.LFU
    assert "key_value" in str(again)


def test_plan_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="cache_params is for the tiered compute kernels"):
        ParameterSharding("table_wise", "fused", [0], None, cache_params=CacheParams(load_factor=0.1))
    with pytest.raises(ValueError, match="key_value_params is for compute_kernel='key_value'"):
        ParameterSharding("table_wise", "fused_uvm_caching", [0], None, key_value_params=KeyValueParams("/x"))
    with pytest.raises(ValueError, match="cannot be data parallel"):
        ParameterSharding("data_parallel", "key_value", [0, 1], None)
    with pytest.raises(ValueError, match=r"load_factor=\.\.\.\) must be a share"):
        CacheParams(load_factor=2.0)
    with pytest.raises(ValueError, match="must be CacheAlgorithm.LRU or LFU"):
        CacheParams(algorithm="fifo")


@pytest.mark.parametrize("tables_on", ["host", "ssd"])
def test_the_user_tier_and_the_plan_kernel_translate_one_to_the_other(tables_on: str) -> None:
    """``tables_on`` -> the plan's compute kernel -> the rank's ``TieringConfig`` comes back to the same
    tier, with the same defaults as the unsharded collection of ``TableTiering`` (one translation)."""
    from lightrec.distributed.comm.sharding_env import ShardingEnv
    from lightrec.distributed.sharding.tiering import compute_kernel_of, tiering_config, tiering_for
    from lightrec.kernels import TieringConfig
    from lightrec.lightning import TableTiering
    from lightrec.modules import EmbeddingBagConfig

    kernel = compute_kernel_of(tables_on)
    assert kernel == {"host": "fused_uvm_caching", "ssd": "key_value"}[tables_on]
    table = EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=10, feature_names=["f"])
    sharded = tiering_for(ParameterSharding("table_wise", kernel, [0], None), table, {}, ShardingEnv(1, 0, None))
    assert sharded == TieringConfig(tables_on) == TableTiering(tables_on).tiering() == tiering_config(tables_on)
    assert compute_kernel_of("memory") is None and tiering_config("memory") is None
    assert tiering_for(ParameterSharding("table_wise", "fused", [0], None), table, {}, ShardingEnv(1, 0, None)) is None
    with pytest.raises(ValueError, match="tables_on must be one of"):
        compute_kernel_of("disk")
