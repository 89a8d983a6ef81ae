"""Reduce-scatter and all-gather over the batch dimension, with per-rank batch sizes that may differ.

Both are each other's adjoint, so they live together. Rows are samples; rank ``s`` owns ``B_s``
of them and the global batch is every rank's rows concatenated in rank order.

Backend choice (checked on torch 2.13): NCCL and gloo both implement ``reduce_scatter_single`` and
``all_gather_single`` (gloo gained reduce-scatter in recent releases; older torch raised; torch 2.11
and 2.12 name them ``reduce_scatter_tensor`` / ``all_gather_into_tensor``, which ``lightrec._compat``
picks), but both require *equal* shares. ``all_to_all_single`` takes arbitrary split sizes on every backend:

* reduce-scatter: each rank sends rank s its ``B_s`` rows; rank s sums the ``W`` pieces it receives
  (in rank order, so the result is deterministic) — the same bytes on the wire as a reduce-scatter.
  On CPU (gloo) this is used even for equal shares: measured on 2 and 3 gloo ranks
  ([2048 x 1664] float rows per rank) it took 0.5-0.8x the time of gloo's ``reduce_scatter_single``.
  GPU tensors (NCCL) use the native collective when shares are equal.
* all-gather: native ``all_gather_single`` for equal shares (on par with all-to-all on gloo);
  otherwise each rank sends its ``B_r`` rows to every rank.

On one host, CPU tensors go through shared memory instead (``shm_transport.py``), for both: the same
pieces, summed by the same ``sum(dim=0)``, so the same bits (not with ``CPU_NATIVE_REDUCE_SCATTER``).
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.distributed as dist

from lightrec._compat import all_gather_single, reduce_scatter_single
from lightrec.distributed.comm._autograd import Pending
from lightrec.distributed.comm.qcomm import RowCodec
from lightrec.distributed.comm.shm_transport import ShmExchange, ShmMismatchError, ShmTransport, shm_transport

__all__ = ["start_reduce_scatter", "start_all_gather", "CPU_NATIVE_REDUCE_SCATTER", "BatchExchangeMismatchError"]

#: Use gloo's ``reduce_scatter_single`` for CPU tensors with equal shares (slower; see above).
CPU_NATIVE_REDUCE_SCATTER = False


def _row_numel(x: torch.Tensor) -> int:
    return math.prod(x.shape[1:])


def _starts(batches: list[int]) -> list[int]:
    out, at = [], 0
    for b in batches:
        out.append(at)
        at += b
    return out


class BatchExchangeMismatchError(ValueError):
    """Ranks called a reduce-scatter or all-gather over the batch dimension (``PooledEmbeddingsReduceScatter``,
    ``PooledEmbeddingsAllGather`` and their backwards) with ``batch_size_per_rank``, rows of ``shape[1:]``
    or dtypes that do not fit together (raised on every rank that receives from a disagreeing peer)."""


def _geometry_check(kind: str, batches: list[int], rest: tuple[int, ...], dtype: torch.dtype) -> int:
    """The same int on every rank for the same exchange geometry (crc32: not Python's salted hash);
    the shared-memory exchange carries it, so ranks that disagree raise instead of mixing rows."""
    return zlib.crc32(f"{kind}|{batches}|{rest}|{dtype}".encode())


def _recv(ex: ShmExchange, src: int, kind: str, send: torch.Tensor, numel: int, batches: list[int], rank: int) -> torch.Tensor:
    """``src``'s whole chunk for this rank, ``[numel]`` of ``send``'s dtype; a chunk that does not fit
    (ranks that disagree about the geometry) raises :class:`BatchExchangeMismatchError` naming it."""
    try:
        return ex.recv_view(src, send.dtype, numel, whole=True)
    except ShmMismatchError as exc:
        item = send.element_size()
        same = "" if exc.sent != exc.expected else " (the same size, but the ranks' geometries differ)"
        raise BatchExchangeMismatchError(
            f"{kind}: the ranks disagree about batch_size_per_rank or the rows' shape[1:] or dtype: rank {src} "
            f"sent rank {rank} {exc.sent // item} values where {exc.expected // item} were expected{same} "
            f"(this rank, rank {rank}, has batch_size_per_rank={batches}, rows of shape[1:]="
            f"{tuple(send.shape[1:])}, dtype={send.dtype}). Pass the same batch_size_per_rank on every rank, "
            "and rows of the same shape[1:] and dtype"
        ) from exc


def _shm(x: torch.Tensor, batches: list[int], group: dist.ProcessGroup | None) -> ShmTransport | None:
    return shm_transport(group) if x.device.type == "cpu" and len(batches) > 1 else None


def _shm_reduce_scatter(shm: ShmTransport, send: torch.Tensor, batches: list[int], rank: int) -> Pending:
    """The all-to-all + sum through shared memory: the same ``[W, B, *rest]`` pieces summed by the
    same ``sum(dim=0)`` as the gloo path, so the same bits."""
    rest, row, starts, b_me = tuple(send.shape[1:]), _row_numel(send), _starts(batches), batches[rank]
    kind = "reduce-scatter (PooledEmbeddingsReduceScatter, or PooledEmbeddingsAllGather's backward)"
    ex = shm.start([b * row * send.element_size() for b in batches], _geometry_check(kind, batches, rest, send.dtype))
    for s, b in enumerate(batches):
        if s != rank and b * row > 0:
            ex.send_view(s, send.dtype, b * row).copy_(send[starts[s] : starts[s] + b].reshape(-1))
    ex.publish()

    def finish() -> torch.Tensor:
        pieces = send.new_empty((len(batches), b_me, *rest))
        for s in range(len(batches)):
            if s == rank:
                pieces[s].copy_(send[starts[rank] : starts[rank] + b_me])
            elif b_me * row > 0:
                pieces[s].copy_(_recv(ex, s, kind, send, b_me * row, batches, rank).view(b_me, *rest))
        ex.finish()
        return pieces.sum(dim=0)

    return Pending(None, finish, (send,))


def _shm_all_gather(shm: ShmTransport, send: torch.Tensor, batches: list[int], rank: int) -> Pending:
    """Every rank's rows to every rank through shared memory."""
    rest, row, starts, b_me = tuple(send.shape[1:]), _row_numel(send), _starts(batches), batches[rank]
    kind = "all-gather (PooledEmbeddingsAllGather, or PooledEmbeddingsReduceScatter's backward)"
    ex = shm.start([b_me * row * send.element_size()] * len(batches), _geometry_check(kind, batches, rest, send.dtype))
    for d in range(len(batches)):
        if d != rank and b_me * row > 0:
            ex.send_view(d, send.dtype, b_me * row).copy_(send.reshape(-1))
    ex.publish()

    def finish() -> torch.Tensor:
        out = send.new_empty((sum(batches), *rest))
        for s, b in enumerate(batches):
            if s == rank:
                out[starts[s] : starts[s] + b].copy_(send)
            elif b * row > 0:
                out[starts[s] : starts[s] + b].copy_(_recv(ex, s, kind, send, b * row, batches, rank).view(b, *rest))
        ex.finish()
        return out

    return Pending(None, finish, (send,))


def start_reduce_scatter(
    x: torch.Tensor, batches: list[int], rank: int, group: dist.ProcessGroup | None, codec: RowCodec | None = None
) -> Pending:
    """Start summing ``x`` ``[sum(batches), *rest]`` over ranks; rank r keeps its ``batches[r]`` rows.

    With ``codec`` every rank's rows travel encoded (``lightrec.distributed.comm.qcomm``) and are
    summed after decoding, in float32, in rank order.

    Returns a :class:`Pending` whose result is ``[batches[rank], *rest]``.
    """
    world_size = len(batches)
    rest = tuple(x.shape[1:])
    b_me = batches[rank]
    send = x.contiguous()
    native = x.device.type != "cpu" or CPU_NATIVE_REDUCE_SCATTER
    shm = None if native or codec is not None else _shm(x, batches, group)
    if shm is not None:
        return _shm_reduce_scatter(shm, send, batches, rank)
    if codec is None and native and all(b == b_me for b in batches):
        out = send.new_empty((b_me, *rest))
        work = reduce_scatter_single(out, send, group=group, async_op=True)
        return Pending(work, lambda: out, (send, out))
    row = _row_numel(x)
    if codec is not None:
        wire = codec.encode(send.reshape(-1, row))  # [sum B, wire bytes per row]
        width = wire.shape[1]
        in_splits, out_splits = [b * width for b in batches], [b_me * width] * world_size
        recv = wire.new_empty(sum(out_splits))
        work = dist.all_to_all_single(recv, wire.view(-1), out_splits, in_splits, group=group, async_op=True)

        def decoded_sum() -> torch.Tensor:
            rows = codec.decode(recv.view(world_size * b_me, width), row).to(x.dtype)
            return rows.view(world_size, b_me, *rest).sum(dim=0)

        return Pending(work, decoded_sum, (wire, recv))
    in_splits = [b * row for b in batches]
    out_splits = [b_me * row] * world_size
    recv = send.new_empty(sum(out_splits))
    work = dist.all_to_all_single(recv, send.view(-1), out_splits, in_splits, group=group, async_op=True)
    return Pending(work, lambda: recv.view(world_size, b_me, *rest).sum(dim=0), (send, recv))


def start_all_gather(
    x: torch.Tensor, batches: list[int], rank: int, group: dist.ProcessGroup | None, codec: RowCodec | None = None
) -> Pending:
    """Start gathering every rank's ``[batches[r], *rest]`` rows into ``[sum(batches), *rest]``
    (encoded on the wire with ``codec``)."""
    world_size = len(batches)
    rest = tuple(x.shape[1:])
    send = x.contiguous()
    total = sum(batches)
    shm = _shm(x, batches, group) if codec is None else None
    if shm is not None:
        return _shm_all_gather(shm, send, batches, rank)
    row = _row_numel(x)
    if codec is not None:
        wire = codec.encode(send.reshape(-1, row))
        width = wire.shape[1]
        if all(b == batches[rank] for b in batches):
            gathered = wire.new_empty((total, width))
            work = all_gather_single(gathered, wire, group=group, async_op=True)
            return Pending(work, lambda: codec.decode(gathered, row).to(x.dtype).view(total, *rest), (wire, gathered))
        flat = wire.reshape(1, -1).expand(world_size, wire.numel()).reshape(-1)
        out_splits = [b * width for b in batches]
        recv = wire.new_empty(sum(out_splits))
        work = dist.all_to_all_single(recv, flat, out_splits, [batches[rank] * width] * world_size, group=group,
                                      async_op=True)  # fmt: skip
        return Pending(work, lambda: codec.decode(recv.view(total, width), row).to(x.dtype).view(total, *rest),
                       (flat, recv))  # fmt: skip
    if all(b == batches[rank] for b in batches):
        out = send.new_empty((total, *rest))
        work = all_gather_single(out, send, group=group, async_op=True)
        return Pending(work, lambda: out, (send, out))
    # Every rank receives the same rows, so the input is sent once per destination.
    send = send.reshape(1, send.numel()).expand(world_size, send.numel()).reshape(-1)
    in_splits = [batches[rank] * row] * world_size
    out_splits = [b * row for b in batches]
    recv = send.new_empty(sum(out_splits))
    work = dist.all_to_all_single(recv, send, out_splits, in_splits, group=group, async_op=True)
    return Pending(work, lambda: recv.view(total, *rest), (send, recv))
