"""Build and run a ``lightrec serve`` server: LitServe around :class:`~lightrec.serving.api.RecServingAPI`.

::

    from lightrec.serving import ServeConfig
    from lightrec.serving.server import serve

    serve(ServeConfig("model_int8.pt", port=8000, workers_per_device=2))   # blocks; Ctrl+C or SIGTERM stops it

The processes of one server (LitServe's layout)::

    main process        this function: checks the options, then waits; SIGTERM/Ctrl+C shut all down
    HTTP servers        ``api_servers`` forked uvicorn processes on one socket: admission (401/413/408/503),
                        then the raw body of a /predict request to the workers (PredictDispatch; 504
                        when none answers within ``timeout_s``);
                        /health /ready /metrics /info
    inference workers   devices x ``workers_per_device`` spawned processes, each with its own copy of the
                        model (RecServingAPI.setup); requests reach them through one pipe, answers
                        go back through one pipe per HTTP server (transport.py); each parses,
                        validates and scores them in batches of up to ``max_batch_size`` requests
                        (scoring_loop.py)

Options are checked (:meth:`ServeConfig.check`) before any process starts, so a typo in a path or a
port fails in a second with a message instead of in a worker's log.
"""

from __future__ import annotations

import errno
import gc
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import TypedDict

import litserve as ls
import litserve.server
import torch

from lightrec.inference.export import ArtifactMeta, TableMeta
from lightrec.serving.admission import AdmissionGate, AdmissionMiddleware
from lightrec.serving.api import PREDICT_PATH, RecServingAPI
from lightrec.serving.config import ServeConfig, ServeConfigError
from lightrec.serving.endpoints import add_endpoints
from lightrec.serving.metrics import ServingMetrics
from lightrec.serving.model_updates import delta_updater_factory
from lightrec.serving.served_model import UpdaterFactory
from lightrec.serving.transport import PipeQueueServer, PredictDispatch

__all__ = ["BuiltServer", "build_server", "serve"]

log = logging.getLogger(__name__)


@dataclass
class BuiltServer:
    """A LitServe server ready to ``run``, with what ``run`` needs to know about it."""

    server: ls.LitServer
    config: ServeConfig
    api_servers: int
    workers: int
    metrics: ServingMetrics
    gate: AdmissionGate

    def run(self) -> None:
        """Serve until Ctrl+C, SIGTERM or a worker's death (LitServe then shuts every process down)."""
        gc.freeze()  # what is loaded so far: the forked HTTP servers never scan it (no collection pauses over it)
        previous = signal.signal(signal.SIGTERM, _interrupt_in(os.getpid()))  # LitServe's Ctrl+C shutdown path
        try:
            self.server.run(host=self.config.host, port=self.config.port, num_api_servers=self.api_servers,
                            log_level=self.config.log_level, generate_client_file=False)
        except KeyboardInterrupt:
            pass  # interrupted while the workers were starting: LitServe has not shut them down
        finally:
            signal.signal(signal.SIGTERM, previous)
            _stop(multiprocessing.active_children(), grace_s=5.0)  # the processes this server started, if any is left


def _stop(children: list[multiprocessing.process.BaseProcess], grace_s: float) -> None:
    """SIGTERM ``children``, then SIGKILL any still alive ``grace_s`` seconds later (a worker stuck in a forward,
    or one that ignores SIGTERM, must not outlive the server)."""
    for child in children:
        child.terminate()
    deadline = time.monotonic() + grace_s
    for child in children:
        child.join(max(deadline - time.monotonic(), 0.0))
        if child.is_alive():
            child.kill()
            child.join(5)


