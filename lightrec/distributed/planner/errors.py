"""The planner's errors, which say what to change: no option of a table fits any rank, or the tables
do not pack together.

Both name the tables, what each needs at least (fast memory per rank; for tiered options also
host memory or SSD), what the ranks have, and the changes that would make a plan fit -- more ranks,
splitting sharding types, tiered kernels (every row on SSD or in host memory, a cache in fast
memory), a lighter optimizer, more memory or SSD in the ``Topology``.
"""

from __future__ import annotations

import math

import numpy as np

from lightrec.distributed.planner import shard_estimators as est  # est.RW, est.DP, ...: sharding type codes
from lightrec.distributed.planner.options import Options
from lightrec.distributed.planner.partitioners import Placement
from lightrec.distributed.planner.shard_estimators import KERNELS, SHARDING_TYPES, TIERED, TableArrays
from lightrec.distributed.planner.types import PlannerError, PlannerErrorType, Topology

__all__ = ["gib", "no_packing_error", "too_big_error"]


def gib(x: float) -> str:
    return f"{x / 1024**3:.3f} GiB"


def _describe(tables: TableArrays, t: int, opts: Options) -> str:
    path, name = tables.keys[t]
    where = f" in {path!r}" if path else ""
    return f"table {name!r}{where} [{tables.rows[t]} x {tables.cols[t]}]"


def _advice(tables: TableArrays, opts: Options, topo: Topology, ts: list[int], need: float) -> list[str]:
    cap = float(topo.storage_caps.max())
    kind = "hbm_cap" if topo.compute_device == "cuda" else "ddr_cap"
    allowed = sorted({SHARDING_TYPES[c] for t in ts for c, _ in tables.allowed[t]})
    if cap > 0:
        advice = [
            f"use more ranks: about {max(topo.world_size + 1, math.ceil(need / cap))} at this memory per rank"
        ]
    else:  # more ranks of no memory do not help (the count was need / 1 byte: "about 149760 ranks")
        advice = [f"every rank has 0 bytes of {topo.storage_kind} for tables: set Topology({kind}=...)"]
    if not {"row_wise", "column_wise"} & set(allowed):
        advice.append(
            f"allow row_wise or column_wise sharding for these tables (ParameterConstraints(sharding_types=...) "
            f"now allows {allowed}) so they are split across ranks"
        )
    kernels = {k for t in ts for _, ks in tables.allowed[t] for k in ks}
    over = (opts.sh_backing > topo.backing_caps.max(axis=0)).any(axis=1)
    if not kernels & set(TIERED):
        advice.append(
            "allow a tiered kernel for these tables: every row on SSD (ParameterConstraints(compute_kernels="
            "['key_value'])) or, on GPUs, in host memory ('fused_uvm_caching'), with a cache of hot rows in "
            f"{topo.storage_kind} (docs/tiered-tables.md)"
        )
    elif over.any():  # some tiered option's rows do not fit a rank's SSD (or host memory)
        advice.append(
            f"give each rank more SSD for key_value tables: Topology(ssd_cap=...) (now {gib(float(topo.ssd_caps.max()))}"
            + (f"), or more host memory: Topology(ddr_cap=...) (now {gib(float(topo.ddr_caps.max()))})"
               if topo.compute_device == "cuda" else ")")
        )  # fmt: skip
    advice += [
        "reduce embedding_dim or num_embeddings of these tables (training stores them in float32)",
        "use the fused kernel (the dense kernel keeps a full gradient) and a lighter optimizer "
        "(sgd keeps no state, rowwise_adagrad one float per row, adam two floats per weight)",
        f"give each rank more table memory: Topology({kind}=...) (now {gib(cap)}), or lower the "
        "planner's storage_reservation",
    ]
    return advice


def _binding(opts: Options, o: int, topo: Topology) -> tuple[float, float, str]:
    """``(bytes, bytes available, where)``: the shard of option ``o`` that fits its ranks worst, and
    the memory of the rank it must go on (``where`` says which, for the message).

    A table-wise or column-wise shard may go on any rank (the largest); a data-parallel replica goes
    on every rank (the smallest); row-wise shard ``i`` on rank ``i``; table-row/column-wise shard
    ``i`` on local rank ``i`` of the host that suits them best. With equal caps every case reads
    "a rank has" the cap.
    """
    caps = topo.storage_caps
    W, L = topo.world_size, topo.local_size
    s, n = int(opts.start[o]), int(opts.nshards[o])
    shards = opts.sh_storage[s : s + n]
    st = int(opts.stype[o])
    if st in (est.RW, est.TWRW, est.TWCW):
        if st == est.RW:
            slots = caps[np.arange(n) % W][None, :]  # [1, n]: shard i on rank i
        else:
            slots = caps.reshape(-1, L)[:, :n]  # [hosts, n]: shard i on local rank i of a host
        over = shards[None, :] - slots
        h = int(np.argmin(over.max(axis=1)))
        i = int(np.argmax(over[h]))
        rank = i if st == est.RW else h * L + i
        need, have = float(shards[i]), float(slots[h, i])
    else:
        rank = int(np.argmin(caps) if st == est.DP else np.argmax(caps))
        need, have = float(opts.footprint[o]), float(caps[rank])
    if float(caps.min()) == float(caps.max()):
        return need, have, f"a rank has {gib(have)}"
    if st == est.DP:
        return need, have, f"every rank holds a replica and rank {rank} has {gib(have)}"
    if st in (est.TW, est.CW):
        return need, have, f"the largest rank has {gib(have)}"
    return need, have, f"its shard {i} goes on rank {rank}, which has {gib(have)}"


