"""The kernels by name, and the one rule that picks one: ``kernel_backend="auto" | "fbgemm" | "triton" | "torch"``.

``KERNELS`` lists the registered :class:`~lightrec.kernels.kernel_interface.EmbeddingKernel`
classes in the order ``"auto"`` tries them: fbgemm TBE where it serves the configuration -- on CPU,
for a fused group the torch kernel's native update also serves, both over one storage, the group
trained by the one whose first training steps were faster (``cpu_shared_lookup.py``, kernel
``"fbgemm|torch"``; not selectable by name), or, where they cannot share it, the one measured faster
for the group (``cpu_kernel_choice.py``); else, on CUDA, Triton; else pure torch. On CPU ``"auto"`` never picks Triton (its interpreter is for tests).
:func:`register_kernel` adds a backend under a new name (docs/kernels.md, "Adding a kernel").

Tiered tables (``KernelConfig.tiering`` set: a cache of hot rows over host memory or SSD) are built
by :func:`build_kernel`: fbgemm's ``MANAGED_CACHING`` TBE for host memory on a GPU with fbgemm's CUDA
build, else lightrec's ``TieredBatchedLookup`` with ``kernel_backend`` choosing the kernel that
serves its cache. Both are registered (``"fbgemm_managed_caching"``, ``"tiered"``) but ``"auto"``
never picks them for tables that are not tiered (their ``supports`` says so).
"""

from __future__ import annotations

import dataclasses

from lightrec.kernels.cpu_kernel_choice import cpu_fused_choice
from lightrec.kernels.cpu_shared_lookup import SharedCpuLookup
from lightrec.kernels.fbgemm_backend import FbgemmBatchedLookup
from lightrec.kernels.kernel_interface import EmbeddingKernel, KernelConfig
from lightrec.kernels.tiered.backend import TieredBatchedLookup
from lightrec.kernels.tiered.fbgemm_caching import FbgemmManagedCachingLookup
from lightrec.kernels.torch_backend import TorchBatchedLookup
from lightrec.kernels.triton_backend import TritonBatchedLookup

__all__ = ["KERNELS", "build_kernel", "check_kernel_backend", "kernel_class", "register_kernel", "select_backend"]

KERNELS: dict[str, type[EmbeddingKernel]] = {
    FbgemmBatchedLookup.name: FbgemmBatchedLookup,
    TritonBatchedLookup.name: TritonBatchedLookup,
    TieredBatchedLookup.name: TieredBatchedLookup,
    FbgemmManagedCachingLookup.name: FbgemmManagedCachingLookup,
    TorchBatchedLookup.name: TorchBatchedLookup,
}
_TIERED = (TieredBatchedLookup.name, FbgemmManagedCachingLookup.name)


def register_kernel(kernel: type[EmbeddingKernel], auto: bool = False) -> None:
    """Make ``kernel`` selectable as ``kernel_backend=kernel.name``.

    Args:
        kernel: a class implementing ``EmbeddingKernel``.
        auto: let ``"auto"`` pick it too, before the built-in kernels (where it ``supports`` the
            configuration).

    Raises:
        ValueError: the name is ``"auto"`` or already registered to another class.
    """
    if kernel.name == "auto" or KERNELS.get(kernel.name, kernel) is not kernel:
        raise ValueError(f"kernel name {kernel.name!r} is taken; registered kernels: {sorted(KERNELS)}")
    if auto:
        others = {k: v for k, v in KERNELS.items() if k != kernel.name}
        KERNELS.clear()
        KERNELS.update({kernel.name: kernel, **others})
    else:
        KERNELS[kernel.name] = kernel


def _choices() -> tuple[str, ...]:
    return ("auto", *sorted(KERNELS))


def check_kernel_backend(kernel_backend: str) -> None:
    """Reject an unknown ``kernel_backend`` argument (``"auto"`` or a registered kernel's name)."""
    if kernel_backend != "auto" and kernel_backend not in KERNELS:
        raise ValueError(
            f"kernel_backend must be one of {_choices()} (auto: fbgemm where it supports the tables, else "
            f"Triton on CUDA, else pure torch), got {kernel_backend!r}"
        )


def kernel_class(name: str) -> type[EmbeddingKernel]:
    """The registered kernel called ``name`` (not ``"auto"``)."""
    check_kernel_backend(name)
    return KERNELS[name]


def select_backend(kernel_backend: str, config: KernelConfig) -> str:
    """Resolve ``"auto"`` to a kernel's name; validate an explicit choice.

    ``"auto"``: the first registered kernel that serves ``config``, where Triton counts only on CUDA.

    Raises:
        ValueError: an unknown kernel, or an explicit one that cannot serve this lookup here.
    """
    check_kernel_backend(kernel_backend)
    if kernel_backend != "auto":
        reason = KERNELS[kernel_backend].supports(config)
        if reason is not None:
            others = ", ".join(repr(k) for k in _choices() if k != kernel_backend)
            raise ValueError(
                f"kernel_backend={kernel_backend!r} cannot serve this lookup: {reason}; use {others}"
            )
        return kernel_backend
    for name, kernel in KERNELS.items():
        if name == TritonBatchedLookup.name and config.device.type != "cuda":
            continue
        if name in _TIERED and config.tiering is None:
            continue
        if kernel.supports(config) is None:
            if name == FbgemmBatchedLookup.name and config.device.type == "cpu":
                return cpu_fused_choice(config).kernel  # vs the native torch kernel, measured per case
            return name
    return TorchBatchedLookup.name



def _class_of(name: str) -> type[EmbeddingKernel]:
    """The class of a kernel :func:`select_backend` named: a registered one, or the CPU kernel that
    ``"auto"`` alone builds (fbgemm and torch over one storage, not selectable by name)."""
    return SharedCpuLookup if name == SharedCpuLookup.name else KERNELS[name]


def build_kernel(kernel_backend: str, config: KernelConfig) -> tuple[str, EmbeddingKernel]:
    """``(name, kernel)`` serving ``config``: :func:`select_backend`'s choice for in-memory tables;
    for tiered ones (``config.tiering``), fbgemm's managed caching where it applies (host memory,
    CUDA, fbgemm's CUDA build, ``kernel_backend`` "auto" or "fbgemm"), else ``TieredBatchedLookup``
    over a cache served by ``kernel_backend``.

    Raises:
        ValueError: as :func:`select_backend`, or a tiered table without a fused optimizer.
    """
    tiering = config.tiering
    if tiering is None:
        name = select_backend(kernel_backend, config)
        return name, _class_of(name)(config)
    check_kernel_backend(kernel_backend)
    if config.spec is None:
        raise ValueError(
            "a tiered table (fused_uvm_caching / key_value) needs a fused optimizer: its rows are updated where "
            "they are cached, and a dense [rows, D] gradient of a table larger than memory cannot exist"
        )
    if kernel_backend in ("auto", "fbgemm", FbgemmManagedCachingLookup.name):
        if FbgemmManagedCachingLookup.supports(config) is None:
            return FbgemmManagedCachingLookup.name, FbgemmManagedCachingLookup(config)
    cache = dataclasses.replace(config, rows=[tiering.cache_rows_for(r) for r in config.rows], tiering=None)
    inner = select_backend("auto" if kernel_backend in _TIERED else kernel_backend, cache)
    tiered = dataclasses.replace(config, tiering=dataclasses.replace(tiering, inner_kernel=_class_of(inner)))
    return TieredBatchedLookup.name, TieredBatchedLookup(tiered)
