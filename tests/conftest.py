"""Shared pytest set-up.

``LIGHTREC_BLOCK_FBGEMM=1`` makes ``import fbgemm_gpu`` fail for the whole run (and for the
gloo ranks it spawns, which inherit the environment): the CI variant that proves lightrec works
where no fbgemm wheel matches the installed torch.
"""

from __future__ import annotations

import os

import pytest

import tests  # noqa: F401  (installs the fbgemm block first when LIGHTREC_BLOCK_FBGEMM=1)
from tests.devices import DEVICES


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest):  # noqa: ANN201 - torch.device
    """Each test that takes it runs on ``cpu`` and, marked ``gpu`` (``-m gpu``), on ``cuda``."""
    import torch

    return torch.device(request.param)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # noqa: ANN001, ANN201 - pytest's hook signature
    """Each test leaves the environment and the default process group as it found them.

    In-process fits (Lightning's launchers, ``init_process_group``) write ``MASTER_PORT``,
    ``LOCAL_RANK`` and friends into ``os.environ`` and keep a store listening on that port; a later
    test that launches ranks or ``lightrec run`` then inherits them and fails at rendezvous
    (EADDRINUSE on the inherited port, or a hang at "MEMBER: 1/2"). Restoring both after every test
    makes each test's outcome independent of the tests before it.

    This wraps the whole protocol (set-up, call, tear-down), not a per-test fixture: a module- or
    session-scoped fixture that runs a fit is set up before any function fixture, so a fixture could
    only snapshot the environment after that fit had already leaked into it (CI lost runs to that).
    Each test also gets its own ``STANDALONE_PORT``, below the ephemeral range.
    """
    import torch.distributed as dist

    from tests.multiprocess import free_port

    saved = dict(os.environ)
    had_group = dist.is_available() and dist.is_initialized()
    # Where Lightning picks the port itself (no MASTER_PORT: an in-process fit, a test's
    # subprocess), it takes STANDALONE_PORT instead of an OS-chosen one another socket can grab
    # before its store binds it. Children inherit it.
    os.environ["STANDALONE_PORT"] = str(free_port())
    yield
    if dist.is_available() and dist.is_initialized() and not had_group:
        dist.destroy_process_group()
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


def pytest_configure(config) -> None:  # noqa: ANN001
    import torch

    # Tests compare against references; one intra-op thread keeps CPU numerics and timings stable
    # on the 2-core CI machine while gloo ranks run side by side.
    torch.set_num_threads(1)
    # "auto" on CPU picks fbgemm or the native torch kernel by a measurement per machine
    # (lightrec.kernels.cpu_kernel_choice); the suite pins it so its expectations do not depend on
    # the machine (tests/kernels/test_cpu_update.py tests the measurement). Ranks inherit it.
    os.environ.setdefault("LIGHTREC_CPU_KERNEL", "fbgemm")


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
