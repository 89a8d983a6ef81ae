"""The torch kernel's row gather on CPU (``lightrec/csrc/cpu_gather.cpp``): ``weight[ids]``, prefetched.

Where every bag holds one id, the torch kernel's pooled forward is a row gather, and so is every
unpooled lookup. ``torch.index_select`` copies the rows one after the other and waits for each: the
rows are random reads of tables far larger than the caches. The native gather prefetches the rows
eight ids ahead: 53k random ids of 26 x 100k x 64 fp32 tables (huge pages, one thread) take
1.8 ms instead of 2.3. The bytes are copied, so the result equals ``index_select``'s exactly; where
the native library is unavailable (``lightrec._native``), or the operands are not a CPU
``[rows, D]`` table with unit column stride and ``int64`` ids, ``index_select`` runs.

:func:`gather_rows_into` writes the rows into a caller's block instead (a sharded lookup's rows go
straight to the pooled output's columns and to the shared-memory exchange).
"""

from __future__ import annotations

import torch

from lightrec._native import cpu_ops_loaded

__all__ = ["gather_rows", "gather_rows_into"]


def _native(weight: torch.Tensor, ids: torch.Tensor) -> bool:
    """Whether the native gather serves these operands."""
    return (
        weight.device.type == "cpu"
        and weight.dim() == 2
        and weight.stride(1) == 1
        and ids.dtype == torch.int64
        and ids.dim() == 1
        and not (weight.requires_grad and torch.is_grad_enabled())  # the op has no autograd formula
        and cpu_ops_loaded()
    )


def gather_rows(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[N, D]`` rows ``weight[ids]`` of a ``[R, D]`` table for ``[N]`` ids (a new tensor).

    Raises:
        RuntimeError: an id outside ``[0, R)`` (nothing is returned; the message names the id and
            its position).
    """
    if _native(weight, ids):
        return torch.ops.lightrec_cpu.gather_rows(weight, ids.contiguous())  # type: ignore[no-any-return]
    return weight.index_select(0, ids)


def gather_rows_into(weight: torch.Tensor, ids: torch.Tensor, out: torch.Tensor) -> None:
    """Write the rows ``weight[ids]`` of a ``[R, D]`` table into ``out`` ``[M, K * D]`` (``N = M * K``
    ids, unit column stride, any row stride): id ``i`` lands in row ``i // K``, columns
    ``(i % K) * D`` to ``(i % K + 1) * D``.

    Raises:
        ValueError: ``out`` does not hold ``N`` rows of ``D`` columns, or its columns are strided.
        RuntimeError: an id outside ``[0, R)`` (``out`` is left unchanged; the message names the id
            and its position).
    """
    dim = weight.shape[-1]
    if out.dim() != 2 or dim == 0 or out.shape[1] % dim or out.shape[0] * (out.shape[1] // dim) != ids.numel():
        raise ValueError(
            f"gather_rows_into: out {tuple(out.shape)} must be [M, K * {dim}] with M * K = {ids.numel()} "
            f"(the number of ids)"
        )
    if out.stride(1) != 1 and out.shape[1] > 1:
        raise ValueError(
            f"gather_rows_into: out must have unit column stride (rows of D contiguous values), got strides "
            f"{tuple(out.stride())}; pass a column block of a row-major tensor"
        )
    if _native(weight, ids) and out.dtype == weight.dtype and out.device.type == "cpu":
        torch.ops.lightrec_cpu.gather_rows_into(weight, ids.contiguous(), out)
        return
    shape = (out.shape[0], out.shape[1] // dim, dim)
    out.view(shape).copy_(weight.index_select(0, ids).view(shape))
