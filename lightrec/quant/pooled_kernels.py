"""Pooled lookups over quantized rows: fbgemm's IntN TBE op, or pure torch with identical results.

The torch kernel reads one table stored in fbgemm's row layout (see
:mod:`lightrec.quant.row_codec`) and pools the rows of every bag of every feature that reads it:

    weight   [rows, row_bytes] uint8        one table
    ids      [N]                            ids of the table's F features, key-major
    offsets  [F * B + 1]                    bag boundaries into ids (starts at 0)
    ->       [B, F * D] float32             feature blocks side by side (KeyedTensor layout)

The fbgemm kernel does the same for many tables in one call: they lie back to back in one flat
byte buffer and each feature names its table's byte offset (see
:mod:`lightrec.quant.table_groups`).

Numerics (what fbgemm 1.8's CPU kernel does, measured, and what the torch kernel reproduces bit for
bit): scale ``s`` and bias ``b`` are fp16 in the row and widened to fp32; with a per-id weight
``w`` they become ``s * w`` and ``b * w`` (fp32). Each id of a bag is accumulated in order into an
fp32 buffer as ``acc = fma(s, q, acc + b)`` (one rounding for the multiply-add); fp16/fp32 rows
accumulate ``acc = fma(w, x, acc)``. MEAN multiplies the sum by ``fp32(1 / len)``; empty bags
give zeros. The torch kernel emulates the fused multiply-add in float64, where ``s * q`` is exact.

The torch kernel loops over bag positions (``max(len)`` steps), a data-dependent loop: under
``torch.export``/``torch.compile`` it runs as the custom op ``lightrec::nbit_pooled_lookup``
(with a shape-only fake), and ``torch.fx`` records each kernel as one call (``torch.fx.wrap``) that
``torch.jit.script`` compiles from source.
"""

from typing import Optional

import torch

__all__ = [
    "SPARSE_TYPE_FP16",
    "SPARSE_TYPE_FP32",
    "SPARSE_TYPE_INT4",
    "SPARSE_TYPE_INT8",
    "fp16_bytes_to_float",
    "grouped_lookup_fbgemm",
    "pooled_lookup_torch",
]

# fbgemm's SparseType.as_int() codes, used by both kernels so a table's code means the same thing.
SPARSE_TYPE_FP32 = 0
SPARSE_TYPE_FP16 = 1
SPARSE_TYPE_INT8 = 2
SPARSE_TYPE_INT4 = 3
SCALE_BIAS_BYTES = 4  # fp16 scale then fp16 bias, at the start of every int8/int4 row

# fbgemm EmbeddingLocation codes, spelt as literals in the functions below (TorchScript cannot
# read module globals): 0 = DEVICE (accelerator memory), 3 = HOST (CPU memory).


