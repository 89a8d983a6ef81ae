"""The one spelling of a lookup-kernel choice: ``kernel_backend``.

Everything that runs embedding lookups takes ``kernel_backend="auto" | "fbgemm" | "triton" |
"torch"``: the batched training lookups and fused collections (``lightrec.kernels``), the sharders
and ``RecStrategy``, the quantized collections (``lightrec.quant``), ``quantize`` and the sharded
serving helpers (``lightrec.inference``). ``"auto"`` picks fbgemm where it serves the tables, else
Triton on CUDA, else pure torch; every kernel gives the same numbers.

The older spellings keep working, with a ``DeprecationWarning``, until a release says otherwise:
``backend="..."`` (``BatchedEmbeddingBag``, ``BatchedEmbedding``, the fused and the quantized
collections, ``quantize``) and ``use_fbgemm=True | False`` (the quantized collections, ``quantize``,
``shard_for_inference``, ``ShardedQuantEmbeddingBagCollection``), which means ``"fbgemm"`` | ``"torch"``.
"""

from __future__ import annotations

import warnings

__all__ = ["KERNEL_BACKENDS", "resolve_kernel_backend"]

KERNEL_BACKENDS = ("auto", "fbgemm", "triton", "torch")
"""The built-in choices (``lightrec.kernels.register_kernel`` may add training kernels)."""


def resolve_kernel_backend(
    kernel_backend: str,
    where: str,
    *,
    backend: str | None = None,
    use_fbgemm: bool | None = None,
    stacklevel: int = 3,
) -> str:
    """``kernel_backend``, or what a deprecated spelling asked for (with a ``DeprecationWarning``).

    Args:
        kernel_backend: the argument under its one spelling (``"auto"`` when not given).
        where: the function or class, for the messages.
        backend: the deprecated ``backend=`` argument, or None.
        use_fbgemm: the deprecated ``use_fbgemm=`` argument (True: ``"fbgemm"``, False: ``"torch"``), or None.
        stacklevel: of the warning (the default points at the caller of ``where``).

    Raises:
        ValueError: the spellings ask for different kernels.
    """
    asked = {"kernel_backend": kernel_backend} if kernel_backend != "auto" else {}
    if backend is not None:
        warnings.warn(
            f"{where}(backend={backend!r}) is deprecated: pass kernel_backend={backend!r}",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        asked["backend"] = backend
    if use_fbgemm is not None:
        meant = "fbgemm" if use_fbgemm else "torch"
        warnings.warn(
            f"{where}(use_fbgemm={use_fbgemm}) is deprecated: pass kernel_backend={meant!r}",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        asked["use_fbgemm"] = meant
    if len(set(asked.values())) > 1:
        spelled = ", ".join(f"{k}={v!r}" if k != "use_fbgemm" else f"use_fbgemm={v == 'fbgemm'}" for k, v in asked.items())
        raise ValueError(f"{where}: {spelled} ask for different kernels; pass only kernel_backend=...")
    return next(iter(asked.values()), kernel_backend)
