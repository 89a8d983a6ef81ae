"""Rows of one table in a version, and the conversion of trained fp32 rows into the artifact's row format.

In ``rows.safetensors`` a table ``T`` with ``n`` rows is three tensors::

    T/ids       int64 [n]              row indices, unique, ascending
    T/values    float32 [n, dim]       row_format "fp32"
                float16 [n, dim]       row_format "fp16"
                uint8   [n, row_bytes] row_format "int8" / "int4": lightrec's quantized rows
                                       (fp16 scale, fp16 bias, the codes, zero padding; lightrec.quant.row_codec)
    T/raw_ids   int64 [n]              managed-collision tables only: the id each row holds, -1: none

``row_bytes`` is the codes plus 4 bytes rounded up to the writer's ``row_alignment`` (16 by default,
as the quantized collections store them), so int8 ``dim=64`` rows are 80 bytes. Quantizing a row
here gives the very bytes ``lightrec.inference.quantize`` gives it (both call ``quantize_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightrec.distributed.deltas.errors import DeltaFormatError
from lightrec.distributed.deltas.manifest import TableSpec
from lightrec.modules.embedding_configs import DataType
from lightrec.quant.row_codec import DEFAULT_ROW_ALIGNMENT, dequantize_rows, quantize_rows, row_size_in_bytes

__all__ = [
    "TableRows",
    "all_finite",
    "check_rows",
    "decode_rows",
    "encode_rows",
    "merge_rows",
    "payload_bytes",
    "row_data_type",
    "values_dtype",
]

_DATA_TYPES = {"fp16": DataType.FP16, "int8": DataType.INT8, "int4": DataType.INT4}


@dataclass(frozen=True)
class TableRows:
    """Some rows of one table.

    Attributes:
        ids: int64 ``[n]`` row indices, unique and ascending.
        values: ``[n, width]`` in a row format (module docstring), or float32 ``[n, dim]`` rows a
            writer converts.
        raw_ids: int64 ``[n]`` the id each row holds (managed-collision tables; -1: none), else None.
    """

    ids: torch.Tensor
    values: torch.Tensor
    raw_ids: torch.Tensor | None = None


def row_data_type(row_format: str) -> DataType:
    """The ``DataType`` of a quantized row format (``fp16``/``int8``/``int4``)."""
    if row_format not in _DATA_TYPES:
        raise DeltaFormatError(f"row_format {row_format!r} has no quantized layout; use one of {list(_DATA_TYPES)}")
    return _DATA_TYPES[row_format]


def values_dtype(row_format: str) -> torch.dtype:
    """The dtype of ``T/values`` in ``row_format``."""
    return {"fp32": torch.float32, "fp16": torch.float16}.get(row_format, torch.uint8)


def payload_bytes(dim: int, row_format: str) -> int:
    """Bytes of an int8/int4 row before padding (scale, bias and codes)."""
    return row_size_in_bytes(dim, row_data_type(row_format), row_alignment=1)


def _width(spec: TableSpec, row_alignment: int) -> int:
    if spec.row_format in ("fp32", "fp16"):
        return spec.dim
    return row_size_in_bytes(spec.dim, row_data_type(spec.row_format), row_alignment)


def all_finite(values: torch.Tensor) -> bool:
    """Whether every value is finite: one pass with no mask tensor (``aminmax`` propagates NaN, and an
    infinity is the minimum or the maximum), 4x faster than ``isfinite(values).all()`` on 300 MB."""
    if values.numel() == 0:
        return True
    low, high = torch.aminmax(values.detach())
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def encode_rows(
    values: torch.Tensor, spec: TableSpec, row_alignment: int = DEFAULT_ROW_ALIGNMENT
) -> torch.Tensor:
    """``values`` in ``spec.row_format``, on the CPU: float32 ``[n, dim]`` rows are converted, rows
    already in the format (the dtype and width it stores) pass as they are.

    Raises:
        DeltaFormatError: a shape or dtype that is neither, or values the format cannot store
            (non-finite, or beyond fp16's range for fp16/int8/int4).
    """
    width = _width(spec, row_alignment)
    stored = values_dtype(spec.row_format)
    if values.is_floating_point() and not all_finite(values):
        raise DeltaFormatError(f"table {spec.name!r} has non-finite values; a served row must be finite")
    if values.dim() == 2 and values.dtype == stored and values.shape[1] == width:
        return values.detach().cpu().contiguous()
    if values.dim() != 2 or values.dtype != torch.float32 or values.shape[1] != spec.dim:
        raise DeltaFormatError(
            f"table {spec.name!r}: values must be float32 [n, {spec.dim}] (converted to {spec.row_format}) or "
            f"{stored} [n, {width}] (already {spec.row_format}), got {values.dtype} {list(values.shape)}"
        )
    x = values.detach().cpu()
    if spec.row_format == "fp32":
        return x.contiguous()
    try:
        if spec.row_format == "fp16":  # fp16 rows of 2 * dim bytes, as fp16 values (quantize_rows checks the range)
            return quantize_rows(x, DataType.FP16, 2, spec.name).view(torch.float16)
        return quantize_rows(x, row_data_type(spec.row_format), row_alignment, spec.name)
    except ValueError as exc:
        raise DeltaFormatError(str(exc)) from exc


def decode_rows(values: torch.Tensor, spec: TableSpec) -> torch.Tensor:
    """float32 ``[n, dim]``: what the rows decode to (what the serving kernels read)."""
    if spec.row_format == "fp32":
        return values.float()
    if spec.row_format == "fp16":
        return values.float()
    return dequantize_rows(values, row_data_type(spec.row_format), spec.dim)


def check_rows(rows: TableRows, spec: TableSpec, width: int | None = None) -> None:
    """Raise ``DeltaFormatError`` unless ``rows`` are well-formed rows of ``spec``.

    Args:
        width: the expected ``values`` width (None: any width the format allows).
    """
    where = f"table {spec.name!r}"
    ids, values, raw = rows.ids, rows.values, rows.raw_ids
    if ids.dtype != torch.int64 or ids.dim() != 1:
        raise DeltaFormatError(f"{where}: ids must be int64 [n], got {ids.dtype} {list(ids.shape)}")
    n = ids.shape[0]
    if values.dim() != 2 or values.shape[0] != n or (width is not None and values.shape[1] != width):
        raise DeltaFormatError(
            f"{where}: values must be [{n}, {width if width is not None else 'width'}] (one row per id), "
            f"got {list(values.shape)}"
        )
    if n and (int(ids[0]) < 0 or int(ids[-1]) >= spec.num_embeddings or bool((ids[1:] <= ids[:-1]).any())):
        raise DeltaFormatError(
            f"{where}: ids must be unique, ascending and in [0, {spec.num_embeddings}), got first {int(ids[0])}, "
            f"last {int(ids[-1])}; sort them (torch.unique) before writing"
        )
    if spec.managed != (raw is not None):
        fix = "pass raw_ids=[n] (-1: an empty row)" if spec.managed else "drop raw_ids"
        raise DeltaFormatError(f"{where}: managed={spec.managed} but raw_ids is {'absent' if raw is None else 'given'}; {fix}")
    if raw is not None and (raw.dtype != torch.int64 or list(raw.shape) != [n] or bool((raw < -1).any())):
        raise DeltaFormatError(f"{where}: raw_ids must be int64 [{n}] with values >= -1, got {raw.dtype} {list(raw.shape)}")


def merge_rows(parts: list[TableRows]) -> TableRows:
    """One ``TableRows`` from several versions' rows of a table, oldest first: a later row wins (quantized
    rows of several widths are cut to the narrowest: the rest is padding)."""
    if len(parts) == 1:
        return parts[0]
    ids = torch.cat([p.ids for p in parts])
    # int8/int4 versions of writers with different row alignments: rows of different widths. The bytes past
    # the narrowest (at least the payload: the reader checks) are padding, so every row is cut to it.
    narrow = min(p.values.shape[1] for p in parts)
    values = torch.cat([p.values[:, :narrow] for p in parts])
    managed = parts[0].raw_ids is not None
    raw = torch.cat([p.raw_ids for p in parts if p.raw_ids is not None]) if managed else None
    unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    position = torch.arange(ids.shape[0])
    last = torch.full((unique.shape[0],), -1, dtype=torch.int64).scatter_reduce_(0, inverse, position, "amax")
    return TableRows(unique, values.index_select(0, last), raw.index_select(0, last) if raw is not None else None)
