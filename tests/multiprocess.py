"""Run a test body on N real gloo ranks (separate processes) and collect each rank's result.

Usage::

    def _body(rank: int, world_size: int, x: int) -> dict:
        # torch.distributed is initialised (gloo) here
        ...
        return {"out": tensor}            # anything picklable

    results = run_ranks(_body, world_size=2, args=(3,))   # list indexed by rank

The body must be a module-level function (it is pickled into spawned processes). An exception
on any rank is re-raised in the test with that rank's traceback; a rank that hangs fails the test
after ``timeout`` seconds instead of blocking CI.
"""

from __future__ import annotations

import io
import os
import socket
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    rank: int,
    world_size: int,
    init_file: str,
    fn: Callable[..., Any],
    args: tuple,
    queue: Any,
    timeout_s: float,
) -> None:
    if os.environ.get("LIGHTREC_BLOCK_FBGEMM", "") not in ("", "0"):
        from tests.fbgemm_block import install_fbgemm_block

        install_fbgemm_block()
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        result = fn(rank, world_size, *args)
        # Serialise to bytes: tensors sent through the queue live in shared memory that can vanish
        # when this process exits before the parent reads them.
        buffer = io.BytesIO()
        torch.save(result, buffer)
        queue.put((rank, "ok", buffer.getvalue()))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(
    fn: Callable[..., Any], world_size: int, args: tuple = (), timeout: float = 120.0
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return results by rank."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "pg_init")
        procs = [
            ctx.Process(
                target=_worker, args=(r, world_size, init_file, fn, args, queue, timeout), daemon=True
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        errors: list[str] = []
        try:
            for _ in range(world_size):
                rank, status, payload = queue.get(timeout=timeout + 30)
                if status == "ok":
                    results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
                else:
                    errors.append(f"--- rank {rank} ---\n{payload}")
                    break
        except Exception as exc:  # queue.Empty: a rank hung or died without reporting
            errors.append(f"ranks did not report within {timeout + 30:.0f}s: {exc!r}")
        finally:
            for p in procs:
                p.join(timeout=5 if errors else 30)
                if p.is_alive():
                    p.kill()
        if errors:
            raise AssertionError("distributed test failed:\n" + "\n".join(errors))
    return [results[r] for r in range(world_size)]
