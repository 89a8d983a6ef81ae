"""A publish's rows: each rank reads the rows of the union it owns, rank 0 receives them all.

The middle of :func:`~lightrec.distributed.deltas.publish_changes` (its steps 3), used on the
caller's thread or a :class:`~lightrec.distributed.deltas.BackgroundPublisher`'s: the union is cut
into chunks of about ``CHUNK_BYTES`` per rank; each rank reads the blocks of every chunk it owns
(``read_chunks``: no collective, at the step the version holds); then, chunk by chunk, the ranks
exchange which blocks they hold (and whether a read failed), and each sends only its values to rank
0 (``gather_rows``), which places them. Exactly one rank owns each value, so rank 0 gets every
value bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from lightrec.distributed.comm.failures import collective_guard
from lightrec.distributed.comm.sharding_env import resolve_group
from lightrec.distributed.comm.shm_transport import shm_transport
from lightrec.distributed.deltas.errors import DeltaError
from lightrec.distributed.deltas.rows import TableRows
from lightrec.distributed.model_tracker.tables import TrackedTable

__all__ = ["CHUNK_BYTES", "ChunkRead", "DeltaPublishError", "PublishGroup", "gather_rows", "raise_if_any",
           "read_chunks"]  # fmt: skip

CHUNK_BYTES = 64 * 2**20


class DeltaPublishError(DeltaError):
    """A rank could not take its part in a publish (the message names the rank and why); nothing was written."""


@dataclass
class PublishGroup:
    pg: dist.ProcessGroup | None
    rank: int
    world: int
    device: torch.device  # where the collectives' buffers live (CUDA for NCCL)

    def root(self) -> int:
        """Rank 0 of the group as a global rank (what the collectives' ``dst``/``src`` take)."""
        return dist.get_global_rank(resolve_group(self.pg), 0) if self.world > 1 else 0


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
          rank: int) -> tuple[list[_Block], list[torch.Tensor], torch.Tensor | None]:  # fmt: skip
    """This rank's part of ``chunk``, compact: the blocks it owns, their float32 values (a flat
    row-major ``[(hi - lo) * cols]`` copy per block, not concatenated: the send copies them once)
    and the raw ids of managed tables' rows in them."""
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
    return blocks, values, (torch.cat(raws) if raws else None)


def _gather_to_root(parts: list[torch.Tensor], dtype: torch.dtype, sizes: list[int], group: PublishGroup,
                    what: str) -> dict[int, torch.Tensor]:  # fmt: skip
    """Rank 0: ``{r: rank r's parts concatenated}`` for every other rank r (``sizes[r]`` elements of
    ``dtype``; rank 0 keeps its own parts); the others: ``{}``. On one host through shared
    memory (each rank copies its parts in, rank 0 copies them out: no padding, no TCP); else
    gloo's gather, padded to the longest part (it takes equal sizes)."""
    if group.world == 1:
        return {}
    with collective_guard("publish_changes: set-up of the shared-memory transport", group.pg):
        shm = shm_transport(group.pg) if group.device.type == "cpu" else None  # first use: a collective
    mine = sizes[group.rank]
    if shm is not None:
        with collective_guard(f"publish_changes: gather of the {what} to rank 0 (shared memory)", group.pg):
            element = torch.empty((), dtype=dtype).element_size()
            exchange = shm.start([mine * element if d == 0 else 0 for d in range(group.world)])
            if group.rank != 0 and mine:
                _concat_into(exchange.send_view(0, dtype, mine), parts)
            exchange.publish()
            out = {}
            if group.rank == 0:
                out = {src: exchange.recv_view(src, dtype, n).clone() for src, n in enumerate(sizes) if src}
            exchange.finish()
        return out
    padded = _concat_into(torch.zeros(max(sizes), dtype=dtype), parts)
    bits = (padded.view(torch.int32) if dtype == torch.float32 else padded).to(group.device)
    received = [torch.empty_like(bits) for _ in range(group.world)] if group.rank == 0 else None
    with collective_guard(f"publish_changes: gather of the {what} to rank 0", group.pg):
        dist.gather(bits, received, dst=group.root(), group=group.pg)
    if received is None:
        return {}
    return {src: (received[src].cpu().view(dtype) if dtype == torch.float32 else received[src].cpu())[:n]
            for src, n in enumerate(sizes) if src}  # fmt: skip


