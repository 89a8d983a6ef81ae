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
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lightrec.distributed.comm._autograd import (
    CollectiveAwaitable,
    Pending,
    group_rank_and_size,
)

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


class _PooledAllToAllOp:
    """One call's geometry; forward and adjoint all-to-all (see the module docstring)."""

    def __init__(
        self, group: dist.ProcessGroup | None, rank: int, dims: list[int], batches: list[int]
    ) -> None:
        self.group = group
        self.rank = rank
        self.dims = dims
        self.batches = batches

    def start_forward(self, x: torch.Tensor) -> Pending:
        d_me, b_me = self.dims[self.rank], self.batches[self.rank]
        send = x.contiguous()
        # Rows for rank s are a contiguous slab of the row-major input: no packing copy needed.
        in_splits = [b * d_me for b in self.batches]
        out_splits = [b_me * d for d in self.dims]
        recv = send.new_empty(sum(out_splits))
        work = dist.all_to_all_single(
            recv, send.view(-1), out_splits, in_splits, group=self.group, async_op=True
        )

        def finish() -> torch.Tensor:
            blocks = [blk.view(b_me, d) for blk, d in zip(recv.split(out_splits), self.dims, strict=True)]
            return torch.cat(blocks, dim=1)

        return Pending(work, finish, (send, recv))

    def start_backward(self, grad: torch.Tensor) -> Pending:
        d_me, b_me = self.dims[self.rank], self.batches[self.rank]
        # Column block r of this rank's gradient goes back to rank r (packed contiguously).
        send = torch.cat([g.reshape(-1) for g in grad.split(self.dims, dim=1)])
        in_splits = [b_me * d for d in self.dims]
        out_splits = [b * d_me for b in self.batches]
        recv = grad.new_empty(sum(out_splits))
        work = dist.all_to_all_single(recv, send, out_splits, in_splits, group=self.group, async_op=True)
        total = sum(self.batches)
        return Pending(work, lambda: recv.view(total, d_me), (send, recv))


class PooledEmbeddingsAwaitable(CollectiveAwaitable):
    """Lazy ``[B_local, sum(dim_sum_per_rank)]`` output of :class:`PooledEmbeddingsAllToAll`."""


class PooledEmbeddingsAllToAll:
    """Send pooled embeddings back to the ranks that own the samples (forward and backward).

    Args:
        pg: process group (None: the default group).
        dim_sum_per_rank: ``[W]`` total embedding width each rank contributes (0 for a rank that
            owns no feature); the same list on every rank.

    Call it with this rank's ``[B_total, dim_sum_per_rank[rank]]`` embeddings and, when ranks have
    different batch sizes, ``batch_size_per_rank`` (``[W]``, summing to ``B_total``). The result is a
    :class:`PooledEmbeddingsAwaitable` of ``[batch_size_per_rank[rank], sum(dim_sum_per_rank)]``;
    gradients flow back through the reverse all-to-all.
    """

    def __init__(self, pg: dist.ProcessGroup | None, dim_sum_per_rank: list[int]) -> None:
        self._pg = pg
        self._rank, self._world_size = group_rank_and_size(pg)
        dims = [int(d) for d in dim_sum_per_rank]
        if len(dims) != self._world_size or any(d < 0 for d in dims):
            raise ValueError(
                f"dim_sum_per_rank must list {self._world_size} non-negative widths (one per rank), "
                f"got {dim_sum_per_rank!r}"
            )
        self._dims = dims

    @property
    def dim_sum_per_rank(self) -> list[int]:
        return list(self._dims)

    def __call__(
        self, local_embs: torch.Tensor, batch_size_per_rank: list[int] | None = None
    ) -> PooledEmbeddingsAwaitable:
        """Start the all-to-all of ``local_embs`` ``[B_total, D_rank]``; see the class docstring."""
        d_me = self._dims[self._rank]
        if local_embs.dim() != 2 or local_embs.shape[1] != d_me:
            raise ValueError(
                f"local_embs must be [B_total, {d_me}] on rank {self._rank} "
                f"(dim_sum_per_rank={self._dims}), got shape {tuple(local_embs.shape)}"
            )
        batches = check_batch_sizes(
            batch_size_per_rank, local_embs.shape[0], self._world_size, "PooledEmbeddingsAllToAll"
        )
        op = _PooledAllToAllOp(self._pg, self._rank, self._dims, batches)
        return PooledEmbeddingsAwaitable(op, local_embs)
