"""Run a test body on N real gloo ranks (separate processes) and collect each rank's result.

Usage::

    def _body(rank: int, world_size: int, x: int) -> dict:
        # torch.distributed is initialised (gloo) here
        ...
        return {"out": tensor}            # anything picklable

    results = run_ranks(_body, world_size=2, args=(3,))   # list indexed by rank

The body must be a module-level function (it is pickled into the rank processes). An exception
on any rank is re-raised in the test with that rank's traceback; a rank that hangs fails the test
after ``timeout`` seconds instead of blocking CI.

Gloo ranks are forked from a forkserver that imported torch and Lightning once per test session
(``_PRELOAD``), not spawned: a fresh interpreter's imports were most of a 2-rank test's time (the
default suite took 26:54 spawned, 15:40 forked, on the same 2-core VM). Each rank then installs the
test's environment (``os.environ`` as it is when ``run_ranks`` is called; multiprocessing itself sends
the working folder and ``sys.path``) and writes to the test's stdout and stderr, as a spawned rank
would, before it imports lightrec (``tests/test_multiprocess_harness.py``).

``backend="nccl"`` runs the ranks on GPUs (rank r on ``cuda:r``); :func:`run_nccl` is the one-GPU
case, an NCCL group of size 1, which is how the ``gpu`` tests exercise the NCCL code paths on a
single-GPU machine.

Ports: the process groups here rendezvous through a file in a fresh temporary directory, never a
port; the tests that let Lightning or a launched command bind ``MASTER_PORT`` take it from
:func:`free_port`, which hands out ports below Linux's ephemeral range, where no OS-chosen port (an
outgoing connection's, or another ``bind(0)``'s) can take it between the check and the bind, and
gives every xdist worker its own range. ``tests/conftest.py`` also sets Lightning's
``STANDALONE_PORT`` to such a port for each test, so a fit that picks its own port does too.
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

# Worker N of ``pytest -n`` draws ports from [_BASE + N * _SPAN, _BASE + (N + 1) * _SPAN) (a run
# without xdist is worker 0): below Linux's ephemeral range (32768-60999), where the OS picks ports
# for ``bind(0)`` and outgoing connections, so no two workers, and no OS-chosen port, can be handed
# the same number. A port the OS picked is only free "a moment ago": CI once lost a fit to
# EADDRINUSE because another socket took Lightning's ``bind(0)`` port before its store bound it.
_BASE, _SPAN = 10_000, 500
# Two pytest sessions on one machine (a developer's and CI's) start at different offsets.
_next_offset = os.getpid() % _SPAN


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def set_torchrun_env(rank: int, world_size: int, port: int) -> None:
    """Give this process the environment ``torchrun`` gives a rank on one node (127.0.0.1:``port``),
    so Lightning's strategies create the process group themselves."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), NODE_RANK="0",
    )  # fmt: skip


def free_port() -> int:
    """A TCP port nothing listens on, for ``MASTER_PORT``; distinct across xdist workers."""
    global _next_offset
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # "gw0", "gw1", ... under pytest -n
    if worker.startswith("gw") and worker[2:].isdigit() and int(worker[2:]) < (32_768 - _BASE) // _SPAN:
        start = _BASE + int(worker[2:]) * _SPAN
        for _ in range(_SPAN):
            port = start + _next_offset % _SPAN
            _next_offset += 1  # never hand out the same port twice in a worker
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_where_the_test_writes(parent: int) -> None:
    """Point this rank's stdout and stderr at the test process's current ones (pytest's capture of the running
    test), as a spawned child's would be: a forkserver child inherits the server's, captured for whichever
    test started the server. Appending, so the capture file's earlier contents stay."""
    for fd in (1, 2):
        try:
            current = os.open(f"/proc/{parent}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
        except OSError:  # not Linux, or the descriptor is gone: keep the inherited one
            continue
        os.dup2(current, fd)
        os.close(current)


def _worker(
    rank: int,
    world_size: int,
    init_file: str,
    fn: Callable[..., Any],
    args: tuple,
    queue: Any,
    timeout_s: float,
    backend: str = "gloo",
    environ: dict[str, str] | None = None,
    parent: int | None = None,
) -> None:
    if environ is not None:  # a forkserver child starts with the server's environment, not the test's
        os.environ.clear()
        os.environ.update(environ)
    if parent is not None:
        _write_where_the_test_writes(parent)
    if os.environ.get("LIGHTREC_BLOCK_FBGEMM", "") not in ("", "0"):
        from tests.fbgemm_block import install_fbgemm_block

        install_fbgemm_block()
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
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


# What every rank imports before its body runs: torch and Lightning are ~4 s of a fresh interpreter's
# start on the 2-core CI machine (lightrec itself and fbgemm_gpu ~1 s more). A forkserver imports them
# once per test session and forks each rank from that warm process, so a 2-rank test no longer pays
# them twice. Not lightrec or fbgemm_gpu: they read switches when imported (``LIGHTREC_BLOCK_FBGEMM``
# must block fbgemm before anything imports it), so each rank imports them under the test's own
# environment, which ``_worker`` installs first. The server imports nothing else and runs nothing, so
# forking it after the imports is safe (torch starts no thread and touches no device until used).
_PRELOAD = ["torch", "torch.distributed", "lightning.pytorch"]


def _context(backend: str) -> Any:
    """The multiprocessing context of the ranks: a forkserver with :data:`_PRELOAD` imported for gloo, spawn for
    NCCL (CUDA in a child of a long-lived server is one more thing to get wrong, and the GPU tests are few)."""
    if backend != "gloo":
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)  # read when the one server of the session starts; a no-op after
    return context


def run_ranks(
    fn: Callable[..., Any], world_size: int, args: tuple = (), timeout: float = 120.0, backend: str = "gloo"
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks of ``backend`` ("gloo" on CPU,
    "nccl" on GPUs, rank r on ``cuda:r``); return results by rank (tensors as the ranks made them)."""
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise RuntimeError(
            f"run_ranks(backend='nccl') needs {world_size} CUDA device(s), found {torch.cuda.device_count()}"
        )
    ctx = _context(backend)
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "pg_init")
        procs = [
            ctx.Process(
                target=_worker,
                args=(r, world_size, init_file, fn, args, queue, timeout, backend, dict(os.environ), os.getpid()),
                daemon=True,
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


def run_nccl(fn: Callable[..., Any], args: tuple = (), timeout: float = 180.0) -> Any:
    """Run ``fn(0, 1, *args)`` in one process holding an NCCL group of size 1 on ``cuda:0``.

    The single-GPU form of the distributed tests: every collective of the sharded code runs through
    NCCL (on CUDA tensors) with one rank. Returns the body's result.
    """
    return run_ranks(fn, 1, args=args, timeout=timeout, backend="nccl")[0]
