"""One rank of a job launched like ``torchrun`` (for ``tests/lightning/test_rank_failure._launch``).

``RecStrategy`` then creates the process group itself, with the test's timeout. The outcome goes to
the launcher's queue as ``(rank, "finished" | "raised", text, time.monotonic())``.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

from tests.multiprocess import set_torchrun_env


def run_as_torchrun_rank(
    rank: int, world_size: int, port: int, reports: Any, body: Callable[[], str]
) -> None:
    """Set torchrun's environment, run ``body()`` (its return value is the report's text), report."""
    set_torchrun_env(rank, world_size, port)
    try:
        import torch

        torch.set_num_threads(1)
        reports.put((rank, "finished", body(), time.monotonic()))
    except BaseException as exc:  # noqa: BLE001 - the parent checks what each rank raised
        reports.put(
            (rank, "raised", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", time.monotonic())
        )
