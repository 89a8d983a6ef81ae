"""The glibc malloc policy of training ranks: fixed thresholds instead of glibc's adaptive ones.

A training step allocates and frees tens of MiB of activations, gradients and exchange buffers.
glibc serves blocks above its *mmap threshold* with fresh mappings and, by default, moves that
threshold up and down as it sees frees; it also returns the top of the heap to the OS above its
*trim threshold*. The result on a rank of the 2-rank DLRM benchmark: 0 to 17k minor page faults
per step, different per rank and per run (~8k faults, ~30 ms of system time per step typical),
from pages released and touched again. Fixed thresholds keep that memory in the heap: measured
227 -> 211 ms per step.

``"tuned"`` (the default of ``RecStrategy`` and ``lightrec run``) sets::

    MALLOC_MMAP_THRESHOLD_ = 32 MiB     blocks below it come from the heap, whose pages stay mapped
    MALLOC_TRIM_THRESHOLD_ = 1 GiB      freed heap memory is kept up to this much

in this process (``mallopt``) and in its environment, which the ranks a launcher starts (Lightning's
subprocess launcher, ``spawn``, DataLoader workers) inherit and glibc reads at their start.
Overrides, most specific first: a ``MALLOC_*`` variable already set in the environment is kept;
``RecStrategy(malloc_policy="default" | "tuned" | {name: bytes})``; ``lightrec run --malloc-policy``
(:func:`choose_malloc_policy`: this process's choice; the ranks Lightning launches re-run the same
command line); ``LIGHTREC_MALLOC_POLICY`` (``default`` or ``tuned``; ``lightrec._switches``).
``"default"`` leaves glibc alone. Other C libraries (musl, macOS) ignore the policy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Mapping

from lightrec import _switches

__all__ = ["MALLOC_POLICIES", "apply_malloc_policy", "choose_malloc_policy", "resolve_malloc_policy"]

MALLOC_POLICIES: dict[str, dict[str, int]] = {
    "tuned": {"MALLOC_MMAP_THRESHOLD_": 32 << 20, "MALLOC_TRIM_THRESHOLD_": 1 << 30},
    "default": {},
}
# mallopt parameter numbers (malloc.h) of the variables a policy may set.
_MALLOPT_PARAM = {"MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_TRIM_THRESHOLD_": -1}
_chosen: str | None = None  # `lightrec run --malloc-policy`, for a RecStrategy built later in this process


def choose_malloc_policy(policy: str) -> None:
    """Make ``policy`` (a name of ``MALLOC_POLICIES``) what ``None`` resolves to in this process, before
    ``$LIGHTREC_MALLOC_POLICY`` (``lightrec run --malloc-policy``).

    Raises:
        ValueError: an unknown policy name.
    """
    global _chosen
    resolve_malloc_policy(policy)  # an unknown name raises here, not when a rank starts
    _chosen = policy


def resolve_malloc_policy(policy: str | Mapping[str, int] | None) -> dict[str, int]:
    """The variables a policy sets: a name from ``MALLOC_POLICIES``, an explicit ``{variable: bytes}``,
    or None for :func:`choose_malloc_policy`'s choice, else ``$LIGHTREC_MALLOC_POLICY`` (default ``"tuned"``).

    Raises:
        ValueError: an unknown policy name, variable, or a negative size.
    """
    if policy is None:
        policy = _chosen or _switches.MALLOC_POLICY.read()
    if isinstance(policy, str):
        if policy not in MALLOC_POLICIES:
            raise ValueError(
                f"malloc_policy must be one of {sorted(MALLOC_POLICIES)} or a {{variable: bytes}} mapping, got "
                f"{policy!r}"
            )
        return dict(MALLOC_POLICIES[policy])
    values = {str(k): int(v) for k, v in policy.items()}
    bad = [k for k, v in values.items() if k not in _MALLOPT_PARAM or v < 0]
    if bad:
        raise ValueError(
            f"malloc_policy sets only {sorted(_MALLOPT_PARAM)} to non-negative byte counts, got {dict(policy)!r}"
        )
    return values


@functools.cache
def _mallopt() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def apply_malloc_policy(policy: str | Mapping[str, int] | None = None) -> dict[str, int]:
    """Apply ``policy`` to this process and its future children; returns what is in force
    (``{variable: bytes}``; a variable the environment already had keeps its value)."""
    applied = {}
    mallopt = _mallopt()
    for name, value in resolve_malloc_policy(policy).items():
        current = os.environ.get(name)
        if current is None:
            # The environment, not only mallopt below: glibc reads MALLOC_*_ when a process starts, and
            # the ranks a launcher execs (Lightning's subprocess launcher, spawn, DataLoader workers)
            # get the policy only this way -- mallopt's settings do not survive exec.
            os.environ[name] = str(value)
        elif current.isdigit():
            value = int(current)
        else:
            continue  # not a number: glibc ignores it too
        if mallopt is not None:
            mallopt(_MALLOPT_PARAM[name], min(value, 2**31 - 1))  # type: ignore[operator]
        applied[name] = value
    return applied
