"""Jagged kernels used by the sparse types: fbgemm ops when importable, plain torch otherwise.

The implementation is chosen once, at import time, by defining the function one way or the other.
That keeps every call site free of branches, keeps ``torch.jit.script`` happy (a scripted function
may not even mention ``torch.ops.fbgemm.*`` when fbgemm is absent, since TorchScript resolves every
op at compile time), and keeps ``torch.compile`` graphs free of Python-side dispatch.

Both implementations produce identical results; ``tests/sparse`` checks each against the other.
"""

from typing import Optional, Tuple

import torch

from lightrec._fbgemm import has_fbgemm_op

__all__ = [
    "complete_cumsum",
    "permute_2d_sparse",
    "segment_ids",
    "USING_FBGEMM",
]

USING_FBGEMM: bool = has_fbgemm_op("permute_2D_sparse_data") and has_fbgemm_op("asynchronous_complete_cumsum")


def _permute_2d_sparse_torch(
    permute: torch.Tensor,
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: Optional[torch.Tensor],
    total: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Reorder whole key segments of a jagged batch (pure torch; see ``permute_2d_sparse``)."""
    key_lengths = lengths.sum(dim=1)
    key_starts = torch.cumsum(key_lengths, 0) - key_lengths
    out_lengths_2d = lengths.index_select(0, permute)
    seg_lengths = key_lengths.index_select(0, permute)
    seg_starts = key_starts.index_select(0, permute)
    out_starts = torch.cumsum(seg_lengths, 0) - seg_lengths
    if total is None:  # one device read; callers that know the sizes on the host pass them
        total = int(seg_lengths.sum().item()) if seg_lengths.numel() > 0 else 0
    # Each output position i of segment s reads input position seg_starts[s] + (i - out_starts[s]).
    shift = torch.repeat_interleave(seg_starts - out_starts, seg_lengths, output_size=total)
    index = torch.arange(total, device=values.device, dtype=shift.dtype) + shift
    out_values = values.index_select(0, index)
    out_weights: Optional[torch.Tensor] = None
    if weights is not None:
        out_weights = weights.index_select(0, index)
    return out_lengths_2d, out_values, out_weights


def _fbgemm_weights_dtype(dtype: torch.dtype) -> bool:
    """Whether fbgemm's ``permute_2D_sparse_data`` permutes weights of ``dtype`` (float16/32/64)."""
    return dtype == torch.float32 or dtype == torch.float16 or dtype == torch.float64


if USING_FBGEMM:

    def complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
        """Offsets ``[0, l0, l0+l1, ...]`` (``len(lengths) + 1`` entries) of 1-D ``lengths``."""
        offsets: torch.Tensor = torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)
        return offsets

    def permute_2d_sparse(
        permute: torch.Tensor,
        lengths: torch.Tensor,
        values: torch.Tensor,
        weights: Optional[torch.Tensor],
        total: Optional[int] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Reorder the key segments of a jagged batch.

        Args:
            permute: ``[K_out]`` int index of the input key placed at each output position
                (keys may repeat or be dropped).
            lengths: ``[K_in, B]`` lengths, key-major.
            values / weights: ``[sum(lengths)]`` values (and optional per-value weights).
            total: number of output values when the caller knows it on the host; without it the
                output size is read from the device (a host sync on CUDA).

        Returns:
            ``(lengths [K_out, B], values, weights)`` in the permuted key order.
        """
        if weights is not None and not _fbgemm_weights_dtype(weights.dtype):
            # bfloat16 (or integer) weights: fbgemm's CPU kernel has no such instance
            return _permute_2d_sparse_torch(permute, lengths, values, weights, total)
        # fbgemm's kernel takes the permutation as int32.
        out_lengths, out_values, out_weights = torch.ops.fbgemm.permute_2D_sparse_data(
            permute.to(torch.int32), lengths, values, weights, total
        )
        return out_lengths, out_values, out_weights

else:

    def complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
        """Offsets ``[0, l0, l0+l1, ...]`` (``len(lengths) + 1`` entries) of 1-D ``lengths``."""
        # pad (not cat with torch.zeros) keeps this traceable by torch.fx with proxy inputs.
        return torch.nn.functional.pad(torch.cumsum(lengths, 0).to(lengths.dtype), [1, 0])

    def permute_2d_sparse(
        permute: torch.Tensor,
        lengths: torch.Tensor,
        values: torch.Tensor,
        weights: Optional[torch.Tensor],
        total: Optional[int] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Reorder the key segments of a jagged batch (see the fbgemm variant for the layout)."""
        return _permute_2d_sparse_torch(permute, lengths, values, weights, total)


def segment_ids(lengths: torch.Tensor, total: int) -> torch.Tensor:
    """``[total]`` index of the segment (bag) that each value belongs to, for 1-D ``lengths``."""
    return torch.repeat_interleave(
        torch.arange(lengths.numel(), device=lengths.device), lengths.long(), output_size=total
    )
