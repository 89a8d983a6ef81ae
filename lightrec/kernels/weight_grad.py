"""The gradient of a pooled lookup with respect to its per-id weights.

A pooled lookup computes, for bag ``b`` of feature ``f`` (table ``t``)::

    out[b, cols_f] = sum_i w_i * E_t[id_i]            (MEAN: divided by the bag's length)

so ``d loss / d w_i = <grad_out[b, cols_f], E_t[id_i]>`` (over the bag's length for MEAN). The
batched kernels treat per-id weights as constants; when the weights require grad (they come from a
learned feature processor, e.g. position weights) :func:`with_weight_grad` puts a pass-through
node after the lookup whose backward computes this gradient. It runs *before* the lookup's own
backward, so it reads the rows as the forward used them, before a fused optimizer updates them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.autograd import Function

__all__ = ["with_weight_grad"]


@dataclass(frozen=True)
class _BagLayout:
    """What the backward needs besides the saved tensors (see :func:`with_weight_grad`'s arguments)."""

    batch: int
    tables: Callable[[], list[torch.Tensor]]
    feature_table_map: Sequence[int]
    mean: bool


class _WeightGradContext(Protocol):
    """What :class:`_WeightGrad`'s forward leaves on the autograd context for its backward."""

    saved_tensors: tuple[torch.Tensor, ...]  # (indices, offsets)
    layout: _BagLayout
    weights_dtype: torch.dtype

    def save_for_backward(self, *tensors: torch.Tensor) -> None: ...


class _WeightGrad(Function):
    @staticmethod
    def forward(
        ctx: _WeightGradContext, out: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
        layout: _BagLayout,
    ) -> torch.Tensor:  # fmt: skip
        ctx.save_for_backward(indices, offsets)
        ctx.layout = layout
        ctx.weights_dtype = weights.dtype
        return out.view_as(out)

    @staticmethod
    def backward(ctx: _WeightGradContext, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        indices, offsets = ctx.saved_tensors
        layout: _BagLayout = ctx.layout
        batch, tables = layout.batch, layout.tables()
        grad_w = torch.zeros(indices.numel(), dtype=ctx.weights_dtype, device=indices.device)
        bounds = offsets[::batch].tolist()  # one host read: where each feature's ids start
        col = 0
        for f, t in enumerate(layout.feature_table_map):
            dim = tables[t].shape[1]
            lo, hi = int(bounds[f]), int(bounds[f + 1])
            if hi > lo:
                lengths = offsets[f * batch + 1 : (f + 1) * batch + 1] - offsets[f * batch : (f + 1) * batch]
                bag = torch.repeat_interleave(torch.arange(batch, device=indices.device), lengths, output_size=hi - lo)
                rows = tables[t].index_select(0, indices[lo:hi].long()).to(grad_out.dtype)
                dot = (grad_out[:, col : col + dim].index_select(0, bag) * rows).sum(dim=1)
                if layout.mean:
                    dot = dot / lengths.clamp(min=1).to(dot.dtype).index_select(0, bag)
                grad_w[lo:hi] = dot.to(grad_w.dtype)
            col += dim
        return grad_out, grad_w, None, None, None


def with_weight_grad(
    out: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    batch: int,
    tables: Callable[[], list[torch.Tensor]],
    feature_table_map: Sequence[int],
    mean: bool,
) -> torch.Tensor:
    """``out`` ``[B, sum D]`` (features in order) with the gradient of ``weights`` ``[N]`` attached.

    Args:
        out: the pooled lookup's output.
        weights: the per-id weights the lookup used (they require grad).
        indices, offsets: the lookup's ids ``[N]`` and bag offsets ``[F * B + 1]`` (feature-major).
        batch: ``B``.
        tables: returns the ``[rows, D]`` views of the live tables (read in backward).
        feature_table_map: table of each feature.
        mean: MEAN pooling (the bag's length divides each id's contribution).
    """
    layout = _BagLayout(batch, tables, list(feature_table_map), mean)
    result: torch.Tensor = _WeightGrad.apply(out, weights, indices, offsets, layout)
    return result
