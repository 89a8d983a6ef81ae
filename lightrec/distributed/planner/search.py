"""The planner's search through torchrec-style parts: proposers propose, a partitioner places, a
perf model rates (``EmbeddingShardingPlanner`` uses it when given proposers, a partitioner or a perf
model other than lightrec's defaults; docs/planner.md). :class:`NoopPerfModel` (torchrec's
``torchrec.distributed.planner.perf_models`` path re-exports it) is the rating lightrec's planner
uses on its own.

Every proposal is one ``ShardingOption`` per table, drawn from the fitting options (the search
space every proposer is loaded with). lightrec's :class:`GreedyPerfPartitioner` (without
``balance_modules``) places with the vectorised :func:`~lightrec.distributed.planner.partitioners.partition`;
any other partitioner gets deep copies of the proposal and sets ``shard.rank``. A placement that
overflows a rank, or a partitioner raising ``PlannerError``, is fed back as not partitionable. The
best plan has the lowest rating (default: the busiest rank's cost), then the least total cost.
"""

from __future__ import annotations

import copy

import numpy as np

from lightrec.distributed.planner.options import Options, option_index, to_sharding_options
from lightrec.distributed.planner.partitioners import GreedyPerfPartitioner, Placement, partition
from lightrec.distributed.planner.shard_estimators import DP, TableArrays
from lightrec.distributed.planner.tables import ShardableModule
from lightrec.distributed.planner.types import (
    Partitioner,
    PerfModel,
    PlannerError,
    Proposer,
    ShardingOption,
    Topology,
)

__all__ = ["MAX_PROPOSALS", "NoopPerfModel", "protocol_search", "vectorised_partitioner"]

MAX_PROPOSALS = 100_000  # per proposer; a proposer that never stops is cut off here


class NoopPerfModel(PerfModel):
    """Rates a partitioned plan by its busiest rank: the largest summed shard cost of a rank
    (replicated shards count on every rank). Give ``EmbeddingShardingPlanner`` another
    :class:`~lightrec.distributed.planner.types.PerfModel` to choose among proposals by your rating."""

    def __init__(self, topology: Topology) -> None:
        self._topology = topology

    def rate(self, plan: list[ShardingOption]) -> float:
        load = [0.0] * self._topology.world_size
        for so in plan:
            for shard in so.shards:
                cost = shard.perf.total if shard.perf is not None else 0.0
                ranks = range(self._topology.world_size) if shard.rank is None else [shard.rank]
                for r in ranks:
                    load[r] += cost
        return max(load)


def vectorised_partitioner(partitioner: Partitioner | None) -> str | None:
    """The ``sort_by`` of the vectorised partition that serves ``partitioner``, or None if it must run itself."""
    if partitioner is None:
        return "perf"
    if type(partitioner) is GreedyPerfPartitioner and not partitioner.balance_modules:
        return partitioner.sort_by.value
    return None


def _choice(proposal: list[ShardingOption], tables: TableArrays, opts: Options) -> np.ndarray:
    choice = np.full(len(tables), -1, dtype=np.int64)
    for so in proposal:
        o = option_index(so, tables, opts)
        t = int(opts.table[o])
        if choice[t] >= 0:
            raise PlannerError(f"a proposal gives table {so.fqn!r} two options", [so.name], 0.0, 0.0)
        choice[t] = o
    missing = [tables.keys[t][1] for t in np.flatnonzero(choice < 0).tolist()]
    if missing:
        raise PlannerError(f"a proposal leaves out tables {missing}", missing, 0.0, 0.0)
    return choice


def _with_ranks(proposal: list[ShardingOption], pl: Placement, tables: TableArrays, opts: Options) -> list[ShardingOption]:
    out = copy.deepcopy(proposal)
    for so in out:
        t = int(opts.table[option_index(so, tables, opts)])
        ranks = pl.ranks[t].tolist()
        for i, shard in enumerate(so.shards):
            shard.rank = None if so.sharding_type == "data_parallel" else int(ranks[i])
    return out


def _placement_of(sos: list[ShardingOption], choice: np.ndarray, tables: TableArrays, opts: Options, topo: Topology) -> Placement:
    """Loads and memory of the ranks a custom partitioner gave the shards of ``sos``."""
    W = topo.world_size
    load, mem, back = np.zeros(W), np.zeros(W), np.zeros((W, 2))
    ranks: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(tables)
    for so in sos:
        o = option_index(so, tables, opts)
        t, start = int(opts.table[o]), int(opts.start[o])
        if int(opts.stype[o]) == DP:
            load += opts.sh_cost[start]
            mem += opts.sh_storage[start]
            back += opts.sh_backing[start]
            ranks[t] = np.arange(W, dtype=np.int64)
            continue
        placed = [s.rank for s in so.shards]
        if any(r is None or not 0 <= r < W for r in placed):
            raise PlannerError(f"the partitioner left shards of {so.fqn!r} without a valid rank: {placed}", [so.name], 0.0, 0.0)
        r = np.asarray(placed, dtype=np.int64)
        np.add.at(load, r, opts.sh_cost[start : start + len(r)])
        np.add.at(mem, r, opts.sh_storage[start : start + len(r)])
        np.add.at(back, r, opts.sh_backing[start : start + len(r)])
        ranks[t] = r
    fits = (mem <= topo.storage_caps).all() and (back <= topo.backing_caps).all()
    return Placement(choice, ranks, load, mem, [] if fits else list(range(len(tables))), back)


def protocol_search(
    opts: Options,
    tables: TableArrays,
    modules: list[ShardableModule],
    topo: Topology,
    batch_size: int,
    proposers: list[Proposer],
    partitioner: Partitioner | None,
    perf_model: PerfModel | None,
) -> tuple[str, Placement] | None:
    """Run every proposer against the partitioner; return ``(proposer name, best placement)`` or None."""
    space = to_sharding_options(tables, opts, modules, topo, batch_size, only_fitting=True)
    sort_by = vectorised_partitioner(partitioner)
    best: tuple[tuple[float, float, int], str, Placement] | None = None
    counter = 0
    for proposer in proposers:
        proposer.load(space)
        proposal = proposer.propose()
        for _ in range(MAX_PROPOSALS):
            if proposal is None:
                break
            choice = _choice(proposal, tables, opts)
            try:
                if sort_by is not None:
                    pl = partition(opts, choice, topo, sort_by)
                    plan = _with_ranks(proposal, pl, tables, opts) if pl.ok else None
                else:
                    assert partitioner is not None  # vectorised_partitioner(None) is "perf"
                    plan = partitioner.partition(copy.deepcopy(proposal), topo)
                    pl = _placement_of(plan, choice, tables, opts, topo)
            except PlannerError:
                pl, plan = None, None
            if pl is None or plan is None or not pl.ok:
                proposer.feedback(False, None, None, topo)
            else:
                rating = perf_model.rate(plan) if perf_model is not None else float(pl.load.max())
                proposer.feedback(True, plan, rating, topo)
                key = (rating, float(opts.total_cost[choice].sum()), counter)
                if best is None or key < best[0]:
                    best = (key, type(proposer).__name__, pl)
            counter += 1
            proposal = proposer.propose()
    return None if best is None else (best[1], best[2])
