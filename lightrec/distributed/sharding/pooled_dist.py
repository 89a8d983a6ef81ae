"""Pooled-embedding all-to-all fused with the output permutation, the gradient scale and a
deferred backward wait: the output dist of table-wise and column-wise sharding.

Semantics are those of ``lightrec.distributed.comm.PooledEmbeddingsAllToAll`` (rank ``r`` sends
``[B_s, D_r]`` of its ``[sum B, D_r]`` lookup result to every rank ``s``), plus three things the
hot path of a sharded DLRM needs and a generic collective cannot know:

* **Permutation on receipt.** The received blocks are written straight into the collection's
  feature order (one strided copy per source rank) instead of being concatenated and then
  permuted -- planners interleave tables over ranks, so the permutation is the common case.
* **Gradient scale while packing.** The backward gathers each destination's columns out of the
  output gradient into the send buffer and scales them by ``1 / world_size`` in the same place
  (docs/sharding.md: gradients are those of the mean of the per-rank losses).
* **Deferred wait.** The backward all-to-all is started as soon as the output gradient exists,
  and waited for in an autograd *final callback*, after the rest of the backward pass (the dense
  layers) has run; the callback then runs the lookup's backward (the fused optimizer update).
  Without this the autograd engine -- which runs the most recently created ready node first --
  would block on the transfer before doing any dense backward work.

Layout: the column permutation is precomputed as runs of consecutive columns, so receiving is one
``torch.cat`` of strided pieces and packing the gradient one ``torch.cat(..., out=send buffer)``
per destination rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Function

from lightrec.distributed.comm import LazyAwaitable

__all__ = ["FusedPooledAllToAll"]


class _Call:
    """Per-forward state shared by the two autograd nodes."""

    __slots__ = ("dist", "batches", "work", "recv", "send", "lookup_out", "grad_work", "grad_recv")

    def __init__(self, dist_: FusedPooledAllToAll, batches: list[int]) -> None:
        self.dist = dist_
        self.batches = batches
        self.work: Any = None
        self.recv: torch.Tensor | None = None
        self.send: torch.Tensor | None = None
        self.lookup_out: torch.Tensor | None = None
        self.grad_work: Any = None
        self.grad_recv: torch.Tensor | None = None


class _Launch(Function):
    """Starts the forward all-to-all. Its autograd input is a zero-size *anchor*, not the lookup
    output: were the lookup output an input, the engine would still run the lookup's backward
    node (with an undefined gradient) in the main pass and free its saved tensors."""

    @staticmethod
    def forward(ctx: Any, call: _Call, anchor: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        d = call.dist
        send = x.contiguous()
        b_me = call.batches[d.rank]
        recv = send.new_empty(b_me * d.total_width)
        call.work = dist.all_to_all_single(
            recv, send.view(-1), [b_me * w for w in d.dims], [b * d.dims[d.rank] for b in call.batches],
            group=d.pg, async_op=True,
        )  # fmt: skip
        call.send, call.recv = send, recv
        ctx.call = call
        return x.new_empty(0)

    @staticmethod
    def backward(ctx: Any, _token: torch.Tensor) -> tuple[None, None, None]:  # type: ignore[override]
        call: _Call = ctx.call
        lookup_out = call.lookup_out
        if lookup_out is None:
            return None, None, None

        def finish() -> None:
            call.grad_work.wait()
            d = call.dist
            grad = call.grad_recv.view(sum(call.batches), d.dims[d.rank])  # type: ignore[union-attr]
            call.grad_work = call.grad_recv = call.lookup_out = None
            torch.autograd.backward(lookup_out, grad)

        # Runs after every other backward node of this pass (the dense layers' included).
        torch.autograd.Variable._execution_engine.queue_callback(finish)
        return None, None, None


class _Wait(Function):
    @staticmethod
    def forward(ctx: Any, call: _Call, token: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        d = call.dist
        call.work.wait()
        b_me = call.batches[d.rank]
        recv = call.recv
        call.work = call.recv = call.send = None
        blocks, offset = [], 0
        for width in d.dims:
            blocks.append(recv[offset : offset + b_me * width].view(b_me, width))  # type: ignore[index]
            offset += b_me * width
        ctx.call = call
        if d.out_pieces is None:
            return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)
        # One pass: the pieces of the rank blocks, concatenated in output column order.
        return torch.cat([blocks[r][:, lo : lo + w] for r, lo, w in d.out_pieces], dim=1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:  # type: ignore[override]
        call: _Call = ctx.call
        d = call.dist
        b_me = call.batches[d.rank]
        send = grad.new_empty(b_me * d.total_width)
        offset = 0
        for r, width in enumerate(d.dims):
            if width:
                dst = send[offset : offset + b_me * width].view(b_me, width)
                # Gather rank r's columns out of the (possibly strided) gradient straight into
                # the send buffer, then scale them there (1 / world_size).
                torch.cat([grad[:, lo : lo + w] for lo, w in d.send_pieces[r]], dim=1, out=dst)
                if d.grad_scale != 1.0:
                    dst.mul_(d.grad_scale)
            offset += b_me * width
        recv = grad.new_empty(sum(call.batches) * d.dims[d.rank])
        call.grad_work = dist.all_to_all_single(
            recv, send, [b * d.dims[d.rank] for b in call.batches], [b_me * w for w in d.dims],
            group=d.pg, async_op=True,
        )  # fmt: skip
        call.grad_recv = recv
        return None, grad.new_empty(0)


class FusedPooledAllToAllAwaitable(LazyAwaitable[torch.Tensor]):
    """Lazy ``[B_local, total width]`` output (feature order) of :class:`FusedPooledAllToAll`."""

    def __init__(self, call: _Call, x: torch.Tensor) -> None:
        super().__init__()
        self._call = call
        differentiable = x.requires_grad and torch.is_grad_enabled()
        anchor = torch.empty(0, device=x.device, requires_grad=differentiable)
        # x goes in detached; its graph is reached by the deferred backward only.
        self._token = _Launch.apply(call, anchor, x.detach())
        call.lookup_out = x if differentiable else None

    def _wait_impl(self) -> torch.Tensor:
        out = _Wait.apply(self._call, self._token)
        self._token = None
        return out


class FusedPooledAllToAll:
    """Pooled all-to-all whose output is already in the final column order (module docstring).

    Args:
        pg: process group.
        dims: ``[W]`` width each rank sends (its ``[sum B, D_r]`` lookup result).
        column_order: ``[sum dims]`` for each column of the concatenated rank blocks, its column in
            the output (a permutation), or None for the plain concatenation.
        grad_scale: factor applied to the gradient sent back (``1 / world_size``).
    """

    def __init__(
        self, pg: dist.ProcessGroup | None, dims: list[int], column_order: list[int] | None, grad_scale: float
    ) -> None:
        self.pg = pg
        self.rank = dist.get_rank(pg)
        self.dims = [int(d) for d in dims]
        self.total_width = sum(self.dims)
        self.grad_scale = float(grad_scale)
        order = column_order if column_order is not None else list(range(self.total_width))
        # Runs of consecutive columns: (rank, column in the rank's block, output column, width).
        runs: list[list[int]] = []
        first = 0
        for r, width in enumerate(self.dims):
            for c in range(first, first + width):
                prev = runs[-1] if runs else None
                if prev is not None and prev[0] == r and prev[2] + prev[3] == order[c]:
                    prev[3] += 1
                else:
                    runs.append([r, c - first, order[c], 1])
            first += width
        identity = order == list(range(self.total_width))
        by_output = sorted(runs, key=lambda run: run[2])
        self.out_pieces: list[tuple[int, int, int]] | None = (
            None if identity else [(r, lo, w) for r, lo, _, w in by_output]
        )
        self.send_pieces: list[list[tuple[int, int]]] = [
            [(out, w) for rr, _, out, w in runs if rr == r] for r in range(len(self.dims))
        ]

    def __call__(self, local: torch.Tensor, batch_size_per_rank: list[int]) -> FusedPooledAllToAllAwaitable:
        if local.dim() != 2 or local.shape[1] != self.dims[self.rank]:
            raise ValueError(
                f"local embeddings must be [sum B, {self.dims[self.rank]}] on rank {self.rank}, got {tuple(local.shape)}"
            )
        if sum(batch_size_per_rank) != local.shape[0]:
            raise ValueError(
                f"batch_size_per_rank={batch_size_per_rank} does not sum to {local.shape[0]} rows"
            )
        return FusedPooledAllToAllAwaitable(_Call(self, list(batch_size_per_rank)), local)
