"""Row-wise quantization of embedding tables into fbgemm's IntN TBE row layout.

Every row of a quantized table is one run of bytes (``uint8``), padded to ``row_alignment``::

    int8   | scale fp16 | bias fp16 | q_0 ... q_{D-1} (1 byte each)          | pad |
    int4   | scale fp16 | bias fp16 | (q_0 | q_1 << 4) ... (D / 2 bytes)      | pad |
    fp16   | x_0 ... x_{D-1} (2 bytes each)                                    | pad |

so a ``[4096, 64]`` table in int8 with the default alignment of 16 is ``[4096, 80]`` uint8
(64 + 4 = 68, rounded up to 80), as torchrec prints it. A stored value decodes to
``fp32(scale * q + bias)`` (one rounding, see :mod:`lightrec.quant.pooled_kernels`).

Quantization (per row, ``qmax = 255`` for int8 and ``15`` for int4)::

    bias  = fp16(min(row)), the next fp16 down when that one is above min(row) (so no value lies below
            the grid: rounded to nearest, a row far from 0 lost up to half an fp16 step at its bottom,
            many times scale / 2 for a row like [0.9, 1.0] or [1000, 1001])
    scale = fp16((max(row) - bias) / qmax), the next fp16 up when that one is smaller than the quotient
            (so max(row) never needs a code above qmax), or 1 when it is 0
    q     = clamp(round((x - bias) / scale), 0, qmax)

Error bound (tested): every decoded value is within ``scale / 2`` of the fp32 original, ``scale``
being the row's stored fp16 scale, up to fp32 rounding (``2**-23 * |x|``). In terms of the row alone
that is within ``scale / 2 + 2**-10 * (max(row) - min(row) + |min(row)|) + 2**-24``
(:func:`max_abs_error`; the second term covers rounding scale and bias to fp16). fp16 tables are
within ``2**-11 * |x|`` (plus 2**-24 for subnormals) of the original.
"""

from __future__ import annotations

import torch

from lightrec.modules.embedding_configs import DataType
from lightrec.quant.pooled_kernels import (
    SCALE_BIAS_BYTES,
    SPARSE_TYPE_FP16,
    SPARSE_TYPE_INT4,
    SPARSE_TYPE_INT8,
)

__all__ = [
    "DEFAULT_ROW_ALIGNMENT",
    "dequantize_rows",
    "quantize_rows",
    "row_size_in_bytes",
    "sparse_type_code",
]

DEFAULT_ROW_ALIGNMENT = 16  # what torchrec uses, so buffer shapes match the tutorial's
_FP16_MAX = 65504.0

_CODES = {
    DataType.FP16: SPARSE_TYPE_FP16,
    DataType.INT8: SPARSE_TYPE_INT8,
    DataType.INT4: SPARSE_TYPE_INT4,
}


def sparse_type_code(data_type: DataType) -> int:
    """fbgemm's ``SparseType`` integer code for a storage type."""
    if data_type not in _CODES:
        raise ValueError(f"data_type {data_type} cannot be served by the quantized kernels; use one of {list(_CODES)}")
    return _CODES[data_type]


def _unpadded_row_bytes(dim: int, data_type: DataType) -> int:
    if data_type == DataType.INT8:
        return dim + SCALE_BIAS_BYTES
    if data_type == DataType.INT4:
        return dim // 2 + SCALE_BIAS_BYTES
    if data_type == DataType.FP16:
        return 2 * dim
    raise ValueError(f"data_type {data_type} cannot be served by the quantized kernels; use one of {list(_CODES)}")


def row_size_in_bytes(dim: int, data_type: DataType, row_alignment: int = DEFAULT_ROW_ALIGNMENT) -> int:
    """Bytes per stored row: payload (+ 4 bytes scale/bias for int8/int4) rounded up to ``row_alignment``."""
    raw = _unpadded_row_bytes(dim, data_type)
    return (raw + row_alignment - 1) // row_alignment * row_alignment


def check_dim(dim: int, data_type: DataType, table: str) -> None:
    """Raise ``ValueError`` when a table of width ``dim`` cannot be stored as ``data_type``."""
    if data_type == DataType.INT4 and dim % 2:
        raise ValueError(
            f"table {table!r} has embedding_dim={dim}, but int4 packs two values per byte and needs an "
            "even embedding_dim; store this table as int8 (per_table={...: 'int8'})"
        )