def _caps_text(caps: np.ndarray, kind: str) -> str:
    lo, hi = float(caps.min()), float(caps.max())
    return f"{gib(hi)} of {kind} each" if lo == hi else f"{gib(lo)} to {gib(hi)} of {kind} per rank"


def too_big_error(tables: TableArrays, opts: Options, topo: Topology, no_fit: list[int]) -> PlannerError:
    lines = [
        f"No sharding plan fits: {len(no_fit)} table(s) do not fit on {topo.world_size} rank(s) with "
        f"{_caps_text(topo.storage_caps, topo.storage_kind)}:"
    ]
    worst: tuple[float, float, float] | None = None  # (shortfall, needed, available) of the worst table
    for t in no_fit:
        alts = np.arange(opts.first[t], opts.first[t] + opts.count[t])
        o = int(alts[np.lexsort((alts, opts.footprint[alts]))[0]])
        need, have, where = _binding(opts, o, topo)
        shortfall = (need - have, need, have)
        if need <= have and int(opts.kernel[o]) in TIERED:  # its cache fits: the backing tier does not
            backing = opts.sh_backing[int(opts.start[o]) : int(opts.start[o]) + int(opts.nshards[o])]
            tier = 1 if backing[:, 1].any() else 0
            b_need, b_have = float(backing[:, tier].max()), float(topo.backing_caps[:, tier].max())
            shortfall = (b_need - b_have, b_need, b_have)
        if worst is None or shortfall[0] > worst[0]:
            worst = shortfall
        lines.append(
            f"  - {_describe(tables, t, opts)} needs at least {gib(need)} on one rank "
            f"(its smallest option: {SHARDING_TYPES[int(opts.stype[o])]}/{KERNELS[int(opts.kernel[o])]} over "
            f"{int(opts.nshards[o])} shard(s)){_backing_needs(opts, o, topo)}; {where}"
        )
    assert worst is not None  # no_fit names at least one table
    need = max(float(opts.total_storage[opts.first[t] : opts.first[t] + opts.count[t]].min()) for t in no_fit)
    lines.append("What to change:")
    lines += [f"  - {a}" for a in _advice(tables, opts, topo, no_fit, need)]
    return PlannerError(
        "\n".join(lines), [tables.keys[t][1] for t in no_fit], worst[1], worst[2], PlannerErrorType.INSUFFICIENT_STORAGE
    )


def no_packing_error(tables: TableArrays, opts: Options, topo: Topology, pl: Placement) -> PlannerError:
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
        f"No sharding plan fits: the tables need at least {gib(need)} of {topo.storage_kind} in all "
        f"({gib(need / W)} per rank on average) but the {W} rank(s) have {gib(float(caps.sum()))} "
        f"({gib(float(caps.min()))} to {gib(float(caps.max()))} per rank).",
        f"Tables that could not be placed ({len(stuck)}):",
    ]
    for t in stuck[:20]:
        lines.append(
            f"  - {_describe(tables, t, opts)} needs at least {gib(float(least[t]))} summed over ranks"
        )
    if len(stuck) > 20:
        lines.append(f"  ... and {len(stuck) - 20} more")
    lines.append("What to change:")
    lines += [f"  - {a}" for a in _advice(tables, opts, topo, stuck, need)]
    return PlannerError(
        "\n".join(lines), [tables.keys[t][1] for t in stuck], need / W, float(caps.max()),
        PlannerErrorType.INSUFFICIENT_STORAGE,
    )  # fmt: skip


def _backing_needs(opts: Options, o: int, topo: Topology) -> str:
    """``" and 12 GiB of SSD (cache load factor 0.01); a rank has 1 TiB of SSD"`` for a tiered option."""
    if int(opts.kernel[o]) not in TIERED:
        return ""
    shards = opts.sh_backing[int(opts.start[o]) : int(opts.start[o]) + int(opts.nshards[o])]
    tier = 1 if shards[:, 1].any() else 0
    name, caps = ("SSD", topo.ssd_caps) if tier else ("host memory", topo.backing_caps[:, 0])
    return (
        f" and {gib(float(shards[:, tier].max()))} of {name} (cache load factor {float(opts.clf[o]):g}), where a "
        f"rank has {gib(float(caps.max()))} of {name}"
    )
