"""Planner speed and plan quality.

Run::

    python benchmarks/bench_planner.py                 # prints a summary, writes bench_planner.json
    python benchmarks/bench_planner.py --out result.json --repeats 3

Workloads (random seed fixed): tables with dims in {32, 64, 128, 256}, rows log-uniform in
[1e3, 1e7], pooling factors in [1, 30]. For each workload it prints the planning time and the
estimated cost of the busiest rank for lightrec's plan and for a table-wise round-robin plan
(table ``i`` on rank ``i % W``), both estimated by the same cost model
(``EmbeddingShardingPlanner.evaluate``). The torchrec planner is timed on 100 tables / 16 ranks
only when ``torchrec`` is importable.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightrec.distributed.planner import (  # noqa: E402
    EmbeddingShardingPlanner,
    ParameterConstraints,
    Topology,
    construct_module_sharding_plan,
    table_wise,
)
from lightrec.distributed.types import ModuleSharder, ShardingPlan  # noqa: E402
from lightrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402


class _Tables(nn.Module):
    """Stand-in embedding collection: the planner only reads ``embedding_bag_configs()``."""

    def __init__(self, configs: list[EmbeddingBagConfig]) -> None:
        super().__init__()
        self._configs = configs

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs


class _Sharder(ModuleSharder):
    @property
    def module_type(self) -> type[nn.Module]:
        return _Tables


def make_workload(num_tables: int, seed: int) -> tuple[_Tables, dict[str, ParameterConstraints]]:
    rng = np.random.default_rng(seed)
    dims = rng.choice([32, 64, 128, 256], size=num_tables)
    rows = np.exp(rng.uniform(np.log(1e3), np.log(1e7), size=num_tables)).astype(np.int64)
    pooling = rng.uniform(1.0, 30.0, size=num_tables)
    configs = [
        EmbeddingBagConfig(num_embeddings=int(r), embedding_dim=int(d), name=f"t{i}", feature_names=[f"f{i}"])
        for i, (r, d) in enumerate(zip(rows, dims, strict=False))
    ]
    constraints = {f"t{i}": ParameterConstraints(pooling_factors=[float(p)]) for i, p in enumerate(pooling)}
    return _Tables(configs), constraints


def round_robin_plan(module: _Tables, topo: Topology) -> ShardingPlan:
    per_table = {
        c.name: table_wise(rank=i % topo.world_size) for i, c in enumerate(module.embedding_bag_configs())
    }
    return ShardingPlan(
        {
            "": construct_module_sharding_plan(
                module,
                per_table,
                world_size=topo.world_size,
                local_size=topo.local_world_size,
                device_type=topo.compute_device,
            )
        }
    )


def run_workload(name: str, tables: int, topo: Topology, seed: int, repeats: int) -> dict:
    module, constraints = make_workload(tables, seed)
    sharders = [_Sharder(fused_params={"optimizer": "rowwise_adagrad"})]
    planner = EmbeddingShardingPlanner(topology=topo, constraints=constraints)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = planner.plan(module, sharders)
        times.append(time.perf_counter() - t0)
    report = planner.last_report
    again = planner.plan(module, sharders)
    rr = planner.evaluate(module, sharders, round_robin_plan(module, topo))
    rr_mem = rr.hbm_bytes if topo.compute_device == "cuda" else rr.ddr_bytes
    caps = topo.storage_caps
    return {
        "workload": name,
        "tables": tables,
        "world_size": topo.world_size,
        "local_world_size": topo.local_world_size,
        "compute_device": topo.compute_device,
        "seed": seed,
        "plan_seconds_first": times[0],
        "plan_seconds_best": min(times),
        "deterministic": again.to_json() == plan.to_json(),
        "lightrec_max_rank_cost_ms": report.max_cost_s * 1e3,
        "lightrec_imbalance": report.imbalance,
        "round_robin_max_rank_cost_ms": rr.max_cost_s * 1e3,
        "round_robin_imbalance": rr.imbalance,
        "round_robin_fits_memory": bool((rr_mem <= caps).all()),
        "lightrec_no_worse": report.max_cost_s <= rr.max_cost_s * (1 + 1e-9),
        "sharding_types": {
            k: sum(t.sharding_type == k for t in report.tables)
            for k in sorted({t.sharding_type for t in report.tables})
        },
    }


def torchrec_time() -> dict:
    try:
        import torchrec  # noqa: F401
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner as TRPlanner
        from torchrec.distributed.planner import Topology as TRTopology
    except ImportError as exc:
        print(f"torchrec not importable ({exc}); skipping the torchrec planner baseline")
        return {"skipped": f"torchrec not importable: {exc}"}
    module, _ = make_workload(100, seed=0)
    tr_tables = [
        torchrec.EmbeddingBagConfig(
            num_embeddings=c.num_embeddings,
            embedding_dim=c.embedding_dim,
            name=c.name,
            feature_names=c.feature_names,
        )
        for c in module.embedding_bag_configs()
    ]
    ebc = torchrec.EmbeddingBagCollection(tables=tr_tables, device=torch.device("meta"))
    planner = TRPlanner(topology=TRTopology(world_size=16, compute_device="cpu"))
    t0 = time.perf_counter()
    planner.plan(ebc, [EmbeddingBagCollectionSharder()])
    seconds = time.perf_counter() - t0
    print(f"torchrec planner, 100 tables / 16 ranks: {seconds:.2f} s")
    return {"tables": 100, "world_size": 16, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="bench_planner.json")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    workloads = [
        (
            "1000 tables / 64 GPUs (8 per host)",
            1000,
            Topology(world_size=64, local_world_size=8, compute_device="cuda"),
            0,
        ),
        ("1000 tables / 64 CPU ranks (1 host)", 1000, Topology(world_size=64, compute_device="cpu"), 0),
        (
            "200 tables / 16 GPUs (2 hosts)",
            200,
            Topology(world_size=16, local_world_size=8, compute_device="cuda"),
            1,
        ),
        ("100 tables / 16 CPU ranks", 100, Topology(world_size=16, compute_device="cpu"), 2),
        ("26 tables / 8 GPUs", 26, Topology(world_size=8, compute_device="cuda"), 3),
        (
            "20 tables / 2 CPU ranks, 16 GiB each",
            20,
            Topology(world_size=2, compute_device="cpu", ddr_cap=16 * 1024**3),
            4,
        ),
    ]
    results = []
    print(
        f"{'workload':40s} {'plan s':>8s} {'lightrec max ms':>16s} {'round-robin max ms':>19s} {'imbal.':>7s}  ok"
    )
    for name, n, topo, seed in workloads:
        r = run_workload(name, n, topo, seed, args.repeats)
        results.append(r)
        print(
            f"{name:40s} {r['plan_seconds_best']:8.3f} {r['lightrec_max_rank_cost_ms']:16.4g} "
            f"{r['round_robin_max_rank_cost_ms']:19.4g} {r['lightrec_imbalance']:7.3f}  "
            f"{'yes' if r['lightrec_no_worse'] and r['deterministic'] else 'NO'}"
            f"{'' if r['round_robin_fits_memory'] else ' (round-robin exceeds memory)'}"
        )
    out = {
        "benchmark": "planner",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "results": results,
        "torchrec": torchrec_time(),
    }
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
