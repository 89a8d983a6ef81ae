"""Proposers: pick one option per table before placement.

* :func:`greedy_proposal` -- each table's cheapest option (least total cost over all ranks) that
  fits the topology on its own.
* :func:`memory_dp_proposal` -- near-exact: the choice that minimises the summed cost of all
  tables subject to their summed memory staying within ``fill`` of the cluster's memory, solved as
  a multiple-choice knapsack by dynamic programming over memory discretised into ``buckets``
  steps (each option's memory rounded up, so a found solution never exceeds the budget).
* :func:`escalate` -- repair step used when a proposal does not pack: move a table to its
  cheapest option with a smaller per-rank footprint (more shards, no replicas, no dense grads).

torchrec's proposer classes work on ``ShardingOption`` s (``load`` / ``propose`` / ``feedback``):
:class:`GreedyProposer` (as the planner's only proposer it runs lightrec's search above),
:class:`UniformProposer` (one sharding type for every table) and :class:`GridSearchProposer`
(every combination of each table's cheapest option per sharding type).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterator

import numpy as np

from lightrec.distributed.planner.options import Options
from lightrec.distributed.planner.types import Enumerator, Proposer, ShardingOption, Topology

__all__ = [
    "GreedyProposer",
    "GridSearchProposer",
    "UniformProposer",
    "escalate",
    "greedy_proposal",
    "memory_dp_proposal",
]


def greedy_proposal(opts: Options) -> np.ndarray:
    """``[T]`` option per table: least total cost among fitting options (ties: enumeration order).

    Tables with no fitting option get ``-1``.
    """
    key = np.where(opts.fits, opts.total_cost, np.inf)
    order = np.lexsort((np.arange(len(key)), key, opts.table))
    choice = order[opts.first]
    return np.where(np.isfinite(key[choice]), choice, -1)


def memory_dp_proposal(opts: Options, budget: float, buckets: int = 1024) -> np.ndarray | None:
    """Minimise ``sum(total_cost)`` subject to ``sum(total_storage) <= budget``.

    Args:
        opts: enumerated options (only fitting ones are used).
        budget: bytes available summed over ranks.
        buckets: memory resolution of the table (``budget / buckets`` bytes per step).

    Returns:
        ``[T]`` option per table, or ``None`` when even the smallest choice exceeds the budget.
    """
    if budget <= 0:
        return None
    unit = budget / buckets
    weight = np.ceil(opts.total_storage / unit).astype(np.int64)
    usable = opts.fits & (weight <= buckets)
    T = len(opts.first)
    best = np.zeros(buckets + 1)  # best[m]: least cost of the tables so far within m buckets
    pick = np.empty((T, buckets + 1), dtype=np.int32)
    for t in range(T):
        new = np.full(buckets + 1, np.inf)
        arg = np.full(buckets + 1, -1, dtype=np.int32)
        lo = int(opts.first[t])
        for o in range(lo, lo + int(opts.count[t])):
            if not usable[o]:
                continue
            w = int(weight[o])
            cand = best[: buckets + 1 - w] + opts.total_cost[o]
            better = cand < new[w:]
            new[w:] = np.where(better, cand, new[w:])
            arg[w:] = np.where(better, o, arg[w:])
        if not np.isfinite(new[buckets]):
            return None
        best, pick[t] = new, arg
    choice = np.empty(T, dtype=np.int64)
    m = buckets
    for t in range(T - 1, -1, -1):
        o = int(pick[t, m])
        choice[t] = o
        m -= int(weight[o])
    return choice


def escalate(opts: Options, t: int, o: int) -> int | None:
    """Cheapest fitting option of table ``t`` whose per-rank footprint is below option ``o``'s."""
    alts = np.arange(opts.first[t], opts.first[t] + opts.count[t])
    ok = opts.fits[alts] & (opts.footprint[alts] < opts.footprint[o] * (1 - 1e-9))
    if not ok.any():
        return None
    good = alts[ok]
    return int(good[np.lexsort((good, opts.total_cost[good]))[0]])


def _by_table(search_space: list[ShardingOption]) -> dict[tuple[str, str], list[ShardingOption]]:
    out: dict[tuple[str, str], list[ShardingOption]] = {}
    for so in search_space:
        out.setdefault((so.path, so.name), []).append(so)
    return out


def _cheapest(options: list[ShardingOption]) -> ShardingOption:
    return min(options, key=lambda so: so.total_perf)  # min keeps the first (enumeration order) on ties


def _cheapest_per_type(options: list[ShardingOption]) -> dict[str, ShardingOption]:
    out: dict[str, ShardingOption] = {}
    for so in options:
        if so.sharding_type not in out or so.total_perf < out[so.sharding_type].total_perf:
            out[so.sharding_type] = so
    return out


class _ListProposer(Proposer):
    """Proposes a precomputed sequence of proposals; feedback does not change it."""

    def __init__(self) -> None:
        self._proposals: Iterator[list[ShardingOption]] = iter(())

    def propose(self) -> list[ShardingOption] | None:
        return next(self._proposals, None)

    def feedback(
        self, partitionable: bool, plan: list[ShardingOption] | None = None, perf_rating: float | None = None,
        storage_constraint: Topology | None = None,
    ) -> None:  # fmt: skip
        return None  # the proposals were fixed by load()


class GreedyProposer(_ListProposer):
    """Each table's cheapest option (least summed cost over its shards).

    As ``EmbeddingShardingPlanner``'s only proposer it selects lightrec's own search: the greedy
    proposal, a memory-constrained one when memory binds, repair of tables that do not pack and
    refinement of the busiest rank (module docstring). Among other proposers it proposes the greedy
    choice once. ``use_depth`` / ``threshold`` are accepted for torchrec's signature.
    """

    def __init__(self, use_depth: bool = True, threshold: int | None = None) -> None:
        super().__init__()
        self.use_depth, self.threshold = use_depth, threshold

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None) -> None:
        self._proposals = iter([[_cheapest(opts) for opts in _by_table(search_space).values()]])


class UniformProposer(_ListProposer):
    """One proposal per sharding type every table offers: each table's cheapest option of that type."""

    def __init__(self, use_depth: bool = True) -> None:
        super().__init__()
        self.use_depth = use_depth

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None) -> None:
        per_table = [_cheapest_per_type(opts) for opts in _by_table(search_space).values()]
        common = [t for t in per_table[0] if all(t in p for p in per_table)] if per_table else []
        self._proposals = iter([[p[t] for p in per_table] for t in common])


class GridSearchProposer(_ListProposer):
    """Every combination of each table's cheapest option per sharding type, when there are at most
    ``max_proposals`` (otherwise none, with a warning -- torchrec's behaviour)."""

    def __init__(self, max_proposals: int = 10_000) -> None:
        super().__init__()
        self.max_proposals = max_proposals

    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None) -> None:
        choices = [list(_cheapest_per_type(opts).values()) for opts in _by_table(search_space).values()]
        total = math.prod(len(c) for c in choices)
        if total > self.max_proposals:
            warnings.warn(
                f"GridSearchProposer: {total} combinations exceed max_proposals={self.max_proposals}; it proposes "
                "nothing (raise max_proposals, constrain the tables, or use another proposer)",
                stacklevel=2,
            )
            self._proposals = iter(())
            return
        self._proposals = (list(combo) for combo in itertools.product(*choices))
