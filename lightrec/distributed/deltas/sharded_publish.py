"""Publish a sharded model: gather the rows that changed from the ranks that hold them, write a version.

For ``DistributedModelParallel`` users (the Lightning ``DeltaPublisher`` callback calls the same)::

    from lightrec.distributed.deltas import publish_changes
    from lightrec.distributed.model_tracker import DeltaTrackerConfig

    tracker = dmp.init_torchrec_delta_tracker(DeltaTrackerConfig(consumers=["publish"]))
    publish_changes(dmp, "publish/", tracker, consumer="publish", row_format="int8")   # v1: a snapshot
    for step, batch in enumerate(batches, 1):
        train(dmp, batch)
        if step % 100 == 0:                                   # every rank calls it (a collective)
            publish_changes(dmp, "publish/", tracker, consumer="publish", global_step=step)

One publish, on every rank of the sharding group::

    1. what changed here: the tracker's rows of this rank's shards since the consumer's last read
       (a snapshot: every row; a dense-kernel table, which its dense optimizer may move anywhere:
       every row)
    2. all_gather -> per table, the union U over ranks (a data-parallel table's rows changed
       wherever any rank's batch touched them: every replica applied every update)
    3. per chunk of tables: each rank reads the rows of U it owns -- its row block (row-wise,
       table-row-wise), its column slice (column-wise, table-column-wise), the whole table
       (table-wise; data-parallel: rank 0) -- through the kernels (a tiered table's cache too),
       with, for managed tables, the raw ids its id map keeps for them; the blocks it filled go to
       every rank with the status exchange, the values (as int32 bits) to rank 0 by a gather of
       only what each rank owns; rank 0 places them: exactly one rank owns each value, so rank 0
       gets every value bit for bit
    4. rank 0 writes the version with ``DeltaWriter`` (rows converted to each table's row format
       there), with the dense weights when asked; every rank learns the outcome

A rank that dies mid-publish makes the others raise ``CollectiveError`` (naming the collective)
within the process group's timeout; rank 0 writes only after every rank's rows have arrived, and
the writer's rename is atomic, so the folder keeps complete versions only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.comm.failures import collective_guard
from lightrec.distributed.comm.sharding_env import resolve_group
from lightrec.distributed.deltas.errors import DeltaError, DeltaFormatError, DeltaWriteError
from lightrec.distributed.deltas.manifest import TableSpec
from lightrec.distributed.deltas.rows import TableRows
from lightrec.distributed.deltas.writer import DeltaWriter
from lightrec.distributed.dmp.placement import detached
from lightrec.distributed.model_parallel import DistributedModelParallel
from lightrec.distributed.model_tracker import ModelDeltaTracker, ModelDeltaTrackerTrec
from lightrec.distributed.model_tracker.delta_store import sorted_unique
from lightrec.distributed.model_tracker.tables import TrackedTable, find_tables, sharded_collections
from lightrec.distributed.sharding.collection import ShardedCollectionBase

__all__ = ["DeltaPublishError", "publish_changes", "sharded_dense_weights", "sharded_table_specs"]

_CHUNK_BYTES = 64 * 2**20


class DeltaPublishError(DeltaError):
    """A rank could not take its part in a publish (the message names the rank and why); nothing was written."""


@dataclass
class _Group:
    pg: dist.ProcessGroup | None
    rank: int
    world: int
    device: torch.device  # where the collectives' buffers live (CUDA for NCCL)

    def root(self) -> int:
        """Rank 0 of the group as a global rank (what the collectives' ``dst``/``src`` take)."""
        return dist.get_global_rank(resolve_group(self.pg), 0) if self.world > 1 else 0


def _group(model: nn.Module) -> _Group:
    envs = [m.sharding_env for _, m in sharded_collections(model)]
    if not envs:
        raise DeltaFormatError(f"{type(model).__name__} holds no sharded embedding collection; publish an "
                               "unsharded model with publish_snapshot / publish_rows")  # fmt: skip
    if any(e.pg is not envs[0].pg for e in envs[1:]):
        raise DeltaFormatError("the model's sharded collections use different process groups; publish each "
                               "collection's model separately")  # fmt: skip
    env = envs[0]
    distributed = dist.is_available() and dist.is_initialized() and env.world_size > 1
    nccl = distributed and dist.get_backend(resolve_group(env.pg)) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    return _Group(env.pg, env.rank if distributed else 0, env.world_size if distributed else 1, device)


def _by_name(tables: Mapping[str, TrackedTable]) -> dict[str, TrackedTable]:
    out: dict[str, TrackedTable] = {}
    for t in tables.values():
        if t.name in out:
            raise DeltaFormatError(f"two collections hold a table named {t.name!r} ({out[t.name].fqn}, {t.fqn}); the "
                                   "publish folder keys tables by name: rename one")  # fmt: skip
        out[t.name] = t
    return out


def sharded_table_specs(model: nn.Module, row_format: str | Mapping[str, str] = "fp32") -> list[TableSpec]:
    """The ``TableSpec`` of every table of a sharded ``model`` (the same on every rank; no collective).

    Raises:
        DeltaFormatError: no sharded collection, two tables with one name, or ``row_format``
            names a table the model does not have.
    """
    return _specs(_by_name(find_tables(model)[0]), row_format)


def _specs(tables: Mapping[str, TrackedTable], row_format: str | Mapping[str, str]) -> list[TableSpec]:
    formats = {n: row_format for n in tables} if isinstance(row_format, str) else dict(row_format)
    unknown = sorted(set(formats) - set(tables))
    if unknown:
        raise DeltaFormatError(f"row_format names tables {unknown} the model does not have; its tables: {sorted(tables)}")
    return [TableSpec(n, t.num_embeddings, t.dim, formats.get(n, "fp32"), t.managed) for n, t in tables.items()]


def sharded_dense_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every floating-point state-dict entry of ``model`` outside its sharded collections, float32 on
    the CPU, by the model's own names (the names a serving artifact exported from it keeps); copies,
    so training on does not change them."""
    root = model.module if isinstance(model, DistributedModelParallel) else model
    if isinstance(root, ShardedCollectionBase):
        return {}
    with detached(root, (ShardedCollectionBase,)):
        state = root.state_dict()
    return {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point()}  # fmt: skip


# ---- 1-2: what changed, as the union over ranks ---------------------------------------------------
def _local_changes(tables: dict[str, TrackedTable], tracker: ModelDeltaTracker | None, consumer: str | None,
                   snapshot: bool) -> dict[str, torch.Tensor]:  # fmt: skip
    read = tracker.get_unique_ids(consumer) if tracker is not None else {}
    out = {}
    for name, t in tables.items():
        if snapshot or not t.updates_touched_rows_only:
            out[name] = torch.arange(t.num_embeddings) if t.local or snapshot else torch.zeros(0, dtype=torch.int64)
        else:
            out[name] = read.get(t.fqn, torch.zeros(0, dtype=torch.int64)).cpu()
    return out


def _union(changes: dict[str, torch.Tensor], group: _Group, snapshot: bool,
           tables: dict[str, TrackedTable]) -> dict[str, torch.Tensor]:  # fmt: skip
    """Per table, the sorted union of every rank's changed rows (collective unless a snapshot)."""
    if snapshot:
        return {n: torch.arange(t.num_embeddings) for n, t in tables.items()}
    names = list(changes)
    if group.world == 1:
        return {n: sorted_unique([changes[n]]) for n in names}
    counts = torch.tensor([changes[n].numel() for n in names], dtype=torch.int64, device=group.device)
    all_counts = [torch.empty_like(counts) for _ in range(group.world)]
    with collective_guard("publish_changes: all_gather of the changed row counts", group.pg):
        dist.all_gather(all_counts, counts, group=group.pg)
    longest = max(int(c.sum()) for c in all_counts)
    flat = torch.zeros(longest, dtype=torch.int64, device=group.device)
    mine = torch.cat([changes[n] for n in names]) if names else flat[:0]
    flat[: mine.numel()] = mine.to(group.device)
    gathered = [torch.empty_like(flat) for _ in range(group.world)]
    with collective_guard("publish_changes: all_gather of the changed rows", group.pg):
        dist.all_gather(gathered, flat, group=group.pg)
    parts: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for rank_counts, rank_ids in zip(all_counts, gathered, strict=True):
        sizes = rank_counts.cpu().tolist()
        for n, piece in zip(names, torch.split(rank_ids.cpu()[: sum(sizes)], sizes), strict=True):
            parts[n].append(piece)
    return {n: sorted_unique(p) for n, p in parts.items()}


# ---- 3: the rows of the union, gathered to rank 0 -------------------------------------------------
@dataclass
class _Piece:
    name: str
    ids: torch.Tensor  # sorted global rows (a slice of the table's union)


def _chunks(union: dict[str, torch.Tensor], tables: dict[str, TrackedTable], budget: int) -> list[list[_Piece]]:
    """The pieces to gather, grouped so that each group's buffer stays near ``budget`` bytes."""
    chunks: list[list[_Piece]] = [[]]
    used = 0
    for name, ids in union.items():
        per_row = 4 * tables[name].dim + 8
        step = max(1, budget // per_row)
        for start in range(0, ids.numel(), step):
            piece = _Piece(name, ids[start : start + step])
            size = piece.ids.numel() * per_row
            if chunks[-1] and used + size > budget:
                chunks.append([])
                used = 0
            chunks[-1].append(piece)
            used += size
    return [c for c in chunks if c]


def _owned(t: TrackedTable, rank: int) -> list[tuple[int, int, int, int, int]]:
    """``(shard index, row offset, rows, col offset, cols)`` of the blocks of ``t`` whose rows this rank
    sends (a data-parallel table's replica is read on rank 0 only)."""
    if t.data_parallel:
        return [(s.shard_index, s.row_offset, s.rows, s.col_offset, s.cols) for s in t.local] if rank == 0 else []
    return [(s.shard_index, s.row_offset, s.rows, s.col_offset, s.cols) for s in t.local]


class _Block(NamedTuple):
    """Rows ``[lo, hi)`` of piece ``piece``, columns ``[col, col + cols)``: one rank's part of a chunk."""

    piece: int
    lo: int
    hi: int
    col: int
    cols: int


def _read(chunk: list[_Piece], tables: dict[str, TrackedTable],
          rank: int) -> tuple[list[_Block], torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """This rank's part of ``chunk``, compact: the blocks it owns, their float32 values flat in block
    order (row-major ``[hi - lo, cols]`` each) and the raw ids of managed tables' rows in them."""
    blocks: list[_Block] = []
    values: list[torch.Tensor] = []
    raws: list[torch.Tensor] = []
    for index, piece in enumerate(chunk):
        t = tables[piece.name]
        for shard_index, row_offset, rows, col_offset, cols in _owned(t, rank):
            # piece.ids is sorted: the rows inside this block are one slice of it (no masks)
            lo, hi = torch.searchsorted(piece.ids, torch.tensor([row_offset, row_offset + rows])).tolist()
            if lo == hi:
                continue
            local = next(s for s in t.local if s.shard_index == shard_index)
            read = local.kernel.kernel.read_rows(local.kernel_table, piece.ids[lo:hi] - row_offset).weights
            blocks.append(_Block(index, lo, hi, col_offset, cols))
            values.append(read.detach().to("cpu", torch.float32).reshape(-1))
            if t.managed:
                raws.append(t.raw_ids(piece.ids[lo:hi]))
    flat = torch.cat(values) if values else torch.zeros(0)
    return blocks, flat, (torch.cat(raws) if raws else None)


def _gather_to_root(part: torch.Tensor, sizes: list[int], group: _Group, what: str) -> list[torch.Tensor]:
    """Rank 0: every rank's ``part`` (rank r's has ``sizes[r]`` elements); the others: ``[]``.
    Padded to the longest part, as gloo's gather takes equal sizes."""
    if group.world == 1:
        return [part]
    longest = max(sizes)
    padded = torch.zeros(longest, dtype=part.dtype)
    padded[: part.numel()] = part
    bits = (padded.view(torch.int32) if padded.dtype == torch.float32 else padded).to(group.device)
    out = [torch.empty_like(bits) for _ in range(group.world)] if group.rank == 0 else None
    with collective_guard(f"publish_changes: gather of the {what} to rank 0", group.pg):
        dist.gather(bits, out, dst=group.root(), group=group.pg)
    if out is None:
        return []
    return [(o.cpu().view(part.dtype) if part.dtype == torch.float32 else o.cpu())[:n] for o, n in zip(out, sizes, strict=True)]


def _gather_rows(union: dict[str, torch.Tensor], tables: dict[str, TrackedTable], group: _Group,
                 budget: int) -> dict[str, TableRows]:  # fmt: skip
    """Rank 0: ``{table: TableRows}`` of every row of ``union``; the other ranks: ``{}``.

    Per chunk, each rank sends only the values it owns (no zero padding where another rank owns the
    rows), with the blocks they fill; rank 0 places them. Exactly one rank owns each value, so rank 0
    gets every value bit for bit."""
    parts: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {n: ([], []) for n in union}
    for chunk in _chunks(union, tables, budget):
        error = None
        blocks: list[_Block] = []
        values, raw = torch.zeros(0), None
        try:
            blocks, values, raw = _read(chunk, tables, group.rank)
        except Exception as exc:  # noqa: BLE001 - reported to every rank with the blocks
            error = exc
        ranks_blocks = _raise_if_any(error, group, "read its rows", blocks)
        managed_rows = [sum(b.hi - b.lo for b in bs if tables[chunk[b.piece].name].managed) for bs in ranks_blocks]
        all_values = _gather_to_root(values, [sum((b.hi - b.lo) * b.cols for b in bs) for bs in ranks_blocks],
                                     group, "changed rows")  # fmt: skip
        all_raw = (_gather_to_root(raw if raw is not None else torch.zeros(0, dtype=torch.int64), managed_rows,
                                   group, "managed rows' raw ids") if any(managed_rows) else [])  # fmt: skip
        if group.rank != 0:
            continue
        out = [torch.zeros(p.ids.numel(), tables[p.name].dim) for p in chunk]
        out_raw = [torch.zeros(p.ids.numel(), dtype=torch.int64) if tables[p.name].managed else None for p in chunk]
        for r, bs in enumerate(ranks_blocks):
            value_at, raw_at = 0, 0
            for b in bs:
                n = (b.hi - b.lo) * b.cols
                out[b.piece][b.lo : b.hi, b.col : b.col + b.cols] = all_values[r][value_at : value_at + n].view(-1, b.cols)
                value_at += n
                target = out_raw[b.piece]
                if target is not None:
                    target[b.lo : b.hi] = all_raw[r][raw_at : raw_at + b.hi - b.lo]
                    raw_at += b.hi - b.lo
        for piece, piece_values, piece_raw in zip(chunk, out, out_raw, strict=True):
            parts[piece.name][0].append(piece_values)
            if piece_raw is not None:
                parts[piece.name][1].append(piece_raw)
    if group.rank != 0:
        return {}
    rows = {}
    for name, ids in union.items():
        vals, raws = parts[name]
        values = (vals[0] if len(vals) == 1 else torch.cat(vals)) if vals else torch.zeros(0, tables[name].dim)
        raw_ids = (torch.cat(raws) if raws else torch.zeros(0, dtype=torch.int64)) if tables[name].managed else None
        rows[name] = TableRows(ids, values, raw_ids)
    return rows


def _raise_if_any(error: BaseException | None, group: _Group, what: str,
                  blocks: list[_Block] | None = None) -> list[list[_Block]]:  # fmt: skip
    """Collective: every rank learns whether any rank failed to ``what``; all raise if one did.
    Returns every rank's ``blocks`` (carried by the same exchange), by rank."""
    status: tuple[str | None, list[_Block]] = (None if error is None else f"{type(error).__name__}: {error}", blocks or [])
    everyone = [status]
    if group.world > 1:
        everyone = [(None, []) for _ in range(group.world)]
        with collective_guard(f"publish_changes: the ranks' status ({what})", group.pg):
            dist.all_gather_object(everyone, status, group=group.pg)
    failures = [f for f, _ in everyone]
    if error is not None:
        raise DeltaPublishError(f"rank {group.rank} could not {what}: {type(error).__name__}: {error}; nothing "
                                "was written") from error  # fmt: skip
    failed = [(r, f) for r, f in enumerate(failures) if f is not None]
    if failed:
        rank, message = failed[0]
        raise DeltaPublishError(f"rank {rank} could not {what} ({message}); nothing was written")
    return [list(bs) for _, bs in everyone]


# ---- 4: the write, on rank 0 ---------------------------------------------------------------------
def publish_changes(
    model: nn.Module,
    target: DeltaWriter | str | os.PathLike[str] | None,
    tracker: ModelDeltaTracker | None = None,
    consumer: str | None = None,
    dense: bool = False,
    snapshot: bool | None = None,
    global_step: int = 0,
    row_format: str | Mapping[str, str] = "fp32",
    retention: int | None = 2,
    chunk_bytes: int = _CHUNK_BYTES,
    dense_module: nn.Module | None = None,
) -> int:
    """Publish a sharded model's changed rows (or every row) as the next version. Collective.

    Args:
        model: a ``DistributedModelParallel`` or a module holding sharded collections (the same on
            every rank of their group); dense weights are named as in its state dict.
        target: on rank 0, a ``DeltaWriter`` or a folder (a writer is made with the model's
            ``sharded_table_specs(model, row_format)`` and ``retention``); ignored on the others.
        tracker: the model's delta tracker (``DistributedModelParallel.init_torchrec_delta_tracker``);
            a delta publishes what it reports since ``consumer``'s previous read (this call reads it;
            a snapshot reads it too, so the next delta starts from the snapshot). None: snapshots only.
        consumer: the tracker's consumer this publisher reads as (None: ``"default"``).
        dense: also publish the dense weights (a snapshot always does).
        snapshot: True: every row of every table and the dense weights; False: a delta; None: a
            snapshot when the folder has none yet (rank 0 decides), else a delta.
        global_step: the training step the version holds.
        row_format: the serving artifact's rows for every table, or ``{table: format}``
            (``"fp32"``, ``"fp16"``, ``"int8"``, ``"int4"``); used when ``target`` is a folder.
        retention: snapshots kept when ``target`` is a folder (``DeltaWriter``'s).
        chunk_bytes: rows travel in chunks of about this many bytes per rank.
        dense_module: the module whose state-dict names the dense weights take (the part a
            serving artifact is exported from, e.g. a LightningModule's ``model``); default ``model``.

    Returns:
        The new version, on every rank.

    Raises:
        DeltaFormatError: a delta without a tracker, bad rows (e.g. non-finite), a bad row format.
        DeltaWriteError: rank 0's disk refused the version (raised on every rank; nothing is visible).
        DeltaPublishError: a rank failed to read its rows (raised on every rank).
        CollectiveError: a peer died or hung during the publish.
    """
    if tracker is not None and not isinstance(tracker, ModelDeltaTrackerTrec):
        raise DeltaFormatError(f"tracker must be the model's ModelDeltaTrackerTrec, got {type(tracker).__name__}")
    group = _group(model)
    tables = _by_name(tracker.tables if tracker is not None else find_tables(model)[0])
    kind: list[object] = [None]
    writer: DeltaWriter | None = None
    error: BaseException | None = None
    if group.rank == 0:
        try:
            writer = target if isinstance(target, DeltaWriter) else DeltaWriter(
                _folder(target), _specs(tables, row_format), retention)  # fmt: skip
            kind[0] = bool(snapshot) if snapshot is not None else writer.latest_snapshot is None
        except (DeltaError, OSError) as exc:
            error = exc
    _raise_if_any(error, group, "open the publish folder")
    if group.world > 1:
        with collective_guard("publish_changes: broadcast of the version's kind", group.pg):
            dist.broadcast_object_list(kind, src=group.root(), group=group.pg)
    full = bool(kind[0])
    if not full and tracker is None:
        raise DeltaFormatError("a delta needs the tracker that says which rows changed: pass tracker= (or snapshot=True)")
    union = _union(_local_changes(tables, tracker, consumer, full), group, full, tables)
    rows = _gather_rows(union, tables, group, chunk_bytes)
    status: list[object] = [None]
    if group.rank == 0:
        assert writer is not None
        try:
            weights = sharded_dense_weights(dense_module or model) if dense or full else None
            if full:
                status[0] = writer.write_snapshot(rows, weights or {}, global_step)
            else:
                status[0] = writer.write_delta({n: r for n, r in rows.items() if r.ids.numel()}, weights, global_step)
        except Exception as exc:  # noqa: BLE001 - every rank learns it below; rank 0 re-raises it
            status[0] = exc
    if group.world > 1:
        shared: list[object] = [status[0] if isinstance(status[0], int) else _describe(status[0])]
        with collective_guard("publish_changes: broadcast of rank 0's write", group.pg):
            dist.broadcast_object_list(shared, src=group.root(), group=group.pg)
        if group.rank != 0:
            status[0] = shared[0]
    return _outcome(status[0])


def _folder(target: object) -> str | os.PathLike[str]:
    if not isinstance(target, (str, os.PathLike)):
        raise DeltaFormatError(f"target must be a DeltaWriter or a folder on rank 0, got {type(target).__name__}")
    return target


def _describe(outcome: object) -> tuple[str, str, int | None]:
    if isinstance(outcome, DeltaWriteError):
        return ("DeltaWriteError", str(outcome), outcome.errno)
    if isinstance(outcome, BaseException):
        return (type(outcome).__name__, str(outcome), None)
    return ("DeltaPublishError", f"rank 0 did not write: {outcome!r}", None)


def _outcome(outcome: object) -> int:
    if isinstance(outcome, int):
        return outcome
    if isinstance(outcome, BaseException):
        raise outcome
    assert isinstance(outcome, tuple)  # _describe's (kind, message, errno), from rank 0
    kind, message, errno = outcome
    if kind == "DeltaWriteError":
        raise DeltaWriteError(f"rank 0 could not write the version: {message}", errno)
    if kind == "DeltaFormatError":
        raise DeltaFormatError(f"rank 0 refused the version: {message}")
    raise DeltaPublishError(f"rank 0 failed to write the version: {kind}: {message}")
