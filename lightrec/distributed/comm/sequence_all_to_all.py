"""Sequence (unpooled) embedding all-to-all: the output dist of sharded ``EmbeddingCollection``s.

After :class:`~lightrec.distributed.comm.kjt_all_to_all.KJTAllToAll` a rank looks up one
embedding row per *id* it received, in the output KJT's key-major order. This collective sends
every row back to the rank whose input KJT held the id, where the rows arrive in exactly the
order of that input KJT's ``values()``::

    rank d (owner), after lookup: [N_out, D] rows, key-major [key][src][sample][id]
        1. undo the input dist's permute (``value_index``) -> source-major [src][key][sample][id]
        2. all-to-all: source s gets its ``values_per_rank[s]`` rows
    rank s (sample owner): [N_in, D], the rows of its input KJT's values in order
        (destination segments in key_splits order == the input KJT's key order)

Backward sends the row gradients the opposite way and re-applies the permute. Row-wise sharding
then restores the pre-bucketization order with ``rows[unbucketize_permute]`` (an ordinary,
differentiable index).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lightrec.distributed.comm._autograd import CollectiveAwaitable, Pending, group_rank_and_size
from lightrec.distributed.comm.kjt_all_to_all import KJTAllToAllTensorsAwaitable

__all__ = ["SequenceEmbeddingsAllToAll", "SequenceEmbeddingsAwaitable"]


class _SequenceAllToAllOp:
    def __init__(
        self,
        group: dist.ProcessGroup | None,
        rows_to_source: list[int],
        rows_from_owner: list[int],
        value_index: torch.Tensor | None,
    ) -> None:
        self.group = group
        self.rows_to_source = rows_to_source
        self.rows_from_owner = rows_from_owner
        self.value_index = value_index

    def start_forward(self, x: torch.Tensor) -> Pending:
        dim = x.shape[1]
        send = x.contiguous()
        if self.value_index is not None:
            # Output row j came from received position value_index[j]: scatter back.
            send = torch.empty_like(send).index_copy_(0, self.value_index, send)
        recv = send.new_empty((sum(self.rows_from_owner), dim))
        work = dist.all_to_all_single(
            recv.view(-1), send.view(-1), [n * dim for n in self.rows_from_owner],
            [n * dim for n in self.rows_to_source], group=self.group, async_op=True,
        )  # fmt: skip
        return Pending(work, lambda: recv, (send, recv))

    def start_backward(self, grad: torch.Tensor) -> Pending:
        grad = grad.contiguous()  # the send buffer must stay alive until the transfer is done (keep)
        dim = grad.shape[1]
        recv = grad.new_empty((sum(self.rows_to_source), dim))
        work = dist.all_to_all_single(
            recv.view(-1), grad.reshape(-1), [n * dim for n in self.rows_to_source],
            [n * dim for n in self.rows_from_owner], group=self.group, async_op=True,
        )  # fmt: skip
        index = self.value_index

        def finish() -> torch.Tensor:
            return recv if index is None else recv.index_select(0, index)

        return Pending(work, finish, (grad, recv))


class SequenceEmbeddingsAwaitable(CollectiveAwaitable):
    """Lazy ``[N_in, D]`` rows, in the order of this rank's input KJT values."""


class SequenceEmbeddingsAllToAll:
    """Return per-id embedding rows to the ranks that sent the ids (see the module docstring).

    Args:
        pg: process group (None: the default group).
    """

    def __init__(self, pg: dist.ProcessGroup | None = None) -> None:
        self._pg = pg
        self._rank, self._world_size = group_rank_and_size(pg)

    def __call__(
        self, local_embs: torch.Tensor, input_dist: KJTAllToAllTensorsAwaitable
    ) -> SequenceEmbeddingsAwaitable:
        """Start sending ``local_embs`` (``[N_out, D]``, one row per value of the KJT that
        ``input_dist`` produced, in its order) back; ``input_dist`` must have been waited."""
        if not input_dist.is_resolved:
            raise ValueError(
                "SequenceEmbeddingsAllToAll needs the input dist's KJT to have arrived: call "
                "input_dist.wait() before sending its embeddings back"
            )
        expected = sum(input_dist.values_per_rank)
        if local_embs.dim() != 2 or local_embs.shape[0] != expected:
            raise ValueError(
                f"local_embs must be [{expected}, D] (one row per id received by the input dist on "
                f"rank {self._rank}), got shape {tuple(local_embs.shape)}"
            )
        op = _SequenceAllToAllOp(
            self._pg, input_dist.values_per_rank, input_dist.values_sent_per_rank, input_dist.value_index
        )
        return SequenceEmbeddingsAwaitable(op, local_embs)
