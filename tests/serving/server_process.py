"""Real servers for the serving tests: started as processes on 127.0.0.1, always torn down.

:func:`running_server` starts a command (``lightrec serve ...``, or this file as a script, which
serves with a fake updater), waits until ``/health`` answers 200 and yields the base URL. On the
way out it sends SIGTERM (LitServe's graceful shutdown), waits, then kills what is left of the
process group it created -- the HTTP servers, the workers and LitServe's manager included -- so a
failed test leaves no process behind. Every wait is bounded.

As a script::

    python tests/serving/server_process.py ARTIFACT --port P [--updates DIR] [--max-queue N] [--timeout S] ...

builds the same server as ``lightrec serve`` through :func:`lightrec.serving.server.serve`, with
the folder updater of ``tests/serving/fake_updates.py`` when ``--updates`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240.0  # server start-up on a loaded 2-core machine (imports, worker spawn, model load)


class ServerURL(str):
    """The base URL of a server :func:`running_server` started (a ``str``); ``pid`` is its main
    process, the leader of the session that holds every process of the server."""

    pid: int


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_server(command: list[str], port: int, log: Path, start_timeout_s: float = START_TIMEOUT_S,
                   env: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> Iterator[ServerURL]:
    """Run ``command`` (a server on ``127.0.0.1:port``) until the block ends; yield its base URL.

    ``env``: variables added to the server's environment; ``headers``: sent with the ``/health`` polls
    (``X-API-Key`` for a server started with ``LIT_SERVER_API_KEY``).
    """
    import requests

    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    url = ServerURL(f"http://127.0.0.1:{port}")
    url.pid = process.pid
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode} before it was healthy:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not healthy after {start_timeout_s:.0f} s:\n{_tail(log)}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/health", headers=headers, timeout=2).status_code == 200:
                    break
            time.sleep(0.25)
        yield url
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """SIGTERM the server, then SIGKILL its whole process group (which this module created)."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"


def serve_command(artifact: Path, port: int, *options: str) -> list[str]:
    """``lightrec serve`` as the console script runs it (``python -m lightrec.cli``), one torch thread
    (the tests compare with a one-thread ``Predictor``)."""
    return [sys.executable, "-m", "lightrec.cli", "serve", str(artifact), "--port", str(port), "--threads", "1",
            *options]


def script_command(artifact: Path, port: int, *options: str) -> list[str]:
    """This file as a server with the fake updater (options as in ``main``)."""
    return [sys.executable, str(Path(__file__).resolve()), str(artifact), "--port", str(port), *options]


def main() -> None:
    from lightrec.serving import ServeConfig
    from lightrec.serving.server import serve
    from tests.serving.fake_updates import open_fake_updater

    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--updates")
    parser.add_argument("--max-queue", type=int, default=512)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--follow-interval", type=float, default=0.2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-queue-mb", type=float, default=ServeConfig.max_queue_mb)
    parser.add_argument("--max-payload-mb", type=float, default=ServeConfig.max_payload_mb)
    parser.add_argument("--timeout", type=float, default=ServeConfig.timeout_s)
    args = parser.parse_args()
    config = ServeConfig(Path(args.artifact), port=args.port, accelerator="cpu", threads_per_worker=1,
                         max_queue=args.max_queue, max_batch_size=args.max_batch_size,
                         follow_interval_s=args.follow_interval, workers_per_device=args.workers,
                         max_queue_mb=args.max_queue_mb, max_payload_mb=args.max_payload_mb,
                         timeout_s=args.timeout)  # fmt: skip
    factory = functools.partial(open_fake_updater, args.updates) if args.updates else None
    serve(config, updater_factory=factory)


if __name__ == "__main__":
    main()
