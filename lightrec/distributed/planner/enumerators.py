"""Enumerate the sharding options of every table and estimate all their shards at once.

An *option* is (table, sharding type, kernel, number of shards, cache load factor -- tiered kernels
only, one option per load factor the table allows). Options are stored as parallel
numpy arrays, table by table, and their shards as one flat array set, so that estimating ~10^5
shards is a handful of vectorised numpy expressions rather than 10^5 Python objects.

Shard counts per sharding type (``W`` world size, ``L`` ranks per host, ``H`` hosts):

* table-wise, data-parallel: 1 (data-parallel's shard stands for the replica every rank holds);
* row-wise: ``W``; table-row-wise: ``L`` (one host);
* column-wise: ``k`` in 2, 4, 8, ... up to ``min(W, D // min_partition)`` (and that maximum);
* table-column-wise: ``min(L, D // min_partition)`` on one host.

Options equal to an earlier one on this topology are skipped (row-wise on one rank is table-wise,
table-row-wise on one host is row-wise, ...) unless the earlier one is not allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lightrec.distributed.planner.estimators import (
    CW,
    DP,
    RW,
    TIERED,
    TW,
    TWCW,
    TWRW,
    TableArrays,
    estimate_shards,
)
from lightrec.distributed.planner.types import Topology

__all__ = ["Options", "enumerate_options"]


@dataclass
class Options:
    """All options of all tables (``O`` options, ``S`` shards).

    Attributes:
        table, stype, kernel, nshards, start: ``[O]`` option description; the shards of option
            ``o`` are ``start[o] : start[o] + nshards[o]`` in the shard arrays.
        clf: ``[O]`` cache load factor of tiered options (0 for the others).
        first, count: ``[T]`` the options of table ``t`` are ``first[t] : first[t] + count[t]``.
        sh_idx, sh_rows, sh_cols, sh_storage, sh_cost: ``[S]`` shard index inside its option,
            shard shape, storage bytes and cost seconds.
        sh_backing, sh_hit: ``[S, 2]`` host-memory and SSD bytes, ``[S]`` expected cache hit rate
            (NaN: not tiered).
        footprint: ``[O]`` most bytes the option puts on one rank.
        max_cost: ``[O]`` cost of its most expensive shard.
        total_storage, total_cost: ``[O]`` summed over all ranks (replicas counted ``W`` times).
        fits: ``[O]`` whether the option fits the topology on its own.
    """

    table: np.ndarray
    stype: np.ndarray
    kernel: np.ndarray
    nshards: np.ndarray
    start: np.ndarray
    first: np.ndarray
    count: np.ndarray
    sh_idx: np.ndarray
    sh_rows: np.ndarray
    sh_cols: np.ndarray
    sh_storage: np.ndarray
    sh_cost: np.ndarray
    footprint: np.ndarray
    max_cost: np.ndarray
    total_storage: np.ndarray
    total_cost: np.ndarray
    fits: np.ndarray
    clf: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sh_backing: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    sh_hit: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:  # options built without tiered kernels (tests, hand-made)
        if len(self.clf) != len(self.table):
            self.clf = np.zeros(len(self.table))
        if len(self.sh_backing) != len(self.sh_storage):
            self.sh_backing = np.zeros((len(self.sh_storage), 2))
            self.sh_hit = np.full(len(self.sh_storage), np.nan)


def _column_counts(cols: int, min_partition: int, limit: int) -> list[int]:
    most = min(limit, cols // min_partition, cols)
    counts, k = [], 2
    while k <= most:
        counts.append(k)
        k *= 2
    if most >= 2 and most not in counts:
        counts.append(most)
    return counts


def _table_options(t: TableArrays, i: int, topo: Topology) -> list[tuple[int, int, int, float]]:
    """``(sharding type, kernel, shards, cache load factor)`` options of table ``i``, in preference order."""
    out = _shardings(t, i, topo)
    choices = t.clf_choices[i] if t.clf_choices else [0.2]
    return [(s, k, n, clf) for s, k, n in out for clf in (choices if k in TIERED else [0.0])]


def _shardings(t: TableArrays, i: int, topo: Topology) -> list[tuple[int, int, int]]:
    """``(sharding type, kernel, shards)`` of table ``i``, in preference order."""
    W, L, H = topo.world_size, topo.local_size, topo.num_hosts
    allowed = dict(t.allowed[i])
    cols, min_part = int(t.cols[i]), int(t.min_partition[i])
    out: list[tuple[int, int, int]] = []
    for stype, kernels in t.allowed[i]:
        for kernel in kernels:

            def has(other: int, kernel: int = kernel) -> bool:
                return kernel in allowed.get(other, [])

            if stype in (TW, DP):
                out.append((stype, kernel, 1))
            elif stype == RW:
                if not (W == 1 and has(TW)):
                    out.append((stype, kernel, W))
            elif stype == TWRW:
                if not ((H == 1 and has(RW)) or (L == 1 and has(TW))):
                    out.append((stype, kernel, L))
            elif stype == CW:
                counts = _column_counts(cols, min_part, W)
                if not counts and not has(TW):
                    counts = [1]
                out += [(stype, kernel, k) for k in counts]
            elif stype == TWCW:
                k = min(L, cols // min_part, cols)
                if k < 2 and not has(TW):
                    k = 1
                if k >= 1 and not (H == 1 and has(CW) and k in _column_counts(cols, min_part, W)):
                    out.append((stype, kernel, k))
    return out


def enumerate_options(t: TableArrays, topo: Topology) -> Options:
    """Enumerate every table's options and estimate all their shards."""
    W, L = topo.world_size, topo.local_size
    per_table = [_table_options(t, i, topo) for i in range(len(t))]
    count = np.array([len(o) for o in per_table], dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    flat = np.array([opt[:3] for opts in per_table for opt in opts], dtype=np.int64).reshape(-1, 3)
    clf = np.array([opt[3] for opts in per_table for opt in opts], dtype=np.float64)
    table = np.repeat(np.arange(len(t), dtype=np.int64), count)
    stype, kernel, nshards = flat[:, 0], flat[:, 1], flat[:, 2]
    start = np.concatenate([[0], np.cumsum(nshards)[:-1]]).astype(np.int64)

    # ---- expand options into shards -------------------------------------------------------
    sh_opt = np.repeat(np.arange(len(flat), dtype=np.int64), nshards)
    sh_idx = np.arange(int(nshards.sum()), dtype=np.int64) - start[sh_opt]
    sh_table, sh_type, n = table[sh_opt], stype[sh_opt], nshards[sh_opt]
    R, D = t.rows[sh_table], t.cols[sh_table]
    # Row blocks of ceil(R / n); trailing shards may be short or empty (types.row_wise_shard_sizes).
    block = -(-R // n)
    split_rows = np.clip(R - sh_idx * block, 0, block)
    # Column units of 4 when D % 4 == 0 and there are enough of them (types.column_wise_shard_sizes).
    unit = np.where((D % 4 == 0) & (D // 4 >= n), 4, 1)
    q, r = np.divmod(D // unit, n)
    split_cols = (q + (sh_idx < r)) * unit
    row_split = (sh_type == RW) | (sh_type == TWRW)
    col_split = (sh_type == CW) | (sh_type == TWCW)
    sh_rows = np.where(row_split, split_rows, R)
    sh_cols = np.where(col_split, split_cols, D)
    est = estimate_shards(t, topo, sh_table, sh_type, kernel[sh_opt], sh_rows, sh_cols, clf[sh_opt])
    sh_storage, sh_cost = est.storage, est.cost

    # ---- per-option aggregates ------------------------------------------------------------
    footprint = np.maximum.reduceat(sh_storage, start)
    max_cost = np.maximum.reduceat(sh_cost, start)
    replicas = np.where(stype == DP, W, 1)
    total_storage = np.add.reduceat(sh_storage, start) * replicas
    total_cost = np.add.reduceat(sh_cost, start) * replicas

    caps = topo.storage_caps
    fits = footprint <= caps.max()
    fits &= np.where(stype == DP, footprint <= caps.min(), True)
    # Row-wise shard i lives on rank i: every shard must fit its own rank.
    rw_ok = np.logical_and.reduceat(np.where(sh_type == RW, sh_storage <= caps[sh_idx % W], True), start)
    fits &= rw_ok
    # Host-bound types: some host must hold all shards (shard i on local rank i).
    host_caps = caps.reshape(-1, L)
    for code in (TWRW, TWCW):
        for k in np.unique(nshards[stype == code]).tolist():
            opts = np.flatnonzero((stype == code) & (nshards == k))
            mat = sh_storage[start[opts][:, None] + np.arange(k)[None, :]]  # [O_g, k]
            ok = np.any(np.all(mat[:, None, :] <= host_caps[None, :, :k], axis=2), axis=1)
            fits[opts] &= ok
    # Backing tiers (tiered kernels): every shard within some rank's host memory / SSD, row-wise
    # shard i within rank i's.
    backing_caps = topo.backing_caps
    fits &= np.logical_and.reduceat((est.backing <= backing_caps.max(axis=0)).all(axis=1), start)
    fits &= np.logical_and.reduceat(
        np.where(sh_type == RW, (est.backing <= backing_caps[sh_idx % W]).all(axis=1), True), start
    )
    return Options(
        table=table,
        stype=stype,
        kernel=kernel,
        nshards=nshards,
        start=start,
        clf=clf,
        first=first,
        count=count,
        sh_idx=sh_idx,
        sh_rows=sh_rows,
        sh_cols=sh_cols,
        sh_storage=sh_storage,
        sh_cost=sh_cost,
        sh_backing=est.backing,
        sh_hit=est.hit_rate,
        footprint=footprint,
        max_cost=max_cost,
        total_storage=total_storage,
        total_cost=total_cost,
        fits=fits,
    )
