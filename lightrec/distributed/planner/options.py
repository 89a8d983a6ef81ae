"""The planner's options, both ways: lightrec's option arrays, and torchrec's ``ShardingOption`` s over them.

An *option* is (table, sharding type, kernel, number of shards). Options are stored as parallel
numpy arrays, table by table, and their shards as one flat array set
(:mod:`lightrec.distributed.planner.enumerators` fills them); :func:`finish_options` derives the
per-option aggregates from the shard arrays.

torchrec's planner parts (enumerators, estimators, proposers, partitioners, perf models) speak in
``ShardingOption`` s. :func:`to_sharding_options` builds one ``ShardingOption`` per option (its
shards carrying lightrec's storage and cost, and the option's index), :func:`option_index` maps a
``ShardingOption`` -- lightrec's, or one a custom enumerator built -- back to an option, and
:func:`write_back_estimates` copies estimates changed by custom estimators into the arrays.

lightrec's cost model gives one number per shard: it is reported as ``Perf.fwd_compute`` (the other
parts 0) and read back as ``Perf.total``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from lightrec.distributed.planner.plan import CacheParams, ShardingType, enum_value
from lightrec.distributed.planner.shard_estimators import (
    CW,
    DP,
    KERNELS,
    RW,
    SHARDING_TYPES,
    TIERED,
    TWCW,
    TWRW,
    TableArrays,
)
from lightrec.distributed.planner.tables import ShardableModule
from lightrec.distributed.planner.types import Perf, PlannerError, Shard, ShardingOption, Storage, Topology

__all__ = [
    "Options",
    "finish_options",
    "get_partition_by_type",
    "option_index",
    "shard_offsets",
    "to_sharding_options",
    "write_back_estimates",
]


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
        module: ``[T]`` index of the module (collection) each table belongs to, in order of first
            appearance (all 0 for options built by hand).
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
    module: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:  # options built without tiered kernels (tests, hand-made)
        if len(self.module) != len(self.first):
            self.module = np.zeros(len(self.first), dtype=np.int64)
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


# ---- torchrec's ShardingOption s over the arrays ------------------------------------------------
_PARTITION_BY = {
    ShardingType.TABLE_WISE.value: "device",
    ShardingType.COLUMN_WISE.value: "device",
    ShardingType.TABLE_ROW_WISE.value: "host",
    ShardingType.TABLE_COLUMN_WISE.value: "host",
    ShardingType.GRID_SHARD.value: "host",
    ShardingType.ROW_WISE.value: "uniform",
    ShardingType.DATA_PARALLEL.value: "uniform",
}


def get_partition_by_type(sharding_type: str) -> str:
    """How the partitioner places an option's shards: ``"device"`` (each shard on any rank),
    ``"host"`` (all shards on the ranks of one host) or ``"uniform"`` (one shard per rank, fixed)."""
    kind = enum_value(sharding_type, ShardingType, "sharding_type")
    return _PARTITION_BY[kind]


def shard_offsets(opts: Options, o: int) -> tuple[np.ndarray, np.ndarray]:
    """``(row offsets [n], col offsets [n])`` of the shards of option ``o`` in the full table."""
    s, n = int(opts.start[o]), int(opts.nshards[o])
    rows, cols = opts.sh_rows[s : s + n], opts.sh_cols[s : s + n]
    st = int(opts.stype[o])
    row_off = np.concatenate([[0], np.cumsum(rows)[:-1]]) if st in (RW, TWRW) else np.zeros(n, np.int64)
    col_off = np.concatenate([[0], np.cumsum(cols)[:-1]]) if st in (CW, TWCW) else np.zeros(n, np.int64)
    return row_off.astype(np.int64), col_off.astype(np.int64)


def _storage(nbytes: float, host_bytes: float, topo: Topology) -> Storage:
    """Fast-tier bytes in HBM (cuda) or DDR (cpu); a ``fused_uvm_caching`` shard's rows also in DDR."""
    b = int(round(nbytes))
    return Storage(hbm=b, ddr=int(round(host_bytes))) if topo.compute_device == "cuda" else Storage(hbm=0, ddr=b)


