"""The torch kernel's row gather on CPU (``lightrec/csrc/cpu_gather.cpp``): ``weight[ids]``, prefetched.

Where every bag holds one id, the torch kernel's pooled forward is a row gather, and so is every
unpooled lookup. ``torch.index_select`` copies the rows one after the other and waits for each: the
rows are random reads of tables far larger than the caches. The native gather prefetches the rows
eight ids ahead: 53k random ids of 26 x 100k x 64 fp32 tables (huge pages, one thread) take
1.8 ms instead of 2.3. The bytes are copied, so the result equals ``index_select``'s exactly; where
the native library is unavailable (``lightrec._native``), or the operands are not a CPU
``[rows, D]`` table with unit column stride and ``int64`` ids, ``index_select`` runs.
"""

from __future__ import annotations

import torch

from lightrec._native import cpu_ops_loaded

__all__ = ["gather_rows"]


def gather_rows(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[N, D]`` rows ``weight[ids]`` of a ``[R, D]`` table for ``[N]`` ids (a new tensor).

    Raises:
        RuntimeError: an id outside ``[0, R)`` (nothing is returned; the message names the id and
            its position).
    """
    if (
        weight.device.type == "cpu"
        and weight.dim() == 2
        and weight.stride(1) == 1
        and ids.dtype == torch.int64
        and ids.dim() == 1
        and not (weight.requires_grad and torch.is_grad_enabled())  # the op has no autograd formula
        and cpu_ops_loaded()
    ):
        return torch.ops.lightrec_cpu.gather_rows(weight, ids.contiguous())  # type: ignore[no-any-return]
    return weight.index_select(0, ids)