def _concat_into(target: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
    """``target`` (1-D) with ``parts`` copied one after the other from its start."""
    at = 0
    for part in parts:
        target[at : at + part.numel()].copy_(part.reshape(-1))
        at += part.numel()
    return target


@dataclass
class ChunkRead:
    """One chunk as this rank read it at the publish's step: its blocks, values and raw ids (``_read``),
    or the error that stopped the read (reported to every rank when the chunk is exchanged)."""

    chunk: list[_Piece]
    blocks: list[_Block]
    values: list[torch.Tensor]  # per block, as _read gives them
    raw: torch.Tensor | None
    error: BaseException | None


def read_chunks(union: dict[str, torch.Tensor], tables: dict[str, TrackedTable], rank: int,
                 budget: int) -> list[ChunkRead]:  # fmt: skip
    """This rank's part of every chunk of ``union``, read now (no collective): what the version holds."""
    reads = []
    for chunk in _chunks(union, tables, budget):
        try:
            reads.append(ChunkRead(chunk, *_read(chunk, tables, rank), None))
        except Exception as exc:  # noqa: BLE001 - reported to every rank with the blocks
            reads.append(ChunkRead(chunk, [], [], None, exc))
            break  # the exchange of this chunk raises on every rank: the rest would never be sent
    return reads


def gather_rows(union: dict[str, torch.Tensor], tables: dict[str, TrackedTable], reads: list[ChunkRead],
                 group: PublishGroup) -> dict[str, TableRows]:  # fmt: skip
    """Rank 0: ``{table: TableRows}`` of every row of ``union``; the other ranks: ``{}``.

    Per chunk, each rank sends only the values it read (``reads``, no zero padding where another rank
    owns the rows), with the blocks they fill; rank 0 places them. Exactly one rank owns each value,
    so rank 0 gets every value bit for bit."""
    parts: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {n: ([], []) for n in union}
    for read in reads:
        chunk = read.chunk
        ranks_blocks = raise_if_any(read.error, group, "read its rows", read.blocks)
        managed_rows = [sum(b.hi - b.lo for b in bs if tables[chunk[b.piece].name].managed) for bs in ranks_blocks]
        value_sizes = [sum((b.hi - b.lo) * b.cols for b in bs) for bs in ranks_blocks]
        all_values = _gather_to_root(read.values, torch.float32, value_sizes, group, "changed rows")
        raw = [read.raw] if read.raw is not None else []
        all_raw = _gather_to_root(raw, torch.int64, managed_rows, group, "managed rows' raw ids") if any(managed_rows) else {}
        if group.rank != 0:
            continue
        out = [torch.empty(p.ids.numel(), tables[p.name].dim) for p in chunk]  # every value is placed below
        out_raw = [torch.empty(p.ids.numel(), dtype=torch.int64) if tables[p.name].managed else None for p in chunk]
        for r, bs in enumerate(ranks_blocks):
            value_at, raw_at = 0, 0
            for i, b in enumerate(bs):
                n = (b.hi - b.lo) * b.cols
                flat = read.values[i] if r == 0 else all_values[r][value_at : value_at + n]
                out[b.piece][b.lo : b.hi, b.col : b.col + b.cols] = flat.view(-1, b.cols)
                value_at += n
                target = out_raw[b.piece]
                if target is not None:
                    own = read.raw if r == 0 else all_raw[r]
                    assert own is not None
                    target[b.lo : b.hi] = own[raw_at : raw_at + b.hi - b.lo]
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


def raise_if_any(error: BaseException | None, group: PublishGroup, what: str,
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
