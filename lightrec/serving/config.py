"""What a ``lightrec serve`` server is built from: :class:`ServeConfig`, checked once, up front.

Every option of the command is a field here (``lightrec serve --help`` shows the same defaults),
so the command, the Python builder (:func:`lightrec.serving.server.build_server`) and the tests
start servers the same way. :meth:`ServeConfig.check` refuses a bad value with a
:class:`ServeConfigError` naming the option, the value and the fix -- before any process starts.
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightrec.inference.export import ArtifactMeta

__all__ = ["ServeConfig", "ServeConfigError"]

_HOSTS = ("127.0.0.1", "0.0.0.0", "::")  # what LitServe binds


class ServeConfigError(ValueError):
    """An option of the server cannot work (the message names it and says what to do)."""


@dataclass(frozen=True)
class ServeConfig:
    """The options of one server.

    Attributes:
        artifact: the exported artifact (``lightrec export`` / ``QuantizedExport`` / ``inference.export``),
            with its ``<artifact>.meta.json`` beside it.
        deltas: a publish folder to follow (live deltas, applied between batches); None: serve the artifact as is.
        host: the address to bind: ``127.0.0.1`` (this machine only, the default), ``0.0.0.0`` or ``::`` (all).
        port: the TCP port.
        accelerator: ``"auto"``, ``"cpu"`` or ``"cuda"`` (LitServe's choice of device type).
        devices: number of devices (``"auto"``: every GPU; one for CPU).
        workers_per_device: inference worker processes per device, each with its own copy of the model.
        max_batch_size: requests joined into one forward at most (a request may hold many samples).
        batch_timeout_ms: how long a worker waits, after a batch's first request, for more before it
            scores what it has. 0 (the default): it scores what is queued the moment it is free, and
            the next batch forms while this one is scored -- on CPU the fastest at every load measured
            (a worker that waits idles while the requests it holds back are what clients wait on);
            a GPU, whose forward costs about the same for 1 or 64 samples, may gain from a few ms.
        max_queue: requests in flight (admitted, not answered) above which new ones get 503 + ``Retry-After``.
            A request takes its place once its whole body has arrived: clients still sending hold none.
        max_queue_mb: MiB of request bodies in flight (admitted, not answered) above which new ones get
            503 + ``Retry-After``, as for ``max_queue``: what waits in front of the workers stays bounded
            in bytes too (``max_queue`` bodies of ``max_payload_mb`` could be GiBs). At least ``max_payload_mb``.
        body_timeout_s: seconds a client may take to send a ``/predict`` body (from the request's arrival);
            slower: 408, and the connection is closed.
        max_payload_mb: the largest request body, in MiB (larger: 413).
        max_samples_per_request: the most samples one request may carry (more: 413).
        follow_interval_s: seconds between two looks at ``deltas`` for a new version.
        threads_per_worker: torch intra-op threads of each CPU worker (None: 1 -- a batch of a few dozen
            samples gains nothing from more, and threads of several workers on shared cores wait for
            each other at every parallel region; scale with ``workers_per_device`` instead).
        missing_features: ``"empty"`` (a feature left out has no ids) or ``"error"`` (422).
        timeout_s: seconds a request may take from being queued for the workers to its answer; later: 504
            (the HTTP server stops waiting for a worker that hangs; a worker that takes the request
            later answers it 504 unscored).
        api_servers: HTTP server processes (None: one per worker, LitServe's default).
        log_level: the server's logging level (``"warning"``, ``"info"``, ``"debug"``).
    """

    artifact: Path
    deltas: Path | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    accelerator: str = "auto"
    devices: int | str = "auto"
    workers_per_device: int = 1
    max_batch_size: int = 64
    batch_timeout_ms: float = 0.0
    max_queue: int = 512
    max_queue_mb: float = 256.0
    body_timeout_s: float = 10.0
    max_payload_mb: float = 8.0
    max_samples_per_request: int = 4096
    follow_interval_s: float = 1.0
    threads_per_worker: int | None = None
    missing_features: str = "empty"
    timeout_s: float = 30.0
    api_servers: int | None = None
    log_level: str = "warning"

    @property
    def max_payload_bytes(self) -> int:
        return int(self.max_payload_mb * 2**20)

    @property
    def max_queue_bytes(self) -> int:
        return int(self.max_queue_mb * 2**20)

    def check(self) -> ArtifactMeta:
        """Check every option and the artifact's files; return the artifact's metadata.

        Raises:
            ServeConfigError: an option or the artifact is unusable (the message says what to do).
        """
        artifact = Path(self.artifact)
        meta_path = Path(f"{artifact}.meta.json")
        if not artifact.is_file():
            raise ServeConfigError(f"the artifact {str(artifact)!r} does not exist; write one with `lightrec export "
                                   "<checkpoint>` (a recipe run writes <log dir>/export/model_int8.pt)")
        if not meta_path.is_file():
            raise ServeConfigError(f"{str(meta_path)!r} is missing: serve an artifact written by lightrec's export, "
                                   "which writes its metadata beside it")
        try:
            meta: ArtifactMeta = json.loads(meta_path.read_text())
            _ = meta["feature_names"], meta["tables"], meta["format"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ServeConfigError(f"{str(meta_path)!r} is not an artifact's metadata ({exc}); re-export the model") from exc
        if self.deltas is not None and not Path(self.deltas).is_dir():
            raise ServeConfigError(f"--deltas {str(self.deltas)!r} is not a folder; give the folder training publishes "
                                   "versions to (it may still be empty)")
        if self.deltas is not None and meta["format"] == "torchscript" and _has_packed_dense_layers(artifact):
            raise ServeConfigError(
                f"--deltas {str(self.deltas)!r}: the artifact {str(artifact)!r} holds dynamic int8 dense layers "
                "(exported with quantize_dense=True), whose weights are packed where a published version cannot be "
                "written: every version would be refused. Re-export it with quantize_dense=False (its tables stay "
                "quantized), or serve it without --deltas")
        if self.host not in _HOSTS:
            raise ServeConfigError(f"--host {self.host!r}: give 127.0.0.1 (this machine), 0.0.0.0 or :: (all "
                                   "interfaces; put the server behind a firewall or load balancer)")
        if not 1024 <= self.port <= 65535:
            raise ServeConfigError(f"--port {self.port}: give a port in [1024, 65535]")
        if self.accelerator not in ("auto", "cpu", "cuda"):
            raise ServeConfigError(f"--accelerator {self.accelerator!r}: give auto, cpu or cuda")
        if self.devices != "auto" and not (isinstance(self.devices, int) and self.devices >= 1):
            raise ServeConfigError(f"--devices {self.devices!r}: give a positive number of devices or 'auto'")
        if self.missing_features not in ("empty", "error"):
            raise ServeConfigError(f"--missing-features {self.missing_features!r}: give empty or error")
        counts = {"workers": self.workers_per_device, "max-batch-size": self.max_batch_size,
                  "max-queue": self.max_queue, "max-samples": self.max_samples_per_request,
                  "threads": self.threads_per_worker, "api-servers": self.api_servers}
        for name, count in counts.items():
            if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
                raise ServeConfigError(f"--{name} {count!r}: give an integer >= 1")
        spans = {"batch-timeout-ms": self.batch_timeout_ms, "max-payload-mb": self.max_payload_mb,
                 "max-queue-mb": self.max_queue_mb,
                 "follow-interval": self.follow_interval_s, "timeout": self.timeout_s,
                 "body-timeout": self.body_timeout_s}
        for name, span in spans.items():
            # finite too: inf MiB overflows the byte count, and a thread waiting inf seconds never wakes
            if isinstance(span, bool) or not isinstance(span, (int, float)) or not math.isfinite(span) or span < 0 or (
                    name != "batch-timeout-ms" and span == 0):
                raise ServeConfigError(f"--{name} {span!r}: give a finite positive number"
                                       + (" (or 0)" if name == "batch-timeout-ms" else ""))
        if self.max_queue_mb < self.max_payload_mb:
            raise ServeConfigError(f"--max-queue-mb {self.max_queue_mb:g} is below --max-payload-mb "
                                   f"{self.max_payload_mb:g}: a body of the largest size accepted could never be "
                                   "admitted; raise --max-queue-mb or lower --max-payload-mb")
        if self.batch_timeout_ms / 1000 >= self.timeout_s:
            raise ServeConfigError(f"--batch-timeout-ms {self.batch_timeout_ms} must stay below --timeout "
                                   f"{self.timeout_s} s")
        return meta

    def worker_count(self, gpus: int) -> int:
        """Inference workers the server starts: devices x workers per device (``gpus`` when ``devices`` is 'auto')."""
        devices = 1 if self.resolved_accelerator(gpus) == "cpu" else (gpus if self.devices == "auto" else int(self.devices))
        return max(1, devices) * self.workers_per_device

    def resolved_accelerator(self, gpus: int) -> str:
        """``cpu`` or ``cuda``: ``auto`` picks CUDA when a GPU is visible."""
        if self.accelerator == "auto":
            return "cuda" if gpus > 0 else "cpu"
        return self.accelerator

    def cpu_threads(self) -> int:
        """Intra-op threads of each CPU worker: the option, else 1 (see ``threads_per_worker``)."""
        return self.threads_per_worker if self.threads_per_worker is not None else 1


def _has_packed_dense_layers(artifact: Path) -> bool:
    """Whether a TorchScript artifact holds packed (dynamic int8) Linear layers: their weights are
    ``LinearPackedParams`` objects, not tensors a delta can be written into.

    A TorchScript file is a zip whose ``data.pkl`` (the module tree; tensors are separate entries,
    so it stays small) names every module's class. An exported program (``.pt2``) cannot hold such
    layers (``export`` refuses them); a file that is no zip is left to the loader to refuse.
    """
    try:
        with zipfile.ZipFile(artifact) as archive:
            return any(name.endswith("/data.pkl") and b"LinearPackedParams" in archive.read(name)
                       for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
