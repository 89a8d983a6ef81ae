"""Proposers: pick one option per table before placement.

* :func:`greedy_proposal` -- each table's cheapest option (least total cost over all ranks) that
  fits the topology on its own.
* :func:`memory_dp_proposal` -- near-exact: the choice that minimises the summed cost of all
  tables subject to their summed memory staying within ``fill`` of the cluster's memory, solved as
  a multiple-choice knapsack by dynamic programming over memory discretised into ``buckets``
  steps (each option's memory rounded up, so a found solution never exceeds the budget).
* :func:`escalate` -- repair step used when a proposal does not pack: move a table to its
  cheapest option with a smaller per-rank footprint (more shards, no replicas, no dense grads).
"""

from __future__ import annotations

import numpy as np

from lightrec.distributed.planner.enumerators import Options

__all__ = ["escalate", "greedy_proposal", "memory_dp_proposal"]


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
