"""What the server does last: processes it started that are still there get SIGTERM, and SIGKILL once the
grace period has passed (a worker that ignores SIGTERM, or is stuck, used to outlive the server)."""

from __future__ import annotations

import multiprocessing
import signal
import time
from multiprocessing.synchronize import Event

import pytest

pytest.importorskip("litserve")
from lightrec.serving.server import _stop  # noqa: E402 - needs LitServe


def _ignores_sigterm(ready: Event) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


def test_processes_left_are_terminated_then_killed_after_the_grace_period() -> None:
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    stubborn = context.Process(target=_ignores_sigterm, args=(ready,), daemon=True)
    polite = context.Process(target=time.sleep, args=(60,), daemon=True)
    stubborn.start()
    polite.start()
    assert ready.wait(10)
    start = time.monotonic()
    _stop([stubborn, polite], grace_s=0.5)
    assert not stubborn.is_alive() and not polite.is_alive()
    assert (stubborn.exitcode, polite.exitcode) == (-signal.SIGKILL, -signal.SIGTERM)
    assert time.monotonic() - start < 5
