"""Triton kernel: dequantize-and-pool of int8 / int4 / fp16 rows for a run of tables, one launch.

Imported only when a Triton lookup runs (see :mod:`lightrec.quant.triton_lookup`). Layouts::

    flat     [bytes] uint8      every table back to back, rows in fbgemm's layout (quant_rows)
    flat16   [bytes / 2] fp16   the same buffer read two bytes at a time (scales, biases, fp16 rows);
                                with an odd row alignment ``flat`` itself, read bytewise
    meta     [F, 6] int64       per feature: byte offset of its table, row bytes, type code
                                (1 fp16, 2 int8, 3 int4), dim, first output column, rows
    ids      [N], offsets [F * B + 1], per_sample_weights [N] | None
    out      [B, total_D] float32

Program ``(i, f)`` pools bags ``f*B + i*BLOCK_B ...`` of feature ``f`` as a ``[BLOCK_B, BLOCK_D]``
tile. Numerics are those of :mod:`lightrec.quant.pooled_kernels` (fbgemm's CPU kernel): per id in bag
order ``acc = fma(s, q, acc + b)`` with fp16 scale/bias widened to fp32 (times the id's weight when
weighted); fp16 rows ``acc = fma(w, x, acc)`` (``acc + x`` unweighted); MEAN multiplies by
``fp32(1 / len)``. Ids outside their table read nothing (the collections check ids before).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["quant_pooled_kernel"]


@triton.jit
def _load_fp16(flat_ptr, flat16_ptr, byte_offset, mask, ROW_ALIGN: tl.constexpr):
    """fp16 values at ``byte_offset`` (any shape), widened to fp32.

    Even offsets (``ROW_ALIGN >= 2``) read two bytes at a time through ``flat16``; an odd
    ``row_alignment`` can put a row at an odd byte, so then the two bytes are read one by one and
    joined (little-endian, as the rows are stored)."""
    if ROW_ALIGN % 2 == 0:
        return tl.load(flat16_ptr + byte_offset // 2, mask=mask, other=0.0).to(tl.float32)
    else:
        lo = tl.load(flat_ptr + byte_offset, mask=mask, other=0).to(tl.uint16)
        hi = tl.load(flat_ptr + byte_offset + 1, mask=mask, other=0).to(tl.uint16)
        return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit(do_not_specialize=["batch", "num_ids"])
def quant_pooled_kernel(
    flat_ptr,
    flat16_ptr,
    meta_ptr,
    ids_ptr,
    offsets_ptr,
    psw_ptr,
    out_ptr,
    batch,
    num_ids,
    out_stride,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MEAN: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    VEC: tl.constexpr,
    ROW_ALIGN: tl.constexpr,
):
    """``VEC`` divides every dim (so output columns are VEC-aligned); rows start at multiples of
    ``ROW_ALIGN`` bytes (the largest power of two, at most 16, dividing every table offset and row
    size: 1 when ``row_alignment`` is odd, and then fp16 values are read bytewise)."""
    f = tl.program_id(1)
    b = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    in_batch = b < batch
    bag = f.to(tl.int64) * batch + b
    start = tl.load(offsets_ptr + bag, mask=in_batch, other=0).to(tl.int64)
    end = tl.load(offsets_ptr + bag + 1, mask=in_batch, other=0).to(tl.int64)
    start = tl.minimum(tl.maximum(start, 0), num_ids)
    end = tl.minimum(tl.maximum(end, start), num_ids)
    length = tl.where(in_batch, end - start, 0)
    table = tl.multiple_of(tl.load(meta_ptr + f * 6), ROW_ALIGN)
    row_bytes = tl.multiple_of(tl.load(meta_ptr + f * 6 + 1), ROW_ALIGN)
    kind = tl.load(meta_ptr + f * 6 + 2)
    dim = tl.multiple_of(tl.load(meta_ptr + f * 6 + 3), VEC)
    col = tl.multiple_of(tl.load(meta_ptr + f * 6 + 4), VEC)
    rows = tl.load(meta_ptr + f * 6 + 5)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < dim
    acc = tl.zeros([BLOCK_B, BLOCK_D], dtype=tl.float32)
    for j in range(0, tl.max(length, axis=0)):
        active = j < length
        pos = start + j
        idx = tl.load(ids_ptr + pos, mask=active, other=0).to(tl.int64)
        ok = active & (idx >= 0) & (idx < rows)
        row = table + idx * row_bytes  # byte offset of the row (a multiple of ROW_ALIGN)
        m = ok[:, None] & col_ok[None, :]
        if HAS_WEIGHTS:
            w = tl.load(psw_ptr + pos, mask=active, other=0.0).to(tl.float32)
        else:
            w = tl.full([BLOCK_B], 1.0, tl.float32)
        if kind == 1:  # fp16 row
            x = _load_fp16(flat_ptr, flat16_ptr, row[:, None] + 2 * cols[None, :], m, ROW_ALIGN)
            if HAS_WEIGHTS:
                acc = tl.fma(w[:, None], x, acc)
            else:
                acc = acc + x
        else:  # int8 / int4: fp16 scale and bias, then one byte (or nibble) per value
            scale = _load_fp16(flat_ptr, flat16_ptr, row, ok, ROW_ALIGN) * w
            bias = _load_fp16(flat_ptr, flat16_ptr, row + 2, ok, ROW_ALIGN) * w
            if kind == 2:
                q = tl.load(flat_ptr + (row + 4)[:, None] + cols[None, :], mask=m, other=0)
            else:
                packed = tl.load(flat_ptr + (row + 4)[:, None] + (cols // 2)[None, :], mask=m, other=0)
                q = tl.where((cols % 2 == 0)[None, :], packed & 15, packed >> 4)
            bias2 = tl.where(m, bias[:, None], 0.0)
            acc = tl.fma(scale[:, None], q.to(tl.float32), acc + bias2)
    if MEAN:
        inverse = tl.div_rn(tl.full([BLOCK_B], 1.0, tl.float32), tl.maximum(length, 1).to(tl.float32))
        acc = acc * inverse[:, None]
    dst = out_ptr + b[:, None] * out_stride + col + cols[None, :]
    tl.store(dst, acc, mask=in_batch[:, None] & col_ok[None, :])
