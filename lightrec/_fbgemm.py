"""One place that decides whether fbgemm-gpu is usable.

fbgemm-gpu wheels are pinned to one torch release; when none matches (new torch, macOS, a broken
install) lightrec must still import and run on its pure-torch paths. Every module that wants an
fbgemm op asks here instead of importing ``fbgemm_gpu`` itself.

Set ``LIGHTREC_DISABLE_FBGEMM=1`` to make lightrec behave as if fbgemm were absent (the CI job that
proves the pure-torch backend uses a stronger block: ``fbgemm_gpu`` cannot be imported at all).
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = ["fbgemm_available", "fbgemm_serves_cuda", "fbgemm_unavailable_reason", "has_fbgemm_op"]

_reason: str | None = None


@functools.lru_cache(maxsize=1)
def fbgemm_available() -> bool:
    """True when ``fbgemm_gpu`` imports and registers its ops on this torch."""
    global _reason
    if os.environ.get("LIGHTREC_DISABLE_FBGEMM", "") not in ("", "0"):
        _reason = "disabled by LIGHTREC_DISABLE_FBGEMM"
        return False
    try:
        import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm.*)
    except Exception as exc:  # ImportError, or OSError from a wheel built for another torch
        _reason = f"fbgemm_gpu failed to import: {type(exc).__name__}: {exc}"
        return False
    return True


def fbgemm_unavailable_reason() -> str | None:
    """Why fbgemm is unavailable, or None when it is available."""
    return None if fbgemm_available() else _reason


def has_fbgemm_op(name: str) -> bool:
    """True when ``torch.ops.fbgemm.<name>`` exists (fbgemm importable and the op registered)."""
    if not fbgemm_available():
        return False
    try:
        getattr(torch.ops.fbgemm, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def fbgemm_serves_cuda() -> bool:
    """True when the installed fbgemm has CUDA kernels (``fbgemm-gpu``, not ``fbgemm-gpu-cpu``).

    The CPU wheel imports on any machine and registers the same op names, but its ops have no
    CUDA implementation; ``fbgemm_gpu.__variant__`` says which build it is (``"cpu"``, ``"cuda"``,
    ``"rocm"``).
    """
    if not fbgemm_available():
        return False
    import fbgemm_gpu

    return getattr(fbgemm_gpu, "__variant__", "cuda") != "cpu"

