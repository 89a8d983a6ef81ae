"""One place that decides whether Triton kernels can run here.

Triton ships with every CUDA (and ROCm) build of torch, so lightrec's Triton kernels give fast GPU
lookups where no fbgemm wheel matches the installed torch. On CPU they run only under Triton's
interpreter: set ``TRITON_INTERPRET=1`` **before** lightrec's kernel modules are imported (the
``@triton.jit`` decorator reads it when the kernels are defined); that is how CI tests them on
CPU tensors. Every module that wants a Triton kernel asks here instead of importing ``triton``.

Set ``LIGHTREC_TRITON=0`` (``lightrec._switches``, docs/switches.md) to make lightrec behave as if Triton
were absent.
"""

from __future__ import annotations

import os

import torch

from lightrec import _switches

__all__ = ["triton_available", "triton_device_reason", "triton_interpreting", "triton_unavailable_reason"]


def _import_triton() -> str | None:
    """None when ``triton`` imports, else why it does not."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"triton failed to import: {type(exc).__name__}: {exc}"
    return None


_DECISION = _switches.Decision(_switches.TRITON, _import_triton)
triton_available = _DECISION.available
triton_unavailable_reason = _DECISION.unavailable_reason


def triton_interpreting() -> bool:
    """True when Triton's interpreter is switched on (``TRITON_INTERPRET=1``) for this process."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_device_reason(device: torch.device) -> str | None:
    """None when lightrec's Triton kernels can run on ``device``, else the reason they cannot.

    CUDA devices (ROCm builds of torch report ``cuda`` too) run compiled kernels; CPU tensors
    run under the interpreter only.
    """
    if not triton_available():
        return triton_unavailable_reason()
    if device.type == "cuda":
        return None
    if device.type == "cpu":
        if triton_interpreting():
            return None
        return (
            "Triton kernels run on CPU tensors only under its interpreter: set TRITON_INTERPRET=1 in the "
            "environment before lightrec's kernels are imported (slow; meant for tests)"
        )
    return f"Triton kernels serve cuda devices (or cpu under TRITON_INTERPRET=1), not {device.type}"
