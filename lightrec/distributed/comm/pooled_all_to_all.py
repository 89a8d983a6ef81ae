"""Pooled-embedding all-to-all: the output dist of table-wise and column-wise sharding.

After the input dist every rank holds the pooled embeddings of *its* features for the *global*
batch (every rank's samples, concatenated in rank order). The output dist sends each sample's rows
back to the rank that owns the sample; the receiver lays the pieces side by side in rank order::

    before (rank r: features it owns, all samples)      after (rank s: its samples, all features)

               D_0   D_1   D_2                                  D_0 | D_1 | D_2
    rank 0   [ A0 ]                                   rank 0   [ A0  | B0  | C0 ]   B_0 rows
             [ A1 ]   rows: B_0 of rank 0's samples,  rank 1   [ A1  | B1  | C1 ]   B_1 rows
             [ A2 ]   then B_1 of rank 1's, then ...  rank 2   [ A2  | B2  | C2 ]   B_2 rows
    rank 1         [ B0 ; B1 ; B2 ]
    rank 2               [ C0 ; C1 ; C2 ]

    input  on rank r: [B_0 + ... + B_{W-1}, D_r]
    output on rank s: [B_s, D_0 + ... + D_{W-1}]

``D_r`` (``dim_sum_per_rank``) may be 0 (a rank that owns no feature) and the per-rank batch sizes
``B_s`` may differ. Backward is the reverse all-to-all: rank s's output gradient, cut into its
``D_r`` column blocks, goes back to each rank r, which stacks the blocks in sample-rank order.

What the hot path of a sharded collection adds, all optional (torchrec's call shape is the default):

* **Column order** (``column_order``): the received blocks are written straight into the order
  the collection's features want, one strided copy per *placement* (``_placements.py``), instead
  of a concatenation and then a permutation; the backward gathers each destination's columns out
  of the output gradient the same way.
* **Gradient scale** (``grad_scale``): applied while packing the gradient (one rounding, as a copy
  then a multiply), e.g. ``1 / world_size`` (docs/sharding.md: gradients are those of the mean of
  the per-rank losses).
* **Deferred input gradient** (``defer_input_grad``): the backward all-to-all starts as soon as the
  output gradient exists and is waited for after the rest of the backward pass, which then runs the
  lookup's backward (``_autograd.py``).
* **Quantized communication** (``codecs``, ``comm/qcomm.py``): each destination's rows are encoded
  after packing (the gradient scale applied first) and decoded on arrival, forward and backward
  (fp16 / bf16: half the bytes of float32).

**Shared memory** on one host (``shm_transport.py``): when every rank of the group runs on this
host and the tensors are on the CPU, the forward copies each destination's rows into the sender's
shared segment and the receiver copies them straight into the output's columns (two copies, no
gloo); the backward packs each destination's (scaled) gradient columns straight into the segment.
The same bytes as the gloo path, so the same results bit for bit.

**Lookup into the exchange** (:meth:`PooledEmbeddingsAllToAll.prepare`, shared memory only): a
sharded collection starts the forward exchange *before* its lookup and hands the lookup the places
the rows go -- each peer's rows to its chunk of the shared segment, the own rows to their column
block of the output (:class:`~lightrec.kernels.kernel_interface.OutRows`). A kernel that writes there
itself (the torch kernel's one-id-per-bag gather) saves two of the forward's three copies of
``B * D_me`` floats; for any other kernel the lookup copies its output there, the same copies as
before. The bytes that arrive are the same either way.

Always: **no self-transfer.** A rank's own samples never go through the collective: the forward
reads them straight from the input and the backward packs their gradient straight into the input
gradient (half the bytes through gloo on 2 ranks). The collective takes each rank's chunks from one
contiguous range of its buffer, so this needs the other ranks' rows on one side of the own rows:
the first and the last rank skip themselves (every rank when ``W = 2``); middle ranks send to
themselves as a plain all-to-all would.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from lightrec.distributed.comm._autograd import (
    CollectiveAwaitable,
    Pending,
    group_rank_and_size,
    per_rank_counts,
)
from lightrec.distributed.comm._placements import Placement, rank_placements
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs, RowCodec
from lightrec.distributed.comm.shm_transport import ShmExchange, ShmMismatchError, ShmTransport, shm_transport
from lightrec.kernels.kernel_interface import OutRows

#: ``view(rank, numel)``: a flat ``[numel]`` view of the shared-memory chunk to or from ``rank``.
SegmentView = Callable[[int, int], torch.Tensor]

__all__ = [
    "PlacedExchange", "PooledEmbeddingsAllToAll", "PooledEmbeddingsAllToAllError", "PooledEmbeddingsAwaitable",
    "check_batch_sizes",
]  # fmt: skip


class PooledEmbeddingsAllToAllError(ValueError):
    """Ranks called the pooled-embedding all-to-all with ``dim_sum_per_rank`` or ``batch_size_per_rank``
    that do not fit together (raised on every rank that receives from a disagreeing peer)."""


def _geometry_check(dims: list[int], batches: list[int]) -> int:
    """The same int on every rank for the same widths and batch sizes (crc32: not Python's salted hash);
    the shared-memory exchanges carry it, so ranks that disagree raise instead of mixing rows."""
    return zlib.crc32(f"{dims}|{batches}".encode())


def _recv(ex: ShmExchange, src: int, dtype: torch.dtype, numel: int, layout: PooledEmbeddingsAllToAll,
          batches: list[int]) -> torch.Tensor:
    """``src``'s whole chunk for this rank, ``[numel]``; a chunk that does not fit (ranks that disagree
    about the geometry) raises :class:`PooledEmbeddingsAllToAllError` naming both arguments."""
    try:
        return ex.recv_view(src, dtype, numel, whole=True)
    except ShmMismatchError as exc:
        item = torch.empty((), dtype=dtype).element_size()
        raise PooledEmbeddingsAllToAllError(
            f"PooledEmbeddingsAllToAll: the ranks disagree about dim_sum_per_rank or batch_size_per_rank: rank "
            f"{src} sent rank {layout.rank} {exc.sent // item} values where {exc.expected // item} were expected "
            f"(this rank, rank {layout.rank}, has dim_sum_per_rank={layout.dims}, batch_size_per_rank={batches}). "
            "Build PooledEmbeddingsAllToAll with the same dim_sum_per_rank on every rank and pass the same "
            "batch_size_per_rank on every rank"
        ) from exc


def check_batch_sizes(
    batch_size_per_rank: list[int] | None, total: int, world_size: int, what: str
) -> list[int]:
    """Validate ``batch_size_per_rank`` against ``total`` rows, or split ``total`` evenly when None."""
    if batch_size_per_rank is None:
        if total % world_size != 0:
            raise ValueError(
                f"{what}: the input has {total} rows, which does not split evenly over "
                f"{world_size} ranks; pass batch_size_per_rank=[...] with each rank's batch size"
            )
        return [total // world_size] * world_size
    sizes = per_rank_counts(batch_size_per_rank, world_size, "batch_size_per_rank", "batch sizes", what)
    if sum(sizes) != total:
        raise ValueError(
            f"{what}: batch_size_per_rank={sizes} sums to {sum(sizes)} but the input has {total} "
            f"rows; the input must hold every rank's samples, concatenated in rank order"
        )
    return sizes


def _others(flat: torch.Tensor, rows_before: int, own_rows: int, width: int, skip_self: bool) -> torch.Tensor:
    """The part of a flat ``[sum B * width]`` buffer (rows in source-rank order) that the collective
    reads or writes: everything, or -- skipping the own rows -- the rows after them (first rank)
    or before them (last rank)."""
    if not skip_self:
        return flat
    if rows_before == 0:
        return flat[own_rows * width :]
    return flat[: rows_before * width]


def _wire_width(width: int, codec: RowCodec | None) -> int:
    """Elements per row on the wire: ``width`` floats, or the codec's bytes."""
    return width if codec is None else codec.wire_width(width)


