"""Writer processes killed by SIGKILL: the process side of ``test_faults.py`` (run as a script).

``python -m tests.distributed.deltas.kill_writer points ROOT STRIDE [direct]``: writes a template folder
(v1-v3), then for k = 1, 1 + STRIDE, ... copies it to ``ROOT/k0001...`` and forks a writer that
adds v4 (delta + dense), v5 (snapshot; retention=1 then removes v1-v4) and v6 (delta), armed to
SIGKILL itself at its k-th file-system call (mkdir, write, ftruncate, fsync, rename, replace, unlink,
rmdir): with STRIDE 1 every step of a write, of LATEST and of retention is a kill point. ``direct``:
every file through ``O_DIRECT`` in 16 KiB blocks (what versions of 1 MiB and more take), so the kills
land between its block writes and before its truncation too. Stops at the first k the writer
outlives; prints ``{k: "killed" | exit code}`` as JSON.

``python -m tests.distributed.deltas.kill_writer loop DIR``: writes deltas (a snapshot every
fourth) into DIR until killed, printing "ready" once the writer is made.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lightrec.distributed.deltas import DeltaWriter, synced_write
from tests.distributed.deltas.helpers import SPECS, dense, full_rows, some_rows

CALLS = ("mkdir", "write", "ftruncate", "fsync", "rename", "replace", "unlink", "rmdir")


def template(folder: Path) -> None:
    writer = DeltaWriter(folder, SPECS, retention=1)
    writer.write_snapshot(full_rows(0), dense(0))
    writer.write_delta(some_rows(1))
    writer.write_delta(some_rows(2))


def more_writes(folder: Path, retention: int | None = 1) -> None:
    writer = DeltaWriter(folder, SPECS, retention=retention)
    writer.write_delta(some_rows(11), dense(11))
    writer.write_snapshot(full_rows(12), dense(12))
    writer.write_delta(some_rows(13))


def _arm(kill_at: int) -> None:
    count = [0]

    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            if count[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)

        return call

    for name in CALLS:
        setattr(os, name, wrap(getattr(os, name)))


def points(root: Path, stride: int = 1, limit: int = 500, direct: bool = False) -> dict[int, object]:
    template(root / "template")
    if direct:  # set after the template: only the killed writers write directly
        synced_write.DIRECT_MIN_BYTES, synced_write._CHUNK = 0, 4 * synced_write._BLOCK
    results: dict[int, object] = {}
    for k in range(1, limit, stride):
        target = root / f"k{k:04d}"
        shutil.copytree(root / "template", target)
        pid = os.fork()
        if pid == 0:  # the writer: killed at its k-th call, or done
            code = 1
            try:
                _arm(k)
                more_writes(target)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        results[k] = "killed" if killed else os.WEXITSTATUS(status)
        if not killed:
            break
    return results


def loop(folder: Path) -> None:
    writer = DeltaWriter(folder, SPECS, retention=2)
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        if writer.latest_snapshot is None or step % 4 == 0:
            writer.write_snapshot(full_rows(step), dense(step), global_step=step)
        else:
            writer.write_delta(some_rows(step), dense(step) if step % 2 else None, global_step=step)


if __name__ == "__main__":
    torch.set_num_threads(1)  # forked children must not wait on another process's OpenMP threads
    if sys.argv[1] == "points":
        print(json.dumps(points(Path(sys.argv[2]), int(sys.argv[3]), direct=sys.argv[4:] == ["direct"])))
    else:
        loop(Path(sys.argv[2]))
