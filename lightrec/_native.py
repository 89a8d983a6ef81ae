"""lightrec's native CPU ops: built from ``lightrec/csrc`` at first use, or left out with one warning.

Six small C++ files register torch ops (``torch.ops.lightrec_cpu.*``: the torch kernel's fused
update and row gather on CPU, and the id check and sample-major id order of a batched lookup; ``torch.ops.lightrec_mch.*``: a managed-collision table's training step on CPU;
``torch.ops.lightrec_tiered.*``: a tiered table's cache bookkeeping and row copies on CPU;
``torch.ops.lightrec_shm.*``: the futex signalling of the shared-memory transport, Linux only).
They are compiled once per environment and checkout by ``torch.utils.cpp_extension.load`` -- the
compiler torch itself documents for extensions (g++/clang++ and ``ninja``, which lightrec depends
on) -- into torch's extension cache (``$TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``; one folder per torch install and source tree, see
:func:`_build_directory`), where later processes find the built library in well under a
second; a source change rebuilds it. Concurrent builds (several ranks starting at once) take turns
on an ``flock`` in that folder (:func:`_build_turn`), which the kernel releases when its holder dies;
torch's own lock file, which a process killed mid-build leaves behind and which would make every
later process wait forever, is removed by whoever holds the turn.

The decision, made once per process (:func:`native_ops`):

1. ``LIGHTREC_NATIVE=0`` (``lightrec._switches``, docs/switches.md): no native ops, silently (asked for).
2. Otherwise build or load; any failure (no compiler, no ``ninja``, missing Python headers, a
   compile error) gives ONE :class:`NativeUnavailableWarning` naming the reason and the fix, and
   lightrec runs its pure-torch update, managed-collision step, tiered-cache bookkeeping and the
   gloo transport instead -- the same numbers, slower.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from lightrec import _switches

__all__ = ["NativeOps", "NativeUnavailableWarning", "cpu_ops_loaded", "native_ops", "native_unavailable_reason"]

_CSRC = Path(__file__).resolve().parent / "csrc"
_log = logging.getLogger(__name__)
_reason: str | None = None


class NativeUnavailableWarning(UserWarning):
    """lightrec's native CPU ops could not be built: the pure-torch update and gloo are used instead."""


@dataclass(frozen=True)
class NativeOps:
    """What the loaded library offers.

    Attributes:
        fused_update: ``torch.ops.lightrec_cpu.cpu_fused_update`` and ``torch.ops.lightrec_cpu.gather_rows``
            (the torch kernel's prefetching row gather, ``lightrec.kernels.cpu_gather``) are registered, and
            ``check_lookup_inputs`` / ``sample_major_ids`` (``lightrec/csrc/lookup_inputs.cpp``: the id check of
            ``lightrec.kernels.input_checks`` and the torch kernel's one-id-per-bag id order, one pass each).
        tiered: ``torch.ops.lightrec_tiered.{tiered_admit, tiered_touch, tiered_release, tiered_copy_rows,
            tiered_advise}`` are registered.
        shm: ``torch.ops.lightrec_shm.{shm_store, shm_wait, shm_fetch_add}`` are registered (Linux).
        mch_step: ``torch.ops.lightrec_mch.lookup_insert`` (a managed-collision table's training
            step, ``lightrec.modules.managed_collision.mch_native``) is registered.
        library: path of the loaded shared library.
    """

    fused_update: bool
    shm: bool
    library: str
    mch_step: bool = False
    tiered: bool = False


def _sources() -> list[str]:
    files = ["cpu_fused_update.cpp", "cpu_gather.cpp", "lookup_inputs.cpp", "mch_step.cpp", "tiered_cache.cpp"]
    if sys.platform.startswith("linux"):  # futex signalling
        files.append("shm_sync.cpp")
    return [str(_CSRC / f) for f in files]


def _pip_ninja_dir() -> str | None:
    """The folder of the ``ninja`` that pip installed (the ``ninja`` package) when no ``ninja`` is on
    PATH (a virtual environment used without activating it), else None."""
    if shutil.which("ninja") is not None:
        return None
    try:
        import ninja  # type: ignore[import-not-found, unused-ignore]  # typed when installed (a dependency); absent in some envs
    except ImportError:
        return None
    bin_dir = getattr(ninja, "BIN_DIR", None)
    return str(bin_dir) if bin_dir else None


