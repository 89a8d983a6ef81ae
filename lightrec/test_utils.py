"""Helpers for tests of code built on lightrec, at torchrec's path (``torchrec.test_utils``).

* :func:`get_free_port` -- a TCP port on 127.0.0.1 that nothing listens on, for ``MASTER_PORT``
  (generative-recommenders calls it outside its tests, to start a process group);
* :func:`skip_if_asan` / :func:`skip_if_asan_class` -- skip a test (a ``unittest`` test function or
  class) when the interpreter runs under AddressSanitizer or ThreadSanitizer, where forking worker
  processes and fbgemm's kernels are not supported;
* :func:`init_distributed_single_host` -- join a one-host process group as ``rank`` of
  ``world_size`` (``LOCAL_WORLD_SIZE`` / ``LOCAL_RANK`` set first, so ``get_local_size()`` and
  ``get_local_rank()`` see the host's layout), for a test's worker process;
* :func:`seed_and_log` -- run a test under a fresh seed of torch, ``random`` and numpy, printed so a
  failure can be replayed (``torch.manual_seed(<printed seed>)``).

Nothing of lightrec is imported here: the module is a leaf any test may use.
"""

from __future__ import annotations

import ctypes
import functools
import os
import random
import socket
import time
import unittest
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["get_free_port", "init_distributed_single_host", "is_asan", "is_asan_or_tsan", "is_tsan",
           "seed_and_log", "skip_if_asan", "skip_if_asan_class"]  # fmt: skip

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)

_SANITIZER_SKIP = "skipped: the interpreter runs under AddressSanitizer or ThreadSanitizer"


def get_free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (the OS picks it; another process may take
    it before you bind it, so use it at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _process_has_symbol(name: str) -> bool:
    """Whether the running process (the interpreter and what it loaded) exports ``name``."""
    return hasattr(ctypes.CDLL(None), name)


def is_asan() -> bool:
    """Whether the interpreter runs under AddressSanitizer."""
    return _process_has_symbol("__asan_init")


def is_tsan() -> bool:
    """Whether the interpreter runs under ThreadSanitizer."""
    return _process_has_symbol("__tsan_init")


def is_asan_or_tsan() -> bool:
    return is_asan() or is_tsan()


def skip_if_asan(func: Callable[P, R]) -> Callable[P, R]:
    """Decorate a test function: under a sanitizer it raises ``unittest.SkipTest`` (pytest skips it too)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if is_asan_or_tsan():
            raise unittest.SkipTest(_SANITIZER_SKIP)
        return func(*args, **kwargs)

    return wrapper


def skip_if_asan_class(cls: C) -> C:
    """Decorate a ``unittest.TestCase`` class: under a sanitizer every test of it is skipped."""
    if is_asan_or_tsan():
        cls.__unittest_skip__ = True  # type: ignore[attr-defined]  # unittest's class-level skip flags
        cls.__unittest_skip_why__ = _SANITIZER_SKIP  # type: ignore[attr-defined]
    return cls


def init_distributed_single_host(
    rank: int, world_size: int, backend: str, local_size: int | None = None
) -> dist.ProcessGroup:
    """Join the default process group as ``rank`` of ``world_size`` on one host, as torchrec's helper.

    Sets ``LOCAL_WORLD_SIZE`` (``local_size``, default ``world_size``) and ``LOCAL_RANK``
    (``rank % local_size``, default ``rank``) in ``os.environ`` first, then calls
    ``torch.distributed.init_process_group(rank=rank, world_size=world_size, backend=backend)``,
    which reads ``MASTER_ADDR`` / ``MASTER_PORT`` from the environment (:func:`get_free_port`).

    Returns:
        the default group (``torch.distributed.group.WORLD``).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size <= 0:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}) (world_size={world_size}), got {rank!r}")
    if local_size is not None and (
        isinstance(local_size, bool) or not isinstance(local_size, int) or local_size <= 0
    ):
        raise ValueError(
            f"local_size must be a positive int or None (one host: world_size), got {local_size!r}"
        )
    # Written, as torchrec's helper does, for the code under test (get_local_size / get_local_rank read them
    # through lightrec.distributed.comm.topology); a test's worker process owns its environment.
    os.environ.update(
        LOCAL_WORLD_SIZE=str(local_size if local_size else world_size),
        LOCAL_RANK=str(rank % local_size if local_size else rank),
    )
    dist.init_process_group(rank=rank, world_size=world_size, backend=backend)
    group = dist.group.WORLD
    if group is None:  # init_process_group returned, so the default group exists
        raise RuntimeError("torch.distributed.init_process_group did not create the default group")
    return group


def seed_and_log(func: Callable[P, R]) -> Callable[P, R]:
    """Decorate a test: each call seeds torch, ``random`` and numpy with a new seed (from the clock)
    and prints ``Using random seed: <seed>`` first."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        seed = int(time.time() * 1000) % (1 << 31)
        print(f"Using random seed: {seed}")
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        return func(*args, **kwargs)

    return wrapper
