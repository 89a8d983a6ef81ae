"""The option arrays of the planner: every sharding option of every table, and its shards.

An *option* is (table, sharding type, kernel, number of shards). Options are stored as parallel
numpy arrays, table by table, and their shards as one flat array set
(:mod:`lightrec.distributed.planner.enumerators` fills them); :func:`finish_options` derives the
per-option aggregates from the shard arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lightrec.distributed.planner.estimators import DP, RW, TWCW, TWRW
from lightrec.distributed.planner.types import Topology

__all__ = ["Options", "finish_options"]


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


def finish_options(opts: Options, topo: Topology) -> Options:
    """Fill the per-option aggregates (``footprint`` ... ``fits``) from the shard arrays (in place).

    Called after enumeration, and again when custom estimators changed ``sh_storage`` / ``sh_cost``.
    """
    W, L = topo.world_size, topo.local_size
    start, stype, nshards = opts.start, opts.stype, opts.nshards
    sh_storage, sh_idx = opts.sh_storage, opts.sh_idx
    sh_type = np.repeat(stype, nshards)
    opts.footprint = np.maximum.reduceat(sh_storage, start)
    opts.max_cost = np.maximum.reduceat(opts.sh_cost, start)
    replicas = np.where(stype == DP, W, 1)
    opts.total_storage = np.add.reduceat(sh_storage, start) * replicas
    opts.total_cost = np.add.reduceat(opts.sh_cost, start) * replicas

    caps = topo.storage_caps
    fits = opts.footprint <= caps.max()
    fits &= np.where(stype == DP, opts.footprint <= caps.min(), True)
    # Row-wise shard i lives on rank i: every shard must fit its own rank.
    fits &= np.logical_and.reduceat(np.where(sh_type == RW, sh_storage <= caps[sh_idx % W], True), start)
    # Host-bound types: some host must hold all shards (shard i on local rank i).
    host_caps = caps.reshape(-1, L)
    for code in (TWRW, TWCW):
        for k in np.unique(nshards[stype == code]).tolist():
            group = np.flatnonzero((stype == code) & (nshards == k))
            mat = sh_storage[start[group][:, None] + np.arange(k)[None, :]]  # [O_g, k]
            ok = np.any(np.all(mat[:, None, :] <= host_caps[None, :, :k], axis=2), axis=1)
            fits[group] &= ok
    # Backing tiers (tiered kernels): every shard within some rank's host memory / SSD, row-wise
    # shard i within rank i's.
    backing, backing_caps = opts.sh_backing, topo.backing_caps
    fits &= np.logical_and.reduceat((backing <= backing_caps.max(axis=0)).all(axis=1), start)
    fits &= np.logical_and.reduceat(
        np.where(sh_type == RW, (backing <= backing_caps[sh_idx % W]).all(axis=1), True), start
    )
    opts.fits = fits
    return opts
