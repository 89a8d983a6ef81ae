"""One place that decides whether fbgemm-gpu is usable.

fbgemm-gpu wheels are built for one torch release each; when none matches (new or old torch,
macOS, a broken install) lightrec must still import and run on its pure-torch paths. Every module
that wants an fbgemm op asks here instead of importing ``fbgemm_gpu`` itself.

The decision, made once per process:

1. ``LIGHTREC_FBGEMM=0`` (``lightrec._switches``, docs/switches.md): unavailable, silently (asked for). The CI job that proves the
   pure-torch backend uses a stronger block: ``fbgemm_gpu`` cannot be imported at all.
2. An installed fbgemm release built for another torch (``FBGEMM_TORCH``, fbgemm's own
   compatibility table): unavailable, **without importing it** -- its libraries are linked against
   that torch's C++ symbols, and loading them raises ``OSError`` or, worse, crashes the process.
3. Otherwise ``import fbgemm_gpu``; any failure (not installed, ``ImportError``, ``OSError``)
   means unavailable.

Cases 2 and 3 warn once (:class:`FbgemmUnavailableWarning`, naming the reason and the fix);
lightrec then runs its pure-torch kernels, with the same results.
"""

from __future__ import annotations

import importlib.metadata
import logging
import warnings

import torch

from lightrec import _switches

__all__ = [
    "FBGEMM_TORCH",
    "TESTED_FBGEMM",
    "FbgemmUnavailableWarning",
    "fbgemm_available",
    "fbgemm_serves_cuda",
    "fbgemm_unavailable_reason",
    "has_fbgemm_op",
]

#: fbgemm-gpu release (major.minor) -> the torch release (major.minor) it is built for, from
#: fbgemm's compatibility table (docs.pytorch.org/FBGEMM/general/Releases.html, and
#: ``_fbgemm_torch_compat_table`` in fbgemm_gpu 1.9's ``__init__``). Releases not listed (newer
#: ones, nightlies, local builds) are tried by importing them.
FBGEMM_TORCH: dict[str, str] = {"1.5": "2.10", "1.6": "2.11", "1.7": "2.12", "1.8": "2.13", "1.9": "2.14"}

class FbgemmUnavailableWarning(UserWarning):
    """fbgemm-gpu is missing or does not fit the installed torch: lightrec uses its pure-torch kernels."""


def _installed_fbgemm() -> tuple[str, str] | None:
    """``(distribution name, version)`` of the installed package providing ``fbgemm_gpu``, or None."""
    try:
        names = importlib.metadata.packages_distributions().get("fbgemm_gpu", [])
    except Exception:  # a broken metadata entry of any installed package
        return None
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _torch_release() -> str:
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _mismatch(installed: tuple[str, str] | None) -> str | None:
    """Why the installed fbgemm release cannot load on this torch, or None (fits, or unknown)."""
    if installed is None:
        return None
    name, version = installed
    wanted = FBGEMM_TORCH.get(".".join(version.split(".")[:2]))
    if wanted is None or wanted == _torch_release():
        return None
    return (
        f"{name} {version} is built for torch {wanted}.x, but torch {torch.__version__} is installed "
        f"(not imported: its libraries would not load)"
    )


#: The fbgemm release lightrec's fbgemm backend is tested with (the ``[cpu]``/``[cuda]`` extras pin it).
TESTED_FBGEMM = "1.8"


def _fix() -> str:
    torch_release = _torch_release()
    matching = [f for f, t in FBGEMM_TORCH.items() if t == torch_release]
    if matching and matching[-1] == TESTED_FBGEMM:
        return f"install fbgemm-gpu=={TESTED_FBGEMM}.* (CUDA) or fbgemm-gpu-cpu=={TESTED_FBGEMM}.* (CPU) to use them"
    built = (
        f"fbgemm {matching[-1]} is the release built for torch {torch_release}"
        if matching
        else (f"no fbgemm release is known for torch {torch_release}")
    )
    return (
        f"{built}; lightrec's fbgemm kernels are tested with fbgemm {TESTED_FBGEMM} on torch "
        f"{FBGEMM_TORCH[TESTED_FBGEMM]} (the [cpu]/[cuda] extras)"
    )


def _import_fbgemm_keeping_logging() -> None:
    """``import fbgemm_gpu`` (registers ``torch.ops.fbgemm.*``), leaving the root logger as it was.

    fbgemm_gpu's import calls ``logging.basicConfig(level=DEBUG)`` (a module of its benchmarks), which
    adds a stderr handler to an unconfigured root logger: every record of a propagating logger --
    Lightning's INFO lines, which have their own handler -- then printed twice. A user who set up
    logging before keeps it (``basicConfig`` does nothing then); otherwise the root logger's
    handlers and level are put back to what they were.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import fbgemm_gpu  # noqa: F401
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


def _import_fbgemm() -> str | None:
    """None when ``fbgemm_gpu`` imports on this torch (cases 2 and 3 of the module docstring), else
    why not, warned once (:class:`FbgemmUnavailableWarning`)."""
    reason = _mismatch(_installed_fbgemm())
    if reason is None:
        try:
            _import_fbgemm_keeping_logging()
        except ModuleNotFoundError as exc:
            reason = "fbgemm_gpu is not installed" if exc.name == "fbgemm_gpu" else f"fbgemm_gpu failed to import: {exc}"
        except Exception as exc:  # ImportError, or OSError from a wheel built for another torch
            reason = f"fbgemm_gpu failed to import: {type(exc).__name__}: {exc}"
        else:
            return None
    warnings.warn(
        f"lightrec uses its pure-torch kernels (same results, slower): {reason}; {_fix()}. "
        f"Set {_switches.FBGEMM.name}=0 to run the pure-torch kernels without this warning.",
        FbgemmUnavailableWarning,
        stacklevel=4,  # the caller of fbgemm_available or fbgemm_unavailable_reason (Decision)
    )
    return reason


_DECISION = _switches.Decision(_switches.FBGEMM, _import_fbgemm)
fbgemm_available = _DECISION.available
fbgemm_unavailable_reason = _DECISION.unavailable_reason


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

