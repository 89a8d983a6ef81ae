"""Quantized lookups on the Triton kernel, as the custom op ``lightrec::triton_quant_pooled_lookup``.

One launch pools every feature of a run of tables (like fbgemm's IntN TBE op), reading the
collection's flat byte buffer (:mod:`lightrec.quant.table_groups`). The op is a registered
custom op, so ``torch.fx`` records one call, ``torch.jit.script`` compiles the caller (the op is
resolved when the artifact runs, after ``import lightrec.inference``) and ``torch.export`` keeps it
as one node with a shape-only fake. The kernel module (and ``triton``) is imported when the op
first runs, never at ``import lightrec``.

Unpooled (sequence) lookups reuse the same kernel: every id is its own bag of one, and pooling one
id decodes exactly its row (``fma(scale, q, bias)``, the sequence kernels' numerics).
"""

import contextlib
from typing import List, Optional

import torch

from lightrec._triton import triton_device_reason

__all__ = ["TritonSequenceKernel", "alignment_hint", "feature_meta", "triton_quant_pooled_lookup",
           "triton_sequence_lookup"]

_META_COLUMNS = 6  # byte offset of the table, row bytes, type code, dim, output column, rows


def feature_meta(byte_offsets: List[int], row_bytes: List[int], types: List[int], dims: List[int],
                 rows: List[int], device: Optional[torch.device] = None) -> torch.Tensor:
    """``[F, 6]`` int64 per-feature table description the kernel reads (output columns cumulated)."""
    out: List[List[int]] = []
    col = 0
    for f in range(len(dims)):
        out.append([byte_offsets[f], row_bytes[f], types[f], dims[f], col, rows[f]])
        col += dims[f]
    return torch.tensor(out, dtype=torch.int64, device=device).reshape(-1, _META_COLUMNS)


def alignment_hint(n: int, cap: int) -> int:
    """The largest power of two ``<= cap`` dividing ``n`` (the kernel's alignment hints)."""
    hint = 1
    while hint < cap and n % (hint * 2) == 0:
        hint *= 2
    return hint


@torch.library.custom_op("lightrec::triton_quant_pooled_lookup", mutates_args=())
def triton_quant_pooled_lookup(
    flat: torch.Tensor,
    meta: torch.Tensor,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    total_d: int,
    max_d: int,
    vec: int,
    row_align: int,
    mean: bool,
) -> torch.Tensor:
    """``[B, total_d]`` float32: pooled rows of the ``F = meta.shape[0]`` features (key-major ids).

    Args:
        flat: every table's rows back to back, ``[bytes]`` uint8 (an even number of bytes unless
            ``row_align`` is 1).
        meta: :func:`feature_meta` of the features, on ``flat``'s device.
        ids / offsets: the features' ids (key-major) and ``[F * B + 1]`` bag boundaries.
        per_sample_weights: ``[N]`` or None.
        total_d / max_d: output width and widest feature.
        vec / row_align: a power of two dividing every dim, and one (at most 16) dividing every row's
            byte offset: alignment hints that let the kernel read and write wider words (with
            ``row_align`` 1, an odd ``row_alignment``, the fp16 scales, biases and rows are read
            bytewise).
        mean: MEAN pooling (else SUM).
    """
    from lightrec.quant.triton_quant_kernel import quant_pooled_kernel

    reason = triton_device_reason(flat.device)
    if reason is not None:
        raise RuntimeError(
            f"this quantized collection (kernel='triton') has its tables on {flat.device}: {reason}. Move it "
            "to a GPU (module.to('cuda')) or quantize with kernel_backend='torch'"
        )
    num_features = meta.shape[0]
    batch = (offsets.numel() - 1) // num_features
    out = torch.empty(batch, total_d, dtype=torch.float32, device=flat.device)
    if batch == 0:
        return out
    block_d = 1 << max(0, (max_d - 1).bit_length())
    # Small tiles: the three row formats share one program, and [4, 128] keeps it in ~72 registers
    # (sm_90, benchmarks/triton_kernel_report.py); larger tiles spill.
    block_b = max(1, min(4, 512 // block_d))
    grid = (-(-batch // block_b), num_features)
    with torch.cuda.device(flat.device) if flat.device.type == "cuda" else contextlib.nullcontext():
        quant_pooled_kernel[grid](
            flat, flat.view(torch.float16) if row_align % 2 == 0 else flat, meta, ids, offsets,
            per_sample_weights if per_sample_weights is not None else flat, out,
            batch, ids.numel(), out.stride(0),
            BLOCK_B=block_b, BLOCK_D=block_d, MEAN=mean, HAS_WEIGHTS=per_sample_weights is not None,
            VEC=vec, ROW_ALIGN=row_align, num_warps=4 if block_b * block_d >= 512 else 2,
        )  # fmt: skip
    return out


@triton_quant_pooled_lookup.register_fake
def _(flat, meta, ids, offsets, per_sample_weights, total_d, max_d, vec, row_align, mean):  # noqa: ANN001, ANN202
    batch = (offsets.shape[0] - 1) // meta.shape[0]
    return flat.new_empty((batch, total_d), dtype=torch.float32)


def triton_sequence_lookup(weight: torch.Tensor, data_type: int, dim: int, ids: torch.Tensor) -> torch.Tensor:
    """Decoded rows ``[N, dim]`` float32 of one stored table ``weight [rows, row_bytes]`` uint8."""
    rows, row_bytes = weight.shape[0], weight.shape[1]
    meta = torch.tensor([[0, row_bytes, data_type, dim, 0, rows]], dtype=torch.int64, device=weight.device)
    offsets = torch.arange(ids.numel() + 1, dtype=torch.int64, device=ids.device)
    return torch.ops.lightrec.triton_quant_pooled_lookup(weight.reshape(-1), meta, ids, offsets, None, dim, dim,
                                                         alignment_hint(dim, 4), alignment_hint(row_bytes, 16), False)


torch.fx.wrap("triton_sequence_lookup")


class TritonSequenceKernel(torch.nn.Module):
    """Unpooled quantized lookup on the Triton kernel (same results as ``TorchSequenceKernel``)."""

    def forward(self, weight: torch.Tensor, data_type: int, dim: int, ids: torch.Tensor) -> torch.Tensor:
        return triton_sequence_lookup(weight, data_type, dim, ids)
