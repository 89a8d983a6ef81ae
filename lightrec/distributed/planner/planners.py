"""``EmbeddingShardingPlanner``: tables + cluster -> :class:`ShardingPlan` (+ an explained report).

Pipeline (all deterministic: no randomness, ties broken by table and rank order)::

    collect tables -> enumerate options -> proposals (greedy; memory DP when memory binds)
        -> partition (repair by escalating tables that do not pack) -> refine -> best plan

The best plan has the least estimated cost on its busiest rank (then the least total cost).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import torch.distributed as dist
from torch import nn

from lightrec.distributed.planner.enumerators import Options, enumerate_options
from lightrec.distributed.planner.estimators import (
    CW,
    DP,
    KERNELS,
    RW,
    SHARDING_TYPES,
    TWCW,
    TWRW,
    TableArrays,
    estimate_shards,
)
from lightrec.distributed.planner.partitioners import Placement, partition, refine
from lightrec.distributed.planner.plan import (
    EmbeddingModuleShardingPlan,
    ParameterSharding,
    ShardingPlan,
    ShardMetadata,
    placement_for,
)
from lightrec.distributed.planner.proposers import escalate, greedy_proposal, memory_dp_proposal
from lightrec.distributed.planner.report import PlannerReport, TableReport
from lightrec.distributed.planner.sharder import ModuleSharder
from lightrec.distributed.planner.tables import ShardableModule, collect_tables, find_shardable_modules
from lightrec.distributed.planner.types import ParameterConstraints, PlannerError, Topology
from lightrec.distributed.sharding_env import resolve_group

__all__ = ["EmbeddingShardingPlanner"]

DEFAULT_BATCH_SIZE = 512
_MAX_REPAIR_ROUNDS = 200


def _gib(x: float) -> str:
    return f"{x / 1024**3:.3f} GiB"


class EmbeddingShardingPlanner:
    """Plans how to shard every embedding table of a model.

    Args:
        topology: the cluster; default: ``Topology(world_size)`` of the process group (or 1).
        batch_size: per-rank batch size used by the cost model (default 512).
        constraints: ``{table name: ParameterConstraints}``.
        storage_reservation: fraction of each rank's table memory kept free for everything else
            (dense parameters, activations); 0.0 plans right up to the caps.

    After :meth:`plan`, :attr:`last_report` holds the :class:`PlannerReport` of the returned plan.
    """

    def __init__(
        self,
        topology: Topology | None = None,
        batch_size: int | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        storage_reservation: float = 0.0,
    ) -> None:
        if topology is not None and not isinstance(topology, Topology):
            raise TypeError(f"topology must be a Topology, got {type(topology).__name__}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size <= 0):
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not 0.0 <= storage_reservation < 1.0:
            raise ValueError(f"storage_reservation must be in [0, 1), got {storage_reservation!r}")
        self._topology = topology
        self._batch_size = batch_size or DEFAULT_BATCH_SIZE
        self._constraints = dict(constraints or {})
        self._reservation = storage_reservation
        self.last_report: PlannerReport | None = None

    # ---- public API --------------------------------------------------------------------------
    def plan(self, module: nn.Module, sharders: list[ModuleSharder]) -> ShardingPlan:
        """Plan every shardable module of ``module`` (raises :class:`PlannerError` if none fits)."""
        topo = self._topology or Topology(world_size=dist.get_world_size() if dist.is_initialized() else 1)
        return self._plan(module, sharders, topo)

    def collective_plan(
        self, module: nn.Module, sharders: list[ModuleSharder], pg: dist.ProcessGroup | None = None
    ) -> ShardingPlan:
        """Plan on rank 0 of ``pg`` and broadcast, so every rank uses the identical plan.

        A planning error on rank 0 is raised on every rank (no rank is left waiting).
        """
        if not dist.is_initialized():
            return self.plan(module, sharders)
        pg = resolve_group(pg)
        world = dist.get_world_size(pg)
        topo = self._topology or Topology(
            world_size=world, compute_device="cuda" if dist.get_backend(pg) == "nccl" else "cpu"
        )
        if topo.world_size != world:
            raise ValueError(
                f"Topology(world_size={topo.world_size}) does not match the process group's {world} ranks"
            )
        # Rank 0 sends (plan JSON, report) or (the planning error, None).
        payload: list[tuple[str | Exception, PlannerReport | None] | None] = [None]
        if dist.get_rank(pg) == 0:
            try:
                plan = self._plan(module, sharders, topo)
                payload = [(plan.to_json(indent=None), self.last_report)]
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                payload = [(exc, None)]
        dist.broadcast_object_list(payload, src=dist.get_global_rank(pg, 0), group=pg)
        received = payload[0]
        assert received is not None  # broadcast_object_list filled it from rank 0
        body, report = received
        if isinstance(body, Exception):
            raise body
        self.last_report = report
        return ShardingPlan.from_json(body)

    def evaluate(self, module: nn.Module, sharders: list[ModuleSharder], plan: ShardingPlan) -> PlannerReport:
        """Estimate any plan (e.g. one written by hand) with the planner's cost model.

        Tables the plan does not mention are ignored. The report's memory may exceed the caps:
        compare ``report.hbm_bytes``/``ddr_bytes`` with the caps to check a hand-written plan.
        """
        topo = self._topology or Topology(world_size=dist.get_world_size() if dist.is_initialized() else 1)
        modules = find_shardable_modules(module, sharders)
        tables = collect_tables(modules, topo, self._constraints, self._batch_size)
        W = topo.world_size
        idx, st, kern, rows, cols, ranks = [], [], [], [], [], []
        reports = []
        for t, (path, name) in enumerate(tables.keys):
            mp = plan.get_plan_for_module(path)
            ps = None if mp is None else mp.get(name)
            if ps is None:
                continue
            code, k = SHARDING_TYPES.index(ps.sharding_type), KERNELS.index(ps.compute_kernel)
            if code == DP:
                shards = [(int(tables.rows[t]), int(tables.cols[t]), -1)]
            else:
                if not ps.sharding_spec:
                    raise ValueError(f"plan for table {name!r} ({ps.sharding_type}) has no sharding_spec")
                shards = [(s.shard_sizes[0], s.shard_sizes[1], s.rank) for s in ps.sharding_spec]
            for r, c, rank in shards:
                if rank >= W:
                    raise ValueError(
                        f"plan puts a shard of table {name!r} on rank {rank}; the topology has {W} ranks"
                    )
                idx.append(t)
                st.append(code)
                kern.append(k)
                rows.append(r)
                cols.append(c)
                ranks.append(rank)
            reports.append((t, ps, len(shards)))
        arr = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
        storage, cost = estimate_shards(tables, topo, arr(idx), arr(st), arr(kern), arr(rows), arr(cols))
        rank_arr, load, mem = arr(ranks), np.zeros(W), np.zeros(W)
        rep = rank_arr < 0  # data-parallel replicas: on every rank
        load += cost[rep].sum()
        mem += storage[rep].sum()
        np.add.at(load, rank_arr[~rep], cost[~rep])
        np.add.at(mem, rank_arr[~rep], storage[~rep])
        rows_out, pos = [], 0
        for t, ps, n in reports:
            mult = W if ps.sharding_type == "data_parallel" else 1
            rows_out.append(
                TableReport(
                    tables.keys[t][0],
                    tables.keys[t][1],
                    ps.sharding_type,
                    ps.compute_kernel,
                    list(ps.ranks or range(W)),
                    float(cost[pos : pos + n].sum() * mult),
                    float(storage[pos : pos + n].sum() * mult),
                )
            )
            pos += n
        on_hbm = topo.compute_device == "cuda"
        zeros = np.zeros(W)
        return PlannerReport(
            str(topo.compute_device),
            mem if on_hbm else zeros,
            zeros if on_hbm else mem,
            topo.hbm_caps.copy(),
            topo.ddr_caps.copy(),
            load,
            rows_out,
            0.0,
            "evaluated",
        )

    # ---- pipeline ----------------------------------------------------------------------------
    def _plan(self, module: nn.Module, sharders: list[ModuleSharder], topo: Topology) -> ShardingPlan:
        t0 = time.perf_counter()
        if self._reservation:
            keep = 1.0 - self._reservation
            topo = dataclasses.replace(
                topo, hbm_cap=(topo.hbm_caps * keep).tolist(), ddr_cap=(topo.ddr_caps * keep).tolist()
            )
        modules = find_shardable_modules(module, sharders)
        tables = collect_tables(modules, topo, self._constraints, self._batch_size)
        if len(tables) == 0:
            self.last_report = None
            return ShardingPlan({m.path: EmbeddingModuleShardingPlan() for m in modules})
        opts = enumerate_options(tables, topo)
        no_fit = [
            t
            for t in range(len(tables))
            if not opts.fits[opts.first[t] : opts.first[t] + opts.count[t]].any()
        ]
        if no_fit:
            raise _too_big_error(tables, opts, topo, no_fit)

        proposals = [("greedy", greedy_proposal(opts))]
        total = float(topo.storage_caps.sum())
        if opts.total_storage[proposals[0][1]].sum() > total:
            for fill in (1.0, 0.9):
                choice = memory_dp_proposal(opts, total * fill)
                if choice is not None and not any((choice == c).all() for _, c in proposals):
                    proposals.append(("memory_dp", choice))
        best: tuple[float, float, int] | None = None
        result: tuple[str, Placement] | None = None
        failed: Placement | None = None
        for i, (name, choice) in enumerate(proposals):
            pl = _place_with_repair(opts, choice.copy(), topo)
            if not pl.ok:
                failed = failed or pl
                continue
            pl = refine(opts, pl, topo)
            key = (float(pl.load.max()), float(opts.total_cost[pl.choice].sum()), i)
            if best is None or key < best:
                best, result = key, (name, pl)
        if result is None:
            assert failed is not None  # every proposal (there is at least the greedy one) failed to pack
            raise _no_packing_error(tables, opts, topo, failed)
        name, pl = result
        plan = _build_plan(modules, tables, opts, pl, topo)
        self.last_report = _build_report(tables, opts, pl, topo, name, time.perf_counter() - t0)
        return plan


def _place_with_repair(opts: Options, choice: np.ndarray, topo: Topology) -> Placement:
    """Partition; while tables do not pack, move them (or the biggest others) to smaller options."""
    pl = partition(opts, choice, topo)
    for _ in range(_MAX_REPAIR_ROUNDS):
        if pl.ok:
            return pl
        changed = False
        for t in pl.unplaced:
            o = escalate(opts, t, int(choice[t]))
            if o is not None:
                choice[t], changed = o, True
        if not changed:  # the stuck tables cannot shrink: shrink the largest others instead
            order = np.lexsort((np.arange(len(choice)), -opts.footprint[choice]))
            budget = max(1, len(pl.unplaced))
            for t in order.tolist():
                o = escalate(opts, t, int(choice[t]))
                if o is not None:
                    choice[t], changed = o, True
                    budget -= 1
                    if budget == 0:
                        break
        if not changed:
            return pl
        pl = partition(opts, choice, topo)
    return pl


def _shard_specs(opts: Options, o: int, ranks: np.ndarray, topo: Topology) -> list[ShardMetadata]:
    s, n = int(opts.start[o]), int(opts.nshards[o])
    rows, cols = opts.sh_rows[s : s + n], opts.sh_cols[s : s + n]
    st = int(opts.stype[o])
    row_off = np.concatenate([[0], np.cumsum(rows)[:-1]]) if st in (RW, TWRW) else np.zeros(n, np.int64)
    col_off = np.concatenate([[0], np.cumsum(cols)[:-1]]) if st in (CW, TWCW) else np.zeros(n, np.int64)
    device, local = str(topo.compute_device), topo.local_size
    return [
        ShardMetadata(
            [int(row_off[i]), int(col_off[i])],
            [int(rows[i]), int(cols[i])],
            placement_for(int(r), device, local),
        )
        for i, r in enumerate(ranks.tolist())
    ]


def _build_plan(
    modules: list[ShardableModule], tables: TableArrays, opts: Options, pl: Placement, topo: Topology
) -> ShardingPlan:
    index = {key: i for i, key in enumerate(tables.keys)}
    plan = ShardingPlan()
    for m in modules:
        mp = EmbeddingModuleShardingPlan()
        for name in m.configs:
            t = index[(m.path, name)]
            o = int(pl.choice[t])
            st = int(opts.stype[o])
            mp[name] = ParameterSharding(
                sharding_type=SHARDING_TYPES[st],
                compute_kernel=KERNELS[int(opts.kernel[o])],
                ranks=[int(r) for r in pl.ranks[t].tolist()],
                sharding_spec=None if st == DP else _shard_specs(opts, o, pl.ranks[t], topo),
            )
        plan.plan[m.path] = mp
    return plan


def _build_report(
    tables: TableArrays, opts: Options, pl: Placement, topo: Topology, proposer: str, seconds: float
) -> PlannerReport:
    zeros = np.zeros(topo.world_size)
    on_hbm = topo.compute_device == "cuda"
    rows = []
    for t, (path, name) in enumerate(tables.keys):
        o = int(pl.choice[t])
        rows.append(
            TableReport(
                path,
                name,
                SHARDING_TYPES[int(opts.stype[o])],
                KERNELS[int(opts.kernel[o])],
                [int(r) for r in pl.ranks[t].tolist()],
                float(opts.total_cost[o]),
                float(opts.total_storage[o]),
            )
        )
    return PlannerReport(
        compute_device=str(topo.compute_device),
        hbm_bytes=pl.storage.copy() if on_hbm else zeros,
        ddr_bytes=zeros.copy() if on_hbm else pl.storage.copy(),
        hbm_caps=topo.hbm_caps.copy(),
        ddr_caps=topo.ddr_caps.copy(),
        cost_s=pl.load.copy(),
        tables=rows,
        planning_s=seconds,
        proposer=proposer,
    )


# ---- errors that say what to change -------------------------------------------------------------
def _describe(tables: TableArrays, t: int, opts: Options) -> str:
    path, name = tables.keys[t]
    where = f" in {path!r}" if path else ""
    return f"table {name!r}{where} [{tables.rows[t]} x {tables.cols[t]}]"


def _advice(tables: TableArrays, opts: Options, topo: Topology, ts: list[int], need: float) -> list[str]:
    cap = float(topo.storage_caps.max())
    kind = "hbm_cap" if topo.compute_device == "cuda" else "ddr_cap"
    allowed = sorted({SHARDING_TYPES[c] for t in ts for c, _ in tables.allowed[t]})
    advice = [
        f"use more ranks: about {max(topo.world_size + 1, math.ceil(need / max(cap, 1.0)))} at this memory per rank"
    ]
    if not {"row_wise", "column_wise"} & set(allowed):
        advice.append(
            f"allow row_wise or column_wise sharding for these tables (ParameterConstraints(sharding_types=...) "
            f"now allows {allowed}) so they are split across ranks"
        )
    advice += [
        "reduce embedding_dim or num_embeddings of these tables, or store them in FP16",
        "use the fused kernel (the dense kernel keeps a full gradient) and a lighter optimizer "
        "(sgd keeps no state, rowwise_adagrad one float per row, adam two floats per weight)",
        f"give each rank more table memory: Topology({kind}=...) (now {_gib(cap)}), or lower the "
        "planner's storage_reservation",
    ]
    return advice


def _too_big_error(tables: TableArrays, opts: Options, topo: Topology, no_fit: list[int]) -> PlannerError:
    cap = float(topo.storage_caps.max())
    lines = [
        f"No sharding plan fits: {len(no_fit)} table(s) do not fit on {topo.world_size} rank(s) with "
        f"{_gib(cap)} of {topo.storage_kind} each:"
    ]
    worst = 0.0
    for t in no_fit:
        alts = np.arange(opts.first[t], opts.first[t] + opts.count[t])
        o = int(alts[np.lexsort((alts, opts.footprint[alts]))[0]])
        worst = max(worst, float(opts.footprint[o]))
        lines.append(
            f"  - {_describe(tables, t, opts)} needs at least {_gib(float(opts.footprint[o]))} on one rank "
            f"(its smallest option: {SHARDING_TYPES[int(opts.stype[o])]}/{KERNELS[int(opts.kernel[o])]} over "
            f"{int(opts.nshards[o])} shard(s)); a rank has {_gib(cap)}"
        )
    need = max(float(opts.total_storage[opts.first[t] : opts.first[t] + opts.count[t]].min()) for t in no_fit)
    lines.append("What to change:")
    lines += [f"  - {a}" for a in _advice(tables, opts, topo, no_fit, need)]
    return PlannerError("\n".join(lines), [tables.keys[t][1] for t in no_fit], worst, cap)


def _no_packing_error(tables: TableArrays, opts: Options, topo: Topology, pl: Placement) -> PlannerError:
    W = topo.world_size
    caps = topo.storage_caps
    least = np.array(
        [
            float(opts.total_storage[opts.first[t] : opts.first[t] + opts.count[t]].min())
            for t in range(len(tables))
        ]
    )
    need = float(least.sum())
    stuck = pl.unplaced or list(range(len(tables)))
    lines = [
        f"No sharding plan fits: the tables need at least {_gib(need)} of {topo.storage_kind} in all "
        f"({_gib(need / W)} per rank on average) but the {W} rank(s) have {_gib(float(caps.sum()))} "
        f"({_gib(float(caps.min()))} to {_gib(float(caps.max()))} per rank).",
        f"Tables that could not be placed ({len(stuck)}):",
    ]
    for t in stuck[:20]:
        lines.append(
            f"  - {_describe(tables, t, opts)} needs at least {_gib(float(least[t]))} summed over ranks"
        )
    if len(stuck) > 20:
        lines.append(f"  ... and {len(stuck) - 20} more")
    lines.append("What to change:")
    lines += [f"  - {a}" for a in _advice(tables, opts, topo, stuck, need)]
    return PlannerError("\n".join(lines), [tables.keys[t][1] for t in stuck], need / W, float(caps.max()))