def quantize_rows(
    weight: torch.Tensor, data_type: DataType, row_alignment: int = DEFAULT_ROW_ALIGNMENT, table: str = "?"
) -> torch.Tensor:
    """Quantize a float table ``[rows, D]`` into stored rows ``[rows, row_size_in_bytes]`` uint8.

    Raises:
        ValueError: the table holds NaN/inf or values beyond fp16's range (±65504), or int4 with odd ``D``.
    """
    rows, dim = weight.shape
    check_dim(dim, data_type, table)
    x = weight.detach().float()
    finite = torch.isfinite(x)
    if not bool(finite.all()) or (x.numel() > 0 and float(x.abs().max()) > _FP16_MAX):
        raise ValueError(
            f"table {table!r} has non-finite values or values beyond fp16's range (|x| > {_FP16_MAX}); "
            f"{data_type} storage keeps fp16 scales/values. Fix (or rescale) the weights before quantizing"
        )
    out = torch.zeros(rows, row_size_in_bytes(dim, data_type, row_alignment), dtype=torch.uint8, device=x.device)
    if data_type == DataType.FP16:
        out[:, : 2 * dim] = x.half().contiguous().view(torch.uint8)
        return out
    qmax = 255 if data_type == DataType.INT8 else 15
    if rows == 0:
        return out
    lo = x.min(dim=1).values
    hi = x.max(dim=1).values
    bias16 = lo.half()
    # Rounded to nearest the bias can land above min(row): the values below it then clamp to code 0, off by
    # up to half an fp16 step of min(row), which dwarfs scale / 2 for a row far from 0. The next fp16 down
    # puts every value on the grid (lo >= -65504 was checked above, so the step stays finite).
    above = bias16.float() > lo
    bias16 = torch.where(above, torch.nextafter(bias16, torch.full_like(bias16, float("-inf"))), bias16)
    bias = bias16.float()
    scale16 = ((hi - bias) / qmax).half()
    # Rounded to fp16 the scale can come out below the one the row needs, by up to half an fp16 step: for a
    # subnormal scale (an int8 row's range below ~0.0156, as in tables initialised at +-1e-3) that is a large share
    # of it, and the top of the row would need codes above qmax and be clamped. The next fp16 up covers the range.
    short = scale16.float() * qmax < hi - bias
    scale16 = torch.where(short, (scale16.view(torch.int16) + 1).view(torch.float16), scale16)  # positive: next up
    # an all-equal row needs no steps: q = 0 decodes to bias
    scale16 = torch.where(scale16 > 0, scale16, torch.ones_like(scale16))
    scale = scale16.float()
    q = torch.round((x - bias.unsqueeze(1)) / scale.unsqueeze(1)).clamp_(0, qmax).to(torch.uint8)
    out[:, :SCALE_BIAS_BYTES] = torch.stack([scale16, bias16], dim=1).view(torch.uint8)
    if data_type == DataType.INT8:
        out[:, SCALE_BIAS_BYTES : SCALE_BIAS_BYTES + dim] = q
    else:
        out[:, SCALE_BIAS_BYTES : SCALE_BIAS_BYTES + dim // 2] = q[:, 0::2] | (q[:, 1::2] << 4)
    return out


def _halves(raw: torch.Tensor) -> torch.Tensor:
    """Bytes ``[rows, 2k]`` uint8 read as fp16 ``[rows, k]``. A table of a collection is a view of its flat
    buffer, which with an odd ``row_alignment`` can start at an odd byte: ``view`` refuses that, so copy."""
    raw = raw.contiguous()
    if raw.storage_offset() % 2:
        raw = raw.clone()
    return raw.view(torch.float16)


def dequantize_rows(stored: torch.Tensor, data_type: DataType, dim: int) -> torch.Tensor:
    """Decode stored rows ``[rows, row_bytes]`` to fp32 ``[rows, dim]`` exactly as the kernels read them."""
    if data_type == DataType.FP16:
        return _halves(stored[:, : 2 * dim]).float()
    scale_bias = _halves(stored[:, :SCALE_BIAS_BYTES]).double()
    if data_type == DataType.INT8:
        q = stored[:, SCALE_BIAS_BYTES : SCALE_BIAS_BYTES + dim].double()
    else:
        packed = stored[:, SCALE_BIAS_BYTES : SCALE_BIAS_BYTES + dim // 2]
        q = torch.stack([packed & 15, packed >> 4], dim=2).reshape(-1, dim).double()
    return (scale_bias[:, :1] * q + scale_bias[:, 1:]).float()


def max_abs_error(weight: torch.Tensor, data_type: DataType) -> torch.Tensor:
    """Per-row bound ``[rows]`` on ``|dequantize(quantize(weight)) - weight|`` (see the module doc)."""
    x = weight.detach().float()
    absmax = x.abs().max(dim=1).values
    if data_type == DataType.FP16:
        return absmax * 2.0**-11 + 2.0**-24
    qmax = 255 if data_type == DataType.INT8 else 15
    lo = x.min(dim=1).values
    hi = x.max(dim=1).values
    return (hi - lo) / qmax / 2 * (1 + 2.0**-10) + 2.0**-10 * (hi - lo + lo.abs()) + 2.0**-24