def _interrupt_in(owner: int) -> Callable[[int, FrameType | None], None]:
    """A SIGTERM handler: Ctrl+C in the server's main process; in the HTTP server processes forked from
    it (which inherit it, and re-raise SIGTERM once uvicorn has shut down) a quiet exit."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() == owner:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    return handler


def build_server(config: ServeConfig, updater_factory: UpdaterFactory | None = None) -> BuiltServer:
    """Check ``config`` and build the server (nothing starts until :meth:`BuiltServer.run`).

    Args:
        config: the options.
        updater_factory: builds each worker's updater (a test's fake, your own source of versions);
            ``config.deltas`` builds the one of ``lightrec.serving.deltas``. Give one or the other.

    Raises:
        ServeConfigError: an option or the artifact is unusable.
    """
    meta = config.check()
    if config.deltas is not None:
        if updater_factory is not None:
            raise ServeConfigError("give either deltas (a publish folder) or an updater_factory, not both")
        updater_factory = delta_updater_factory(config.deltas)
    gpus = torch.cuda.device_count() if config.accelerator != "cpu" else 0  # counts without initializing CUDA
    accelerator = config.resolved_accelerator(gpus)
    if accelerator == "cuda" and gpus == 0:
        raise ServeConfigError("--accelerator cuda but no GPU is visible; use --accelerator cpu")
    workers = config.worker_count(gpus)
    api_servers = config.api_servers or workers
    metrics = ServingMetrics(api_servers, workers)
    gate = AdmissionGate(config.max_queue, config.max_queue_bytes)
    threads = config.cpu_threads() if accelerator == "cpu" else None
    api = RecServingAPI(config, metrics, updater_factory, threads)
    devices: int | str = 1 if accelerator == "cpu" else (gpus if config.devices == "auto" else int(config.devices))
    dispatch = PredictDispatch(PREDICT_PATH, config.timeout_s)
    admission = {"path": PREDICT_PATH, "gate": gate, "metrics": metrics, "max_payload_bytes": config.max_payload_bytes,
                 "body_timeout_s": config.body_timeout_s, "dispatch": dispatch,
                 "api_key": litserve.server.LIT_SERVER_API_KEY}  # LitServe reads its variable once, at import
    server = PipeQueueServer(api, accelerator=accelerator, devices=devices,
                             workers_per_device=config.workers_per_device, timeout=config.timeout_s,
                             model_metadata=_model_info(config, meta), middlewares=[(AdmissionMiddleware, admission)])
    dispatch.bind(server)
    add_endpoints(server.app, metrics, gate, auth=server.setup_auth())  # LitServe's key check, as on /health
    return BuiltServer(server, config, api_servers, workers, metrics, gate)


def serve(config: ServeConfig, updater_factory: UpdaterFactory | None = None) -> None:
    """Build the server and run it until it is stopped (see :func:`build_server` for the arguments)."""
    built = build_server(config, updater_factory)
    check_port_free(config.host, config.port)
    host = f"[{config.host}]" if ":" in config.host else config.host
    print(f"lightrec serve: {config.artifact} at http://{host}:{config.port}{PREDICT_PATH} ({built.workers} "
          f"worker(s), batches of <= {config.max_batch_size} requests / {config.batch_timeout_ms:g} ms"
          + (f", following {config.deltas}" if config.deltas else "") + "); GET /health /ready /metrics /info",
          file=sys.stderr, flush=True)
    built.run()


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`ServeConfigError` naming ``--port`` when ``host:port`` cannot be bound now.

    Without it a busy port is found by uvicorn, after the banner and the workers' start: an
    ``Address already in use`` in a log and exit code 3 instead of a usage error. The probe binds as
    uvicorn does (``SO_REUSEADDR``: a port in ``TIME_WAIT`` is free) and closes at once; a process
    taking the port between the probe and uvicorn's bind still meets uvicorn's error.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            busy = exc.errno == errno.EADDRINUSE
            reason = "is in use by another process" if busy else f"cannot be bound ({exc.strerror or exc})"
            raise ServeConfigError(
                f"--port {port}: {host}:{port} {reason}; stop that server or give another --port"
            ) from exc


class ModelInfo(TypedDict):
    """The body of ``GET /info``."""

    artifact: str
    format: str | None
    feature_names: list[str]
    dense_in_features: int | None
    is_weighted: bool
    tables: list[dict[str, object]]
    deltas: str | None


def _rows(tables: list[TableMeta]) -> list[Mapping[str, object]]:
    return list(tables)


def _model_info(config: ServeConfig, meta: ArtifactMeta) -> ModelInfo:
    """What ``GET /info`` says about the model: enough for a client to build requests."""
    keys = ("name", "num_embeddings", "embedding_dim", "feature_names", "data_type", "id_space")
    return {
        "artifact": str(config.artifact),
        "format": meta.get("format"),
        "feature_names": meta["feature_names"],
        "dense_in_features": meta.get("dense_in_features") if meta.get("takes_dense", True) else 0,
        "is_weighted": bool(meta.get("is_weighted", False)),
        "tables": [{k: row[k] for k in keys if k in row} for row in _rows(meta["tables"])],
        "deltas": str(config.deltas) if config.deltas is not None else None,
    }
