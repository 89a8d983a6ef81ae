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

from lightrec.distributed.comm._autograd import CollectiveAwaitable, GroupCollective, Pending
from lightrec.distributed.comm.kjt_all_to_all import KJTAllToAllTensorsAwaitable
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs, RowCodec

__all__ = ["SequenceEmbeddingsAllToAll", "SequenceEmbeddingsAwaitable"]


def _rows_all_to_all(
    send: torch.Tensor,
    rows_in: list[int],
    rows_out: list[int],
    group: dist.ProcessGroup | None,
    codec: RowCodec | None,
    index: torch.Tensor | None,
) -> Pending:
    """All-to-all of ``[N, D]`` rows (``rows_out[r]`` to rank r, ``rows_in[r]`` from it), encoded by
    ``codec`` on the wire; the received rows are gathered by ``index`` when given."""
    dim = send.shape[1]
    wire = send if codec is None else codec.encode(send)
    width = wire.shape[1]
    recv = wire.new_empty((sum(rows_in), width))
    work = dist.all_to_all_single(
        recv.view(-1), wire.reshape(-1), [n * width for n in rows_in], [n * width for n in rows_out], group=group,
        async_op=True,
    )  # fmt: skip

    def finish() -> torch.Tensor:
        rows = recv if codec is None else codec.decode(recv, dim).to(send.dtype)
        return rows if index is None else rows.index_select(0, index)

    return Pending(work, finish, (wire, recv))


class _SequenceAllToAllOp:
    def __init__(
        self,
        group: dist.ProcessGroup | None,
        rows_to_source: list[int],
        rows_from_owner: list[int],
        value_index: torch.Tensor | None,
        codecs: QuantizedCommCodecs | None = None,
    ) -> None:
        self.codecs = codecs or QuantizedCommCodecs()
        self.group = group
        self.rows_to_source = rows_to_source
        self.rows_from_owner = rows_from_owner
        self.value_index = value_index

    def start_forward(self, x: torch.Tensor) -> Pending:
        send = x.contiguous()
        if self.value_index is not None:
            # Output row j came from received position value_index[j]: scatter back.
            send = torch.empty_like(send).index_copy_(0, self.value_index, send)
        return _rows_all_to_all(send, self.rows_from_owner, self.rows_to_source, self.group, self.codecs.forward, None)

    def start_backward(self, grad: torch.Tensor) -> Pending:
        return _rows_all_to_all(
            grad.contiguous(), self.rows_to_source, self.rows_from_owner, self.group, self.codecs.backward, self.value_index
        )


class SequenceEmbeddingsAwaitable(CollectiveAwaitable):
    """Lazy ``[N_in, D]`` rows, in the order of this rank's input KJT values."""


class SequenceEmbeddingsAllToAll(GroupCollective):
    """Return per-id embedding rows to the ranks that sent the ids (see the module docstring).

    Args:
        pg: process group (None: the default group).
        codecs: quantized communication of the rows, forward and backward (``comm.qcomm``).
    """

    def __init__(self, pg: dist.ProcessGroup | None = None, codecs: QuantizedCommCodecs | None = None) -> None:
        super().__init__(pg)
        self._codecs = codecs

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
            self._pg, input_dist.values_per_rank, input_dist.values_sent_per_rank, input_dist.value_index, self._codecs
        )
        return SequenceEmbeddingsAwaitable(op, local_embs)