class PlacedExchange:
    """A forward exchange started before the lookup (:meth:`PooledEmbeddingsAllToAll.prepare`).

    Attributes:
        out_rows: where the lookup writes its ``[sum B, D_me]`` rows: each peer's rows into its chunk of
            the shared segment, this rank's own rows into their column block of :attr:`out`.
        out: ``[B_me, sum D]``, the output the exchange fills.
        batches: ``[W]`` batch size per rank.
    """

    def __init__(self, exchange: ShmExchange, out: torch.Tensor, out_rows: OutRows, batches: list[int]) -> None:
        self.exchange, self.out, self.out_rows, self.batches = exchange, out, out_rows, batches

    def cancel(self) -> None:
        """The lookup failed: take the exchange back (``ShmExchange.cancel``), so that this rank's next
        exchange is numbered as on the ranks that had not started theirs yet."""
        self.exchange.cancel()


class _PooledAllToAllOp:
    """One call's geometry: forward and adjoint all-to-all (see the module docstring)."""

    def __init__(self, layout: PooledEmbeddingsAllToAll, batches: list[int], placed: PlacedExchange | None = None) -> None:
        self.layout = layout
        self.batches = batches
        self.placed = placed
        self.check = _geometry_check(layout.dims, batches)
        # Set by a placed forward whose kernel wrote the rows itself: its backward reads the gradient
        # rows where they arrive (OutRows.give_grad).
        self.grad_rows: OutRows | None = None

    def _row_starts(self) -> list[int]:
        starts, at = [], 0
        for b in self.batches:
            starts.append(at)
            at += b
        return starts

    def _peer_row_blocks(self, view: SegmentView) -> Iterator[tuple[slice, torch.Tensor]]:
        """Per peer ``s`` with rows of this rank's columns: its rows of the ``[sum B, D_me]`` input
        (a slice) and ``view(s, B_s * D_me)`` as ``[B_s, D_me]`` (the shared-memory chunk for them)."""
        me = self.layout.rank
        d_me = self.layout.dims[me]
        for s, (b, start) in enumerate(zip(self.batches, self._row_starts())):
            if s != me and b * d_me > 0:
                yield slice(start, start + b), view(s, b * d_me).view(b, d_me)

    def _own_rows(self, local: torch.Tensor) -> torch.Tensor:
        """This rank's own samples' ``[B_me, D_me]`` rows of a ``[sum B, D_me]`` tensor."""
        start = self._row_starts()[self.layout.rank]
        return local[start : start + self.batches[self.layout.rank]]

    def _column_blocks(self, own: torch.Tensor | None, view: SegmentView) -> Iterator[tuple[int, torch.Tensor]]:
        """Per rank ``r`` with columns: ``r`` and its ``[B_me, D_r]`` block -- ``own`` for this rank
        (skipped where None), else ``view(r, B_me * D_r)`` (its shared-memory chunk)."""
        me = self.layout.rank
        b_me = self.batches[me]
        for r, width in enumerate(self.layout.dims):
            if r == me:
                if own is not None:
                    yield r, own
            elif b_me * width > 0:
                yield r, view(r, b_me * width).view(b_me, width)

    def _place(self, out: torch.Tensor, rank: int, block: torch.Tensor) -> None:
        """Copy rank ``rank``'s ``[B, D_rank]`` block into its columns of ``out``."""
        for p in self.layout.placements[rank]:
            p.output_view(out).copy_(p.block_view(block))

    def _pack(self, grad: torch.Tensor, rank: int, dst: torch.Tensor) -> None:
        """Gather rank ``rank``'s columns out of the (possibly strided) gradient into ``dst``
        ``[B, D_rank]``, scaled on the way."""
        scale = self.layout.grad_scale
        for p in self.layout.placements[rank]:
            if scale != 1.0:
                torch.mul(p.output_view(grad), scale, out=p.block_view(dst))
            else:
                p.block_view(dst).copy_(p.output_view(grad))

    def start_forward(self, x: torch.Tensor) -> Pending:
        if self.placed is not None:
            # Dropped here: the op lives as long as the output's autograd graph, which the output itself
            # holds -- a reference to it through ``placed.out`` would be a cycle Python cannot collect.
            placed, self.placed = self.placed, None
            self.grad_rows = placed.out_rows if placed.out_rows.placed else None
            return self._placed_forward(placed)
        shm = self.layout.transport(x.device, self.layout.forward_codec)
        if shm is not None:
            return self._shm_forward(shm, x.contiguous())
        lay, me = self.layout, self.layout.rank
        send, codec = x.contiguous(), lay.forward_codec
        b_me, d_me = self.batches[me], lay.dims[me]
        out_splits = [b_me * _wire_width(w, codec) for w in lay.dims]
        in_splits = [b * _wire_width(d_me, codec) for b in self.batches]
        if lay.skip_self:
            out_splits[me] = in_splits[me] = 0
        rows_before = sum(self.batches[:me])
        work, wire = None, send
        if codec is not None:  # the rows that leave this rank, encoded (its own rows never are)
            others = _others(send.view(-1), rows_before, b_me, d_me, lay.skip_self)
            wire = codec.encode(others.view(-1, d_me)) if others.numel() else send.new_empty(0, dtype=torch.uint8)
        recv = wire.new_empty(sum(out_splits))
        if lay.world_size > 1:
            source = wire.reshape(-1) if codec is not None else _others(send.view(-1), rows_before, b_me, d_me, lay.skip_self)
            work = dist.all_to_all_single(recv, source, out_splits, in_splits, group=lay.pg, async_op=True)

        def finish() -> torch.Tensor:
            blocks, offset = [], 0
            for r, width in enumerate(lay.dims):
                if r == me and lay.skip_self:  # never left this rank: the input itself
                    blocks.append(send[rows_before : rows_before + b_me])
                    continue
                wide = _wire_width(width, codec)
                block = recv[offset : offset + b_me * wide].view(b_me, wide)
                blocks.append(block if codec is None else codec.decode(block, width).to(send.dtype))
                offset += b_me * wide
            if lay.identity and len(blocks) == 1:
                return blocks[0]
            out = blocks[0].new_empty(b_me, lay.total_width)
            for r, block in enumerate(blocks):
                self._place(out, r, block)
            return out

        return Pending(work, finish, (send, wire, recv))

    def _shm_forward(self, shm: ShmTransport, send: torch.Tensor) -> Pending:
        """The forward through shared memory: each peer's rows into this rank's segment, then each
        peer's block for this rank straight into the output's columns."""
        lay, me = self.layout, self.layout.rank
        ex = shm.start([b * lay.dims[me] * send.element_size() for b in self.batches], self.check)
        for rows, block in self._peer_row_blocks(lambda s, n: ex.send_view(s, send.dtype, n)):
            block.copy_(send[rows])
        ex.publish()

        def finish() -> torch.Tensor:
            out = send.new_empty(self.batches[me], lay.total_width)
            for r, block in self._column_blocks(self._own_rows(send), lambda r, n: _recv(ex, r, send.dtype, n, lay, self.batches)):
                self._place(out, r, block)
            ex.finish()
            return out

        return Pending(None, finish, (send,))

    def _placed_forward(self, placed: PlacedExchange) -> Pending:
        """The forward of a prepared exchange: the lookup wrote the peers' rows and this rank's own
        columns already; publish, then place each peer's block for this rank."""
        ex, out, lay = placed.exchange, placed.out, self.layout
        ex.publish()

        def finish() -> torch.Tensor:
            for r, block in self._column_blocks(None, lambda r, n: _recv(ex, r, out.dtype, n, lay, self.batches)):
                self._place(out, r, block)
            ex.finish()
            return out

        return Pending(None, finish, ())

    def start_backward(self, grad: torch.Tensor) -> Pending:
        lay, me = self.layout, self.layout.rank
        b_me, d_me = self.batches[me], lay.dims[me]
        if grad.stride(-1) != 1:  # e.g. the stride-0 gradient of out.sum(): the views need unit column stride
            grad = grad.contiguous()
        shm = lay.transport(grad.device, lay.backward_codec)
        if shm is not None and self.grad_rows is not None:
            grad_rows, self.grad_rows = self.grad_rows, None
            return self._shm_backward_in_place(shm, grad, grad_rows)
        if shm is not None:
            return self._shm_backward(shm, grad)
        rows_before = sum(self.batches[:me])
        input_grad = grad.new_empty(sum(self.batches), d_me)
        send_splits = [b_me * w for w in lay.dims]
        if lay.skip_self:
            send_splits[me] = 0
        send = grad.new_empty(sum(send_splits))
        offset = 0
        for r, width in enumerate(lay.dims):
            if r == me and lay.skip_self:  # the own samples' gradient goes straight to the input's
                dst = input_grad[rows_before : rows_before + b_me]
            else:
                dst = send[offset : offset + b_me * width].view(b_me, width)
                offset += b_me * width
            self._pack(grad, r, dst)
        if lay.world_size <= 1:
            return Pending(None, lambda: input_grad, (send, input_grad))
        codec = lay.backward_codec
        if codec is None:
            recv_splits = [b * d_me for b in self.batches]
            if lay.skip_self:
                recv_splits[me] = 0
            work = dist.all_to_all_single(
                _others(input_grad.view(-1), rows_before, b_me, d_me, lay.skip_self), send, recv_splits,
                send_splits, group=lay.pg, async_op=True,
            )  # fmt: skip
            return Pending(work, lambda: input_grad, (send, input_grad))
        # Encoded: each destination's block of rows becomes bytes; received bytes are decoded into
        # the input gradient's rows of the other ranks' samples once they arrive.
        pieces, wire_splits, offset = [], [], 0
        for r, width in enumerate(lay.dims):
            if send_splits[r]:
                pieces.append(codec.encode(send[offset : offset + b_me * width].view(b_me, width)).reshape(-1))
            wire_splits.append(b_me * codec.wire_width(width) if send_splits[r] else 0)
            offset += send_splits[r]
        wire = torch.cat(pieces) if pieces else grad.new_empty(0, dtype=torch.uint8)
        wire_recv_splits = [b * codec.wire_width(d_me) if d_me else 0 for b in self.batches]
        if lay.skip_self:
            wire_recv_splits[me] = 0
        recv_wire = grad.new_empty(sum(wire_recv_splits), dtype=torch.uint8)
        work = dist.all_to_all_single(recv_wire, wire, wire_recv_splits, wire_splits, group=lay.pg, async_op=True)

        def decode() -> torch.Tensor:
            target = _others(input_grad.view(-1), rows_before, b_me, d_me, lay.skip_self)
            if target.numel():
                rows = target.numel() // d_me
                target.view(rows, d_me).copy_(codec.decode(recv_wire.view(rows, codec.wire_width(d_me)), d_me))
            return input_grad

        return Pending(work, decode, (wire, recv_wire, input_grad))

    def _shm_backward(self, shm: ShmTransport, grad: torch.Tensor) -> Pending:
        """The backward through shared memory: each peer's gradient columns packed straight into
        this rank's segment; each peer's rows for this rank copied into the input gradient."""
        lay, me = self.layout, self.layout.rank
        input_grad = grad.new_empty(sum(self.batches), lay.dims[me])
        ex = shm.start([self.batches[me] * w * grad.element_size() for w in lay.dims], self.check)
        for r, block in self._column_blocks(self._own_rows(input_grad), lambda r, n: ex.send_view(r, grad.dtype, n)):
            self._pack(grad, r, block)
        ex.publish()

        def finish() -> torch.Tensor:
            for rows, block in self._peer_row_blocks(lambda s, n: _recv(ex, s, grad.dtype, n, lay, self.batches)):
                input_grad[rows].copy_(block)
            ex.finish()
            return input_grad

        return Pending(None, finish, (input_grad,))

    def _shm_backward_in_place(self, shm: ShmTransport, grad: torch.Tensor, grad_rows: OutRows) -> Pending:
        """The backward through shared memory for a kernel that reads its gradient rows in place: each
        peer's gradient columns packed into this rank's segment and the own samples' into a
        ``[B_me, D_me]`` buffer; the kernel then reads those and each peer's chunk for this rank where
        they are (``grad_rows.give_grad``), and the chunks are released after it did. The input's
        gradient is a stand-in without values."""
        lay, me = self.layout, self.layout.rank
        own = grad.new_empty(self.batches[me], lay.dims[me])
        ex = shm.start([self.batches[me] * w * grad.element_size() for w in lay.dims], self.check)
        for r, block in self._column_blocks(own, lambda r, n: ex.send_view(r, grad.dtype, n)):
            self._pack(grad, r, block)
        ex.publish()

        def finish() -> torch.Tensor:
            parts = [(rows.start, block) for rows, block in self._peer_row_blocks(lambda s, n: _recv(ex, s, grad.dtype, n, lay, self.batches))]
            parts.append((self._row_starts()[me], own))
            grad_rows.give_grad(sorted(parts, key=lambda part: part[0]), ex.finish)
            return grad.new_zeros(()).expand(sum(self.batches), lay.dims[me])

        return Pending(None, finish, (own,))


