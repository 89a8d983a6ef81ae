"""Unpooled lookups over quantized rows: fbgemm's IntN TBE op (pooling NONE), pure torch, or the
Triton kernel of :mod:`lightrec.quant.triton_lookup` (every id a bag of one).

The sequence (``EmbeddingCollection``) counterpart of :mod:`lightrec.quant.pooled_kernels`: every id
gets its own decoded row back, in input order::

    weight   [rows, row_bytes] uint8        one table, fbgemm's row layout (quant_rows)
    ids      [N]                            ids of one feature (any batch layout)
    ->       [N, D] float32                 one row per id

Numerics (measured on fbgemm 1.8's CPU kernel, and reproduced bit for bit by the torch kernel):
int8/int4 values decode as ``fma(scale, q, bias)`` with fp16 scale/bias widened to fp32; fp16
rows decode exactly. ``scale * q`` is exact in fp32 (an 11-bit fp16 significand times a
``q < 256`` fits in 24 bits, subnormal halves included), so the plain ``q * scale + bias`` in fp32
rounds once, like the fused multiply-add -- and both equal
:func:`lightrec.quant.row_codec.dequantize_rows` of the looked-up rows.

Neither kernel has data-dependent control flow, so ``torch.export`` traces them as they are;
``torch.fx`` records each as one call (``torch.fx.wrap``) that ``torch.jit.script`` compiles from
source (the scripted fp16 decode cannot be traced through ``Tensor.view(dtype)``).
"""


import torch

from lightrec.quant.pooled_kernels import fp16_bytes_to_float, grouped_lookup_fbgemm
from lightrec.quant.triton_lookup import TritonSequenceKernel

__all__ = [
    "FbgemmSequenceKernel",
    "TorchSequenceKernel",
    "make_sequence_kernel",
    "sequence_lookup_fbgemm",
    "sequence_lookup_torch",
]


def sequence_lookup_torch(weight: torch.Tensor, data_type: int, dim: int, ids: torch.Tensor) -> torch.Tensor:
    """Decoded rows ``[N, dim]`` float32 of ``ids`` (``data_type``: fbgemm code 1 fp16, 2 int8, 3 int4)."""
    rows = weight.index_select(0, ids.long())
    if data_type == 1:
        return fp16_bytes_to_float(rows[:, : 2 * dim])
    scale_bias = fp16_bytes_to_float(rows[:, :4])
    if data_type == 2:
        q = rows[:, 4 : 4 + dim].float()
    else:
        packed = rows[:, 4 : 4 + dim // 2]
        # low nibble holds the even column, high nibble the odd one (fbgemm's packing)
        q = torch.stack([torch.bitwise_and(packed, 15), torch.bitwise_right_shift(packed, 4)], dim=2)
        q = q.reshape(-1, dim).float()
    # scale * q is exact in fp32, so the one rounding of the add is fbgemm's fma(scale, q, bias)
    return q * scale_bias[:, 0:1] + scale_bias[:, 1:2]


def sequence_lookup_fbgemm(
    weight: torch.Tensor, data_type: int, dim: int, ids: torch.Tensor, row_alignment: int
) -> torch.Tensor:
    """fbgemm's ``int_nbit_split_embedding_codegen_lookup_function`` with pooling NONE on one table.

    All ids form one "bag" (offsets ``[0, N]``): without pooling the output is one row per id
    whatever the bag boundaries are.

    Returns:
        ``[N, dim]`` float32.
    """
    device = weight.device
    offsets = torch.zeros([2], dtype=torch.int64, device=device)
    offsets[1] = ids.numel()
    return grouped_lookup_fbgemm(
        weight.view(-1),
        torch.zeros([1], dtype=torch.int64, device=device),
        torch.full([1], data_type, dtype=torch.uint8, device=device),
        torch.tensor([0, dim], dtype=torch.int32, device=device),
        dim,
        dim if data_type == 3 else 0,
        dim if data_type == 2 else 0,
        dim if data_type == 1 else 0,
        ids,
        offsets,
        None,
        2,  # PoolingMode.NONE
        row_alignment,
    )


torch.fx.wrap("sequence_lookup_torch")
torch.fx.wrap("sequence_lookup_fbgemm")


class TorchSequenceKernel(torch.nn.Module):
    """Unpooled quantized lookup in pure torch (any device, no fbgemm)."""

    def forward(self, weight: torch.Tensor, data_type: int, dim: int, ids: torch.Tensor) -> torch.Tensor:
        return sequence_lookup_torch(weight, data_type, dim, ids)


class FbgemmSequenceKernel(torch.nn.Module):
    """Unpooled quantized lookup with fbgemm's IntN kernel (same results as ``TorchSequenceKernel``)."""

    def __init__(self, row_alignment: int) -> None:
        super().__init__()
        self.row_alignment = row_alignment

    def forward(self, weight: torch.Tensor, data_type: int, dim: int, ids: torch.Tensor) -> torch.Tensor:
        return sequence_lookup_fbgemm(weight, data_type, dim, ids, self.row_alignment)


def make_sequence_kernel(kernel: str, row_alignment: int) -> torch.nn.Module:
    """The unpooled kernel module for ``kernel`` (``"fbgemm"``, ``"triton"`` or ``"torch"``, as
    chosen by :func:`lightrec.quant.collection_base.resolve_quant_kernel`)."""
    if kernel == "fbgemm":
        return FbgemmSequenceKernel(row_alignment)
    if kernel == "triton":
        return TritonSequenceKernel()
    return TorchSequenceKernel()