def to_sharding_options(
    tables: TableArrays,
    opts: Options,
    modules: list[ShardableModule],
    topo: Topology,
    batch_size: int,
    only_fitting: bool = False,
) -> list[ShardingOption]:
    """One ``ShardingOption`` per option (in option order; ``only_fitting``: the fitting ones)."""
    by_path = {m.path: m for m in modules}
    out = []
    for o in range(len(opts.stype)):
        if only_fitting and not opts.fits[o]:
            continue
        t = int(opts.table[o])
        path, name = tables.keys[t]
        module = by_path[path]
        cfg = module.configs[name]
        st, start, n = int(opts.stype[o]), int(opts.start[o]), int(opts.nshards[o])
        rows_off, cols_off = shard_offsets(opts, o)
        shards = [
            Shard(
                size=[int(opts.sh_rows[start + i]), int(opts.sh_cols[start + i])],
                offset=[int(rows_off[i]), int(cols_off[i])],
                storage=_storage(float(opts.sh_storage[start + i]), float(opts.sh_backing[start + i, 0]), topo),
                perf=Perf(float(opts.sh_cost[start + i]), 0.0, 0.0, 0.0),
            )
            for i in range(n)
        ]
        pooling = float(tables.ids[t] / tables.bags[t]) if tables.bags[t] else 1.0
        out.append(
            ShardingOption(
                name=name,
                tensor=torch.empty(int(tables.rows[t]), int(tables.cols[t]), device="meta"),
                module=(path, module.module),
                input_lengths=[pooling] * max(1, len(cfg.feature_names)),
                batch_size=batch_size,
                sharding_type=SHARDING_TYPES[st],
                partition_by=get_partition_by_type(SHARDING_TYPES[st]),
                compute_kernel=KERNELS[int(opts.kernel[o])],
                shards=shards,
                is_pooled=bool(tables.pooled[t]),
                feature_names=list(cfg.feature_names),
                cache_params=CacheParams(load_factor=float(opts.clf[o])) if int(opts.kernel[o]) in TIERED else None,
                _option_index=o,
                _estimates=[(copy.copy(sh.storage), copy.copy(sh.perf)) for sh in shards],  # type: ignore[misc]
            )
        )
    return out


def option_index(so: ShardingOption, tables: TableArrays, opts: Options) -> int:
    """The option ``so`` stands for: its recorded index, else the option of the same table, sharding
    type, kernel and shard count (a ``ShardingOption`` built by a custom enumerator; for a tiered
    kernel, the one of its ``cache_load_factor`` when lightrec enumerates it, else the first).

    Raises:
        PlannerError: lightrec has no such option (another sharding lightrec does not enumerate).
    """
    o = so._option_index
    if o is not None and o < len(opts.stype) and tables.keys[int(opts.table[o])] == (so.path, so.name):
        return int(o)
    for t, key in enumerate(tables.keys):
        if key != (so.path, so.name):
            continue
        alts = range(int(opts.first[t]), int(opts.first[t] + opts.count[t]))
        same = [
            o for o in alts
            if (SHARDING_TYPES[int(opts.stype[o])], KERNELS[int(opts.kernel[o])], int(opts.nshards[o]))
            == (str(so.sharding_type), str(so.compute_kernel), so.num_shards)
        ]  # fmt: skip
        clf = so.cache_load_factor
        exact = [o for o in same if clf is not None and np.isclose(opts.clf[o], clf)]
        if exact or same:
            return (exact or same)[0]
    raise PlannerError(
        f"sharding option {so.sharding_type}/{so.compute_kernel} x{so.num_shards} of table {so.fqn!r} is not one "
        "lightrec can build (it enumerates the shard counts in docs/planner.md); keep to lightrec's options",
        [so.name], 0.0, 0.0,
    )  # fmt: skip


def write_back_estimates(sos: list[ShardingOption], tables: TableArrays, opts: Options, topo: Topology) -> None:
    """Copy the shards' ``storage`` / ``perf`` of ``sos`` into ``opts`` and refresh its aggregates."""
    on_hbm = topo.compute_device == "cuda"
    for so in sos:
        o = option_index(so, tables, opts)
        start = int(opts.start[o])
        for i, shard in enumerate(so.shards[: int(opts.nshards[o])]):
            if shard.storage is not None:
                opts.sh_storage[start + i] = float(shard.storage.hbm if on_hbm else shard.storage.ddr)
            if shard.perf is not None:
                opts.sh_cost[start + i] = float(shard.perf.total)
    fits = opts.fits.copy()
    finish_options(opts, topo)
    opts.fits &= fits  # options a custom enumerator left out stay out
