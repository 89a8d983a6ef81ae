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

Always: **no self-transfer.** A rank's own samples never go through the collective: the forward
reads them straight from the input and the backward packs their gradient straight into the input
gradient (half the bytes through gloo on 2 ranks). The collective takes each rank's chunks from one
contiguous range of its buffer, so this needs the other ranks' rows on one side of the own rows:
the first and the last rank skip themselves (every rank when ``W = 2``); middle ranks send to
themselves as a plain all-to-all would.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lightrec.distributed.comm._autograd import CollectiveAwaitable, Pending, group_rank_and_size
from lightrec.distributed.comm._placements import Placement, rank_placements

__all__ = ["PooledEmbeddingsAllToAll", "PooledEmbeddingsAwaitable", "check_batch_sizes"]


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
    sizes = [int(b) for b in batch_size_per_rank]
    if len(sizes) != world_size or any(b < 0 for b in sizes):
        raise ValueError(
            f"{what}: batch_size_per_rank must list {world_size} non-negative batch sizes (one per "
            f"rank), got {batch_size_per_rank!r}"
        )
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


class _PooledAllToAllOp:
    """One call's geometry: forward and adjoint all-to-all (see the module docstring)."""

    def __init__(self, layout: PooledEmbeddingsAllToAll, batches: list[int]) -> None:
        self.layout = layout
        self.batches = batches

    def start_forward(self, x: torch.Tensor) -> Pending:
        lay, me = self.layout, self.layout.rank
        send = x.contiguous()
        b_me, d_me = self.batches[me], lay.dims[me]
        out_splits = [b_me * w for w in lay.dims]
        in_splits = [b * d_me for b in self.batches]
        if lay.skip_self:
            out_splits[me] = in_splits[me] = 0
        recv = send.new_empty(sum(out_splits))
        rows_before = sum(self.batches[:me])
        work = None
        if lay.world_size > 1:
            work = dist.all_to_all_single(
                recv, _others(send.view(-1), rows_before, b_me, d_me, lay.skip_self), out_splits, in_splits,
                group=lay.pg, async_op=True,
            )  # fmt: skip

        def finish() -> torch.Tensor:
            blocks, offset = [], 0
            for r, width in enumerate(lay.dims):
                if r == me and lay.skip_self:  # never left this rank: the input itself
                    blocks.append(send[rows_before : rows_before + b_me])
                    continue
                blocks.append(recv[offset : offset + b_me * width].view(b_me, width))
                offset += b_me * width
            if lay.identity and len(blocks) == 1:
                return blocks[0]
            out = blocks[0].new_empty(b_me, lay.total_width)
            for block, placements in zip(blocks, lay.placements, strict=True):
                for p in placements:
                    p.output_view(out).copy_(p.block_view(block))
            return out

        return Pending(work, finish, (send, recv))

    def start_backward(self, grad: torch.Tensor) -> Pending:
        lay, me = self.layout, self.layout.rank
        b_me, d_me = self.batches[me], lay.dims[me]
        if grad.stride(-1) != 1:  # e.g. the stride-0 gradient of out.sum(): the views need unit column stride
            grad = grad.contiguous()
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
            # Gather rank r's columns out of the (possibly strided) gradient straight into their
            # buffer, scaled on the way.
            for p in lay.placements[r]:
                if lay.grad_scale != 1.0:
                    torch.mul(p.output_view(grad), lay.grad_scale, out=p.block_view(dst))
                else:
                    p.block_view(dst).copy_(p.output_view(grad))
        work = None
        if lay.world_size > 1:
            recv_splits = [b * d_me for b in self.batches]
            if lay.skip_self:
                recv_splits[me] = 0
            work = dist.all_to_all_single(
                _others(input_grad.view(-1), rows_before, b_me, d_me, lay.skip_self), send, recv_splits,
                send_splits, group=lay.pg, async_op=True,
            )  # fmt: skip
        return Pending(work, lambda: input_grad, (send, input_grad))


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
    ) -> None:
        self.pg = pg
        self.rank, self.world_size = group_rank_and_size(pg)
        dims = [int(d) for d in dim_sum_per_rank]
        if len(dims) != self.world_size or any(d < 0 for d in dims):
            raise ValueError(
                f"dim_sum_per_rank must list {self.world_size} non-negative widths (one per rank), "
                f"got {dim_sum_per_rank!r}"
            )
        self.dims = dims
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

    def __call__(
        self, local_embs: torch.Tensor, batch_size_per_rank: list[int] | None = None
    ) -> PooledEmbeddingsAwaitable:
        """Start the all-to-all of ``local_embs`` ``[B_total, D_rank]``; see the class docstring."""
        d_me = self.dims[self.rank]
        if local_embs.dim() != 2 or local_embs.shape[1] != d_me:
            raise ValueError(
                f"local_embs must be [B_total, {d_me}] on rank {self.rank} "
                f"(dim_sum_per_rank={self.dims}), got shape {tuple(local_embs.shape)}"
            )
        batches = check_batch_sizes(
            batch_size_per_rank, local_embs.shape[0], self.world_size, "PooledEmbeddingsAllToAll"
        )
        return PooledEmbeddingsAwaitable(_PooledAllToAllOp(self, batches), local_embs, self.defer_input_grad)