class PooledEmbeddingsAwaitable(CollectiveAwaitable):
    """Lazy ``[B_local, sum(dim_sum_per_rank)]`` output of :class:`PooledEmbeddingsAllToAll`."""


class PooledEmbeddingsAllToAll:
    """Send pooled embeddings back to the ranks that own the samples (forward and backward).

    Args:
        pg: process group (None: the default group).
        dim_sum_per_rank: ``[W]`` total embedding width each rank contributes (0 for a rank that
            owns no feature); the same list on every rank.
        column_order: ``[sum dim_sum_per_rank]``: for each column of the rank blocks laid side by
            side, its column in the output (a permutation); None: the blocks in rank order.
        grad_scale: factor applied to the gradient sent back (``1 / world_size`` for the sharded
            collections' mean-of-losses semantics).
        defer_input_grad: deliver the input's gradient after the rest of the backward pass
            (see the module docstring); ``torch.autograd.grad`` cannot reach the input then.
        codecs: quantized communication of the forward / backward all-to-all
            (``lightrec.distributed.comm.qcomm``); rows that stay on this rank are never encoded.

    Call it with this rank's ``[B_total, dim_sum_per_rank[rank]]`` embeddings and, when ranks have
    different batch sizes, ``batch_size_per_rank`` (``[W]``, summing to ``B_total``). The result is a
    :class:`PooledEmbeddingsAwaitable` of ``[batch_size_per_rank[rank], sum(dim_sum_per_rank)]``;
    gradients flow back through the reverse all-to-all.
    """

    def __init__(
        self,
        pg: dist.ProcessGroup | None,
        dim_sum_per_rank: list[int],
        column_order: list[int] | None = None,
        grad_scale: float = 1.0,
        defer_input_grad: bool = False,
        codecs: QuantizedCommCodecs | None = None,
    ) -> None:
        self.pg = pg
        self.forward_codec = codecs.forward if codecs is not None else None
        self.backward_codec = codecs.backward if codecs is not None else None
        self.rank, self.world_size = group_rank_and_size(pg)
        self.dims = dims = per_rank_counts(dim_sum_per_rank, self.world_size, "dim_sum_per_rank", "widths")
        self.total_width = sum(dims)
        order = list(range(self.total_width)) if column_order is None else [int(c) for c in column_order]
        if sorted(order) != list(range(self.total_width)):
            raise ValueError(
                f"column_order must be a permutation of the {self.total_width} columns, got {column_order!r}"
            )
        self.identity = order == list(range(self.total_width))
        self.placements: list[list[Placement]] = rank_placements(dims, order)
        self.grad_scale = float(grad_scale)
        self.defer_input_grad = defer_input_grad
        # See the module docstring ("No self-transfer").
        self.skip_self = self.rank in (0, self.world_size - 1)

    @property
    def dim_sum_per_rank(self) -> list[int]:
        return list(self.dims)

    def transport(self, device: torch.device, codec: RowCodec | None) -> ShmTransport | None:
        """The shared-memory transport for an exchange of tensors on ``device``, or None for ``all_to_all_single``.

        Encoded exchanges (``codec``) keep to ``all_to_all_single``: the codecs trade CPU time for
        bytes on a link, and within one host the shared-memory copy is cheaper than the encoding.
        """
        if codec is not None or self.world_size == 1 or device.type != "cpu":
            return None
        return shm_transport(self.pg)

    def prepare(
        self, batch_size_per_rank: list[int], dtype: torch.dtype, device: torch.device
    ) -> PlacedExchange | None:
        """Start the forward exchange of a lookup not yet run, so that it writes its rows where they go
        (see the module docstring); None where that does not apply (then call as usual). The lookup's
        result must then be passed to ``__call__`` with ``placed=`` before this rank starts any other
        exchange of the group. Ranks may differ in whether they prepare: a prepared exchange puts the
        same bytes in the same chunks as a plain call, forward and backward.

        It applies on the shared-memory transport (CPU, no codec), where this rank owns columns and
        they form one block of the output.
        """
        me = self.rank
        d_me, own = self.dims[me], self.placements[me]
        if d_me == 0 or len(own) != 1 or own[0].count != 1:
            return None
        shm = self.transport(device, self.forward_codec)
        if shm is None:
            return None
        batches = per_rank_counts(batch_size_per_rank, self.world_size, "batch_size_per_rank", "batch sizes")
        ex = shm.start([b * d_me * dtype.itemsize for b in batches], _geometry_check(self.dims, batches))
        out = torch.empty(batches[me], self.total_width, dtype=dtype, device=device)
        blocks, start = [], 0
        for s, b in enumerate(batches):
            if s == me:
                blocks.append((start, out[:, own[0].out : own[0].out + d_me]))
            else:
                blocks.append((start, ex.send_view(s, dtype, b * d_me).view(b, d_me)))
            start += b
        return PlacedExchange(ex, out, OutRows(blocks), batches)

    def __call__(
        self,
        local_embs: torch.Tensor,
        batch_size_per_rank: list[int] | None = None,
        placed: PlacedExchange | None = None,
    ) -> PooledEmbeddingsAwaitable:
        """Start the all-to-all of ``local_embs`` ``[B_total, D_rank]``; see the class docstring. With
        ``placed`` (from :meth:`prepare`, for these batch sizes) the lookup that made ``local_embs``
        wrote its rows into ``placed.out_rows`` and only those are read."""
        d_me = self.dims[self.rank]
        if local_embs.dim() != 2 or local_embs.shape[1] != d_me:
            raise ValueError(
                f"local_embs must be [B_total, {d_me}] on rank {self.rank} "
                f"(dim_sum_per_rank={self.dims}), got shape {tuple(local_embs.shape)}"
            )
        batches = check_batch_sizes(
            batch_size_per_rank, local_embs.shape[0], self.world_size, "PooledEmbeddingsAllToAll"
        )
        if placed is not None and placed.batches != batches:
            raise ValueError(
                f"PooledEmbeddingsAllToAll: placed= was prepared for batch sizes {placed.batches}, "
                f"called with {batches}; prepare and call with the same batch_size_per_rank"
            )
        return PooledEmbeddingsAwaitable(_PooledAllToAllOp(self, batches, placed), local_embs, self.defer_input_grad)