@contextmanager
def _ninja_findable() -> Iterator[None]:
    """PATH with pip's ``ninja`` in front for the duration of the build, then PATH as it was.

    This must be the process environment: torch's build finds ``ninja`` only through
    ``os.environ["PATH"]`` (``is_ninja_available`` and ``_run_ninja_build`` take no environment
    or path), so the build cannot be given one of its own. Restored afterwards, so nothing else
    -- user code, the ranks and workers this process starts -- sees lightrec's change.
    """
    bin_dir = _pip_ninja_dir()
    if bin_dir is None:
        yield
        return
    before = os.environ.get("PATH")
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{before or ''}"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def _build_directory() -> Path:
    """Where ``lightrec_native`` is built: ``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``) /
    ``py311_cpu`` / ``lightrec_native-<key>``, ``<key>`` a hash of this torch install's and this lightrec
    source tree's paths.

    One folder per (environment, checkout): torch's ``cpp_extension.load`` rebuilds whenever the sources'
    paths or include flags differ from the last build in its folder, so two virtual environments (or two
    checkouts) sharing one folder rebuilt it in turn, each time a process of the other one had loaded it
    (measured: a CI run beside a second checkout's test suite rebuilt it every few minutes).
    """
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "torch_extensions")
    cuda = torch.version.cuda
    flavour = "cpu" if not cuda else "cu" + cuda.replace(".", "")
    where = f"{os.path.dirname(os.path.realpath(torch.__file__))}|{os.path.realpath(_CSRC)}"
    key = hashlib.sha256(where.encode()).hexdigest()[:12]
    return Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}_{flavour}" / f"lightrec_native-{key}"


@contextmanager
def _build_turn(directory: Path) -> Iterator[None]:
    """Hold this machine's turn to build or load the native library (an exclusive ``flock``).

    Why not only torch's lock: torch marks a build in progress with a plain file (``lock``) and every
    other process polls until it disappears, so a process killed mid-build (a rank SIGKILLed, a test
    timing out) leaves a file that makes every later start wait forever. An ``flock`` dies with its
    holder; whoever holds it knows no live lightrec build owns torch's file and removes it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's lock alone
        yield
        return
    with open(directory / "lightrec-build.flock", "a+b") as turn:
        fcntl.flock(turn.fileno(), fcntl.LOCK_EX)
        try:
            stale = directory / "lock"
            if stale.exists():
                _log.warning("removing %s, left by a native build that was killed", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(turn.fileno(), fcntl.LOCK_UN)


def _build() -> NativeOps:
    from torch.utils import cpp_extension

    sources = _sources()
    directory = _build_directory()
    # -ffp-contract=off: no fused multiply-adds, so the update rounds like the torch reference.
    # -fno-math-errno: std::sqrt need not set errno, so GCC vectorises the loops that take it (Adam's
    # and Adagrad's per-element sqrt and divides; results unchanged, IEEE sqrt rounds alike either
    # way). Measured, Adam over 1.45M touched rows of 26 x 100k x 64, one thread: 600 -> 290 ms.
    with _ninja_findable(), _build_turn(directory):
        path = cpp_extension.load(
            name="lightrec_native",
            sources=sources,
            extra_cflags=["-O3", "-ffp-contract=off", "-fno-math-errno"],
            build_directory=str(directory),
            is_python_module=False,
            verbose=False,
        )
    return NativeOps(fused_update=True, shm=any(s.endswith("shm_sync.cpp") for s in sources), library=str(path),
                     mch_step=True, tiered=True)  # fmt: skip


@functools.cache
def native_ops() -> NativeOps | None:
    """The native ops of this process (built or loaded on the first call), or None (see above)."""
    global _reason
    _reason = _switches.NATIVE.off_reason()
    if _reason is not None:
        return None
    try:
        ops = _build()
    except Exception as exc:  # noqa: BLE001 - any build or load failure means "use the fallbacks"
        _reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r}"
        warnings.warn(
            f"lightrec could not build its native CPU ops ({_reason}); the pure-torch fused update, "
            "managed-collision step and tiered-cache bookkeeping and gloo's transport are used instead (same "
            "results, slower). Install a C++ compiler (g++) and "
            f"the Python headers (python3-dev), and `pip install ninja`; or set {_switches.NATIVE.name}=0 "
            "to skip the build silently",
            NativeUnavailableWarning,
            stacklevel=2,
        )
        return None
    _log.debug("lightrec native ops loaded from %s", ops.library)
    return ops


def native_unavailable_reason() -> str | None:
    """Why :func:`native_ops` returned None (after it was called), else None."""
    return _reason


def cpu_ops_loaded() -> bool:
    """Whether the ``torch.ops.lightrec_cpu`` ops are registered (built or loaded on the first call):
    the torch kernel's update and gather, the id check and the sample-major id order."""
    ops = native_ops()
    return ops is not None and ops.fused_update
