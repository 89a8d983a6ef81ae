"""Batch-dimension reduce-scatter and all-gather of pooled embeddings, differentiable and async.

Row-wise sharding splits a table's *rows* over ranks, so every rank computes a partial pooled sum
for every sample of the global batch; the output dist adds the partials and hands each rank its
own samples (reduce-scatter). Its adjoint is an all-gather: every rank's partial contributed to
every output row, so each rank's input gradient is the concatenation of all ranks' output
gradients. The all-gather (used by data-parallel style variants that need the global batch on
every rank) has the reduce-scatter as its adjoint::

    reduce-scatter                                         all-gather
    rank r in : [B_0 + ... + B_{W-1}, D]  partial sums      rank r in : [B_r, D]
    rank r out: [B_r, D] = sum over ranks of its rows       rank r out: [B_0 + ... + B_{W-1}, D]

Batch sizes ``B_r`` may differ between ranks (pass ``batch_size_per_rank``); see
``_primitives`` for how each backend is driven.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lightrec._compat import all_gather_single
from lightrec.distributed.comm._autograd import (
    CollectiveAwaitable,
    GroupCollective,
    Pending,
    group_rank_and_size,
)
from lightrec.distributed.comm._primitives import (
    BatchExchangeMismatchError,
    start_all_gather,
    start_reduce_scatter,
)
from lightrec.distributed.comm.pooled_all_to_all import check_batch_sizes
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs

__all__ = [
    "PooledEmbeddingsReduceScatter",
    "PooledEmbeddingsAllGather",
    "ReduceScatterAwaitable",
    "AllGatherAwaitable",
    "BatchExchangeMismatchError",
    "exchange_batch_sizes",
]


def exchange_batch_sizes(local_batch_size: int, pg: dist.ProcessGroup | None = None) -> list[int]:
    """Every rank's batch size (a small blocking all-gather); use when ranks do not know them."""
    _, world_size = group_rank_and_size(pg)
    mine = torch.tensor([int(local_batch_size)], dtype=torch.int64, device=_comm_device(pg))
    out = torch.empty(world_size, dtype=torch.int64, device=mine.device)
    all_gather_single(out, mine, group=pg)
    return [int(b) for b in out.tolist()]


def _comm_device(pg: dist.ProcessGroup | None) -> torch.device:
    # NCCL only moves CUDA tensors; gloo only CPU ones.
    if dist.get_backend(pg) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _ReduceScatterOp:
    def __init__(
        self, group: dist.ProcessGroup | None, rank: int, batches: list[int], codecs: QuantizedCommCodecs | None = None
    ) -> None:
        self.group, self.rank, self.batches = group, rank, batches
        self.codecs = codecs or QuantizedCommCodecs()

    def start_forward(self, x: torch.Tensor) -> Pending:
        return start_reduce_scatter(x, self.batches, self.rank, self.group, self.codecs.forward)

    def start_backward(self, grad: torch.Tensor) -> Pending:
        return start_all_gather(grad, self.batches, self.rank, self.group, self.codecs.backward)


class _AllGatherOp(_ReduceScatterOp):
    def start_forward(self, x: torch.Tensor) -> Pending:
        return start_all_gather(x, self.batches, self.rank, self.group, self.codecs.forward)

    def start_backward(self, grad: torch.Tensor) -> Pending:
        return start_reduce_scatter(grad, self.batches, self.rank, self.group, self.codecs.backward)


class ReduceScatterAwaitable(CollectiveAwaitable):
    """Lazy ``[B_local, *rest]`` result of :class:`PooledEmbeddingsReduceScatter`."""


class AllGatherAwaitable(CollectiveAwaitable):
    """Lazy ``[B_total, *rest]`` result of :class:`PooledEmbeddingsAllGather`."""


class PooledEmbeddingsReduceScatter(GroupCollective):
    """Sum partial pooled embeddings over ranks and keep this rank's samples.

    Args:
        pg: process group (None: the default group).
        codecs: quantized communication of the reduce-scatter and of its backward all-gather
            (``lightrec.distributed.comm.qcomm``); None sends float rows.

    Call with ``partial`` ``[B_total, *rest]`` (all ranks' samples in rank order) and, when ranks
    have different batch sizes, ``batch_size_per_rank``; returns a :class:`ReduceScatterAwaitable`
    of ``[batch_size_per_rank[rank], *rest]``. Backward all-gathers the gradient. Over shared memory,
    ranks that disagree about ``batch_size_per_rank`` or the rows' ``shape[1:]`` / dtype raise
    :class:`BatchExchangeMismatchError` (a ``ValueError``) in ``wait()``.
    """

    def __init__(self, pg: dist.ProcessGroup | None = None, codecs: QuantizedCommCodecs | None = None) -> None:
        super().__init__(pg)
        self._codecs = codecs

    def __call__(
        self, partial: torch.Tensor, batch_size_per_rank: list[int] | None = None
    ) -> ReduceScatterAwaitable:
        if partial.dim() < 1:
            raise ValueError(f"partial must be [B_total, ...], got a 0-d tensor {partial!r}")
        batches = check_batch_sizes(
            batch_size_per_rank, partial.shape[0], self._world_size, "PooledEmbeddingsReduceScatter"
        )
        return ReduceScatterAwaitable(_ReduceScatterOp(self._pg, self._rank, batches, self._codecs), partial)


class PooledEmbeddingsAllGather(GroupCollective):
    """Gather every rank's rows into the global batch (rank order) on every rank.

    Args:
        pg: process group (None: the default group).

    Call with ``local`` ``[B_local, *rest]`` and ``batch_size_per_rank`` (``[W]``); when it is None
    the batch sizes are exchanged first (one small blocking collective). Returns an
    :class:`AllGatherAwaitable` of ``[sum(batch_size_per_rank), *rest]``. Backward reduce-scatters the
    gradient (each rank's rows receive the sum of every rank's gradient for them). Over shared memory,
    ranks that disagree about ``batch_size_per_rank`` or the rows' ``shape[1:]`` / dtype raise
    :class:`BatchExchangeMismatchError` (a ``ValueError``) in ``wait()``.
    """

    def __call__(
        self, local: torch.Tensor, batch_size_per_rank: list[int] | None = None
    ) -> AllGatherAwaitable:
        if local.dim() < 1:
            raise ValueError(f"local must be [B_local, ...], got a 0-d tensor {local!r}")
        if batch_size_per_rank is None:
            batch_size_per_rank = exchange_batch_sizes(local.shape[0], self._pg)
        batches = check_batch_sizes(
            batch_size_per_rank,
            sum(int(b) for b in batch_size_per_rank),
            self._world_size,
            "PooledEmbeddingsAllGather",
        )
        if batches[self._rank] != local.shape[0]:
            raise ValueError(
                f"PooledEmbeddingsAllGather: batch_size_per_rank[{self._rank}]={batches[self._rank]} "
                f"but this rank's input has {local.shape[0]} rows ({tuple(local.shape)})"
            )
        return AllGatherAwaitable(_AllGatherOp(self._pg, self._rank, batches), local)
