"""Quantized communication: embedding rows encoded for the wire and decoded on arrival.

A codec turns ``[R, D]`` float rows into ``[R, wire_width(D)]`` bytes (``torch.uint8``) and back,
so every collective moves bytes whatever the precision (gloo and NCCL move them alike)::

    precision   bytes per row                      on the wire
    ---------   --------------------------------   --------------------------------------------
    fp32        4 D                                 (no codec: the rows themselves)
    fp16/bf16   2 D                                 the rows cast, as bytes
    fp8         D + 4                               e4m3 (or e5m2) values of x / s, s = max|x| / max_fp8
    int8        D + 8                               round((x - min) / s), s = (max - min) / 255, then s, min

fp16/bf16 rows may be scaled by ``loss_scale`` before the cast (and unscaled after), so small
gradients do not flush to zero. fp8 and int8 scale each row on its own (``s`` travels with it).
Decoding returns float32 rows; sums (the reduce-scatter) are taken in float32 after decoding.
:class:`QuantizedCommCodecs` pairs the codec of the forward collective with the one of its backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RowCodec", "QuantizedCommCodecs", "row_codec"]

_FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


class RowCodec:
    """Encodes ``[R, D]`` float rows as ``[R, wire_width(D)]`` uint8 (see the module docstring).

    Args:
        precision: ``"fp16"``, ``"bf16"``, ``"fp8"`` or ``"int8"``.
        loss_scale: factor applied before an fp16/bf16 cast and undone after it.
        fp8_format: ``"e4m3"`` (more precision) or ``"e5m2"`` (more range) for ``fp8``.
    """

    def __init__(self, precision: str, loss_scale: float | None = None, fp8_format: str = "e4m3") -> None:
        if precision not in ("fp16", "bf16", "fp8", "int8"):
            raise ValueError(f"precision must be fp16, bf16, fp8 or int8, got {precision!r}")
        if fp8_format not in _FP8_MAX:
            raise ValueError(f"fp8_format must be 'e4m3' or 'e5m2', got {fp8_format!r}")
        self.precision = precision
        self.loss_scale = float(loss_scale) if loss_scale else None
        self.fp8_format = fp8_format

    def __repr__(self) -> str:
        return f"RowCodec({self.precision!r}, loss_scale={self.loss_scale})"

    @property
    def cast_dtype(self) -> torch.dtype | None:
        """The dtype fp16/bf16 rows are cast to (None for the row-scaled codecs)."""
        return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.precision)

    def wire_width(self, dim: int) -> int:
        """Bytes per encoded row of ``dim`` values."""
        return {"fp16": 2 * dim, "bf16": 2 * dim, "fp8": dim + 4, "int8": dim + 8}[self.precision]

    def bytes_ratio(self, dim: int) -> float:
        """Encoded bytes per fp32 byte for rows of ``dim`` values."""
        return self.wire_width(dim) / (4.0 * dim) if dim else 1.0

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        """``[R, D]`` float -> ``[R, wire_width(D)]`` uint8."""
        rows = rows.detach()
        n, d = rows.shape
        if n == 0 or d == 0:
            return rows.new_empty((n, self.wire_width(d)), dtype=torch.uint8)
        cast = self.cast_dtype
        if cast is not None:
            scaled = rows * self.loss_scale if self.loss_scale else rows
            return scaled.to(cast).contiguous().view(torch.uint8).view(n, 2 * d)
        x = rows.float()
        if self.precision == "fp8":
            fp8 = torch.float8_e4m3fn if self.fp8_format == "e4m3" else torch.float8_e5m2
            scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / _FP8_MAX[self.fp8_format]
            values = (x / scale).to(fp8).view(torch.uint8)
            extra = scale.view(torch.uint8).view(n, 4)
        else:
            low, high = x.amin(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)
            scale = ((high - low) / 255.0).clamp_min(1e-30)
            values = torch.round((x - low) / scale).clamp_(0, 255).to(torch.uint8)
            extra = torch.cat([scale, low], dim=1).view(torch.uint8).view(n, 8)
        return torch.cat([values, extra], dim=1)

    def decode(self, wire: torch.Tensor, dim: int) -> torch.Tensor:
        """``[R, wire_width(dim)]`` uint8 -> ``[R, dim]`` float32."""
        n = wire.shape[0]
        if n == 0 or dim == 0:
            return torch.zeros((n, dim), dtype=torch.float32, device=wire.device)
        cast = self.cast_dtype
        wire = wire.contiguous()
        if cast is not None:
            out = wire.view(cast).view(n, dim).float()
            return out / self.loss_scale if self.loss_scale else out
        values = wire[:, :dim].contiguous()
        if self.precision == "fp8":
            fp8 = torch.float8_e4m3fn if self.fp8_format == "e4m3" else torch.float8_e5m2
            scale = wire[:, dim:].contiguous().view(torch.float32)
            return values.view(fp8).float() * scale
        params = wire[:, dim:].contiguous().view(torch.float32)  # [n, 2]: scale, min
        return values.float() * params[:, :1] + params[:, 1:]


@dataclass(frozen=True)
class QuantizedCommCodecs:
    """The codec of a collective's forward and of its backward (None: full fp32)."""

    forward: RowCodec | None = None
    backward: RowCodec | None = None


def row_codec(precision: str, loss_scale: float | None = None, fp8_format: str = "e4m3") -> RowCodec | None:
    """The codec of ``precision`` (None for ``"fp32"``)."""
    if precision == "fp32":
        return None
    return RowCodec(precision, loss_scale, fp8_format)