def fp16_bytes_to_float(raw: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 bytes ``[..., 2k]`` uint8 -> float32 ``[..., k]`` (exact).

    Eager code bit-casts with ``view``; TorchScript has no dtype ``view``, so scripted code decodes
    the sign / exponent / mantissa fields instead (same values for every finite half; inf and NaN,
    which quantization never writes, are not decoded).
    """
    if not torch.jit.is_scripting():
        return raw.contiguous().view(torch.float16).float()
    pairs = raw.reshape(raw.shape[:-1] + (raw.shape[-1] // 2, 2)).to(torch.int32)
    bits = torch.bitwise_or(pairs[..., 0], torch.bitwise_left_shift(pairs[..., 1], 8))
    exponent = torch.bitwise_and(torch.bitwise_right_shift(bits, 10), 31)
    mantissa = torch.bitwise_and(bits, 1023)
    subnormal = exponent == 0
    significand = torch.where(subnormal, mantissa, mantissa + 1024).float()
    power = torch.where(subnormal, torch.full_like(exponent, -24), exponent - 25).float()
    magnitude = significand * torch.pow(2.0, power)
    return torch.where(torch.bitwise_and(bits, 32768) != 0, -magnitude, magnitude)


def _accumulate_positions(
    rows: torch.Tensor,
    data_type: int,
    dim: int,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    mean: bool,
) -> torch.Tensor:
    """``[num_bags, dim]`` pooled bags from the gathered rows ``[N, row_bytes]`` (see module doc)."""
    num_bags = offsets.numel() - 1
    out = torch.zeros(num_bags, dim, dtype=torch.float32, device=rows.device)
    if rows.shape[0] == 0 or num_bags == 0:
        return out
    quantized = data_type == 2 or data_type == 3
    scale = torch.empty(0, dtype=torch.float64, device=rows.device)
    bias = torch.empty(0, dtype=torch.float32, device=rows.device)
    if quantized:
        scale_bias = fp16_bytes_to_float(rows[:, :4])
        scale32 = scale_bias[:, 0]
        bias = scale_bias[:, 1]
        if per_sample_weights is not None:
            w = per_sample_weights.float()
            scale32 = scale32 * w
            bias = bias * w
        scale = scale32.double().unsqueeze(1)
        bias = bias.unsqueeze(1)
        if data_type == 2:
            values = rows[:, 4 : 4 + dim].double()
        else:
            packed = rows[:, 4 : 4 + dim // 2]
            # low nibble holds the even column, high nibble the odd one (fbgemm's packing)
            values = torch.stack([torch.bitwise_and(packed, 15), torch.bitwise_right_shift(packed, 4)], dim=2).reshape(-1, dim).double()
    else:  # fp16 rows (fp32 storage is not offered: TorchScript cannot bit-cast 4 bytes to float)
        values = fp16_bytes_to_float(rows[:, : 2 * dim]).double()
    weights64 = torch.empty(0, dtype=torch.float64, device=rows.device)
    if per_sample_weights is not None and not quantized:
        weights64 = per_sample_weights.float().double().unsqueeze(1)
    lengths = offsets[1:] - offsets[:-1]
    starts = offsets[:-1].long()
    max_len = int(lengths.max())
    for p in range(max_len):
        active = torch.nonzero(lengths > p).squeeze(1)
        pos = starts.index_select(0, active) + p
        acc = out.index_select(0, active)
        if quantized:
            # fma(s, q, acc + b): s * q is exact in float64, so one rounding to float32 remains
            acc = (scale.index_select(0, pos) * values.index_select(0, pos)
                   + (acc + bias.index_select(0, pos)).double()).float()
        elif per_sample_weights is None:
            acc = acc + values.index_select(0, pos).float()
        else:
            acc = (weights64.index_select(0, pos) * values.index_select(0, pos) + acc.double()).float()
        out.index_copy_(0, active, acc)
    if mean:
        inverse = 1.0 / lengths.clamp(min=1).float()
        out = out * inverse.unsqueeze(1)
    return out


def pooled_lookup_torch(
    weight: torch.Tensor,
    data_type: int,
    dim: int,
    num_features: int,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    mean: bool,
) -> torch.Tensor:
    """Pure-torch pooled lookup of one quantized table (layouts in the module docstring).

    Returns:
        ``[B, num_features * dim]`` float32, ``B = (offsets.numel() - 1) // num_features``.
    """
    if not torch.jit.is_scripting():
        if torch.compiler.is_compiling():
            return torch.ops.lightrec.nbit_pooled_lookup(
                weight, data_type, dim, num_features, ids, offsets, per_sample_weights, mean
            )
    rows = weight.index_select(0, ids.long())
    pooled = _accumulate_positions(rows, data_type, dim, offsets, per_sample_weights, mean)
    batch = pooled.shape[0] // num_features
    return pooled.view(num_features, batch, dim).transpose(0, 1).reshape(batch, num_features * dim)


# Under torch.compile / torch.export the function above runs as this custom op (its data-dependent
# loop stays opaque; the fake below gives the shape). At run time the op calls the same function,
# which then takes the eager path: torch.compiler.is_compiling() is False outside tracing.
_nbit_pooled_lookup_op = torch.library.custom_op("lightrec::nbit_pooled_lookup", pooled_lookup_torch, mutates_args=())


@_nbit_pooled_lookup_op.register_fake
def _(weight, data_type, dim, num_features, ids, offsets, per_sample_weights, mean):  # noqa: ANN001, ANN202
    batch = (offsets.shape[0] - 1) // num_features
    return weight.new_empty((batch, num_features * dim), dtype=torch.float32)


def grouped_lookup_fbgemm(
    flat: torch.Tensor,
    weights_offsets: torch.Tensor,
    weights_tys: torch.Tensor,
    d_offsets: torch.Tensor,
    total_d: int,
    max_int4_d: int,
    max_int8_d: int,
    max_fp16_d: int,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: Optional[torch.Tensor],
    pooling_mode: int,
    row_alignment: int,
) -> torch.Tensor:
    """fbgemm's ``int_nbit_split_embedding_codegen_lookup_function`` over several tables at once.

    The one call site of fbgemm's IntN op: the pooled groups (:mod:`lightrec.quant.table_groups`)
    and the unpooled kernel (:mod:`lightrec.quant.sequence_kernels`) both go through it.

    Args:
        flat: every table's rows back to back, ``[total bytes]`` uint8 (CPU: HOST, else DEVICE memory).
        weights_offsets / weights_tys: ``[F]`` byte offset into ``flat`` and type code of the table
            each feature reads (one TBE "table" per feature).
        d_offsets: ``[F + 1]`` int32 column offsets of the features in the output (cumulative D).
        total_d / max_*_d: output width and the widest feature of each storage type (0 if none).
        ids / offsets: ids of the F features (key-major) and their ``[F * B + 1]`` bag boundaries.
        per_sample_weights: ``[N]`` or None.
        pooling_mode: fbgemm's ``PoolingMode`` code: 0 SUM, 1 MEAN (a ``mean`` bool works), 2 NONE.

    Returns:
        ``[B, total_d]`` float32, feature blocks side by side (``[N, total_d]``, one row per id,
        for pooling NONE).
    """
    device = flat.device
    location = 3 if device.type == "cpu" else 0  # EmbeddingLocation.HOST / DEVICE
    return torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function(
        dev_weights=flat,
        uvm_weights=torch.empty(0, dtype=torch.uint8, device=device),
        weights_placements=torch.full(weights_offsets.shape, location, dtype=torch.int32, device=device),
        weights_offsets=weights_offsets,
        weights_tys=weights_tys,
        D_offsets=d_offsets,
        total_D=total_d,
        max_int2_D=0,
        max_int4_D=max_int4_d,
        max_int8_D=max_int8_d,
        max_float16_D=max_fp16_d,
        max_float32_D=0,
        indices=ids.to(offsets.dtype),
        offsets=offsets,
        pooling_mode=int(pooling_mode),
        indice_weights=per_sample_weights.float() if per_sample_weights is not None else None,
        output_dtype=0,
        lxu_cache_weights=torch.empty(0, 0, dtype=torch.uint8, device=device),
        lxu_cache_locations=torch.empty(0, dtype=torch.int32, device=device),
        row_alignment=row_alignment,
        max_float8_D=0,
        fp8_exponent_bits=-1,
        fp8_exponent_bias=-1,
    )

