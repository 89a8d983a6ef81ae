"""``lightrec serve <artifact>``: serve an exported artifact over HTTP with LitServe.

::

    lightrec serve lightning_logs/dlrm/version_0/export/model_int8.pt            # http://127.0.0.1:8000/predict
    lightrec serve model_int8.pt --workers 2 --max-batch-size 128 --batch-timeout-ms 5
    lightrec serve model_int8.pt --deltas published/ --host 0.0.0.0 --port 8080  # follow live deltas

Every option is a field of :class:`lightrec.serving.ServeConfig` (same names, same defaults). The
server runs until Ctrl+C or SIGTERM. LitServe is the optional ``serve`` extra: without it the
command says how to install it instead of failing on an import.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from pathlib import Path

from lightrec.cli.common import CommandError, UsageError, positive_int, reject_extra_arguments
from lightrec.serving.config import ServeConfig, ServeConfigError

__all__ = ["register", "run"]

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ServeConfig)}


def _devices(value: str) -> int | str:
    return "auto" if value == "auto" else positive_int(value)


def _positive_number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value!r}")
    return number


def _non_negative_number(value: str) -> float:
    return 0.0 if value in ("0", "0.0") else _positive_number(value)


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    d = _DEFAULTS
    parser: argparse.ArgumentParser = sub.add_parser(
        "serve", help="serve an exported artifact over HTTP (dynamic batching, live deltas)", allow_abbrev=False,
        description="Serve an artifact written by `lightrec export` at POST /predict, with /health, /ready, "
                    "/metrics (Prometheus) and /info. Requests and responses: docs/serving.md, 'Serve it'.",
    )
    parser.add_argument("artifact", help="the artifact (model_int8.pt, ...); its .meta.json must be beside it")
    parser.add_argument("--deltas", metavar="DIR", help="follow this publish folder: apply each new version live")
    parser.add_argument("--host", default=d["host"], help=f"address to bind (default {d['host']}: this machine "
                        "only; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=d["port"], help=f"TCP port (default {d['port']})")
    parser.add_argument("--accelerator", choices=["auto", "cpu", "cuda"], default=d["accelerator"])
    parser.add_argument("--devices", type=_devices, default=d["devices"], help="devices to serve on (default auto)")
    parser.add_argument("--workers", type=positive_int, default=d["workers_per_device"],
                        help=f"worker processes per device, each with a copy of the model (default {d['workers_per_device']})")
    parser.add_argument("--max-batch-size", type=positive_int, default=d["max_batch_size"],
                        help=f"requests joined into one forward (default {d['max_batch_size']})")
    parser.add_argument("--batch-timeout-ms", type=_non_negative_number, default=d["batch_timeout_ms"],
                        help=f"wait for a batch to fill at most this long (default {d['batch_timeout_ms']})")
    parser.add_argument("--max-queue", type=positive_int, default=d["max_queue"],
                        help=f"requests in flight above which new ones get 503 (default {d['max_queue']})")
    parser.add_argument("--max-payload-mb", type=_positive_number, default=d["max_payload_mb"],
                        help=f"largest request body in MiB (default {d['max_payload_mb']:g})")
    parser.add_argument("--max-samples", type=positive_int, default=d["max_samples_per_request"],
                        help=f"most samples in one request (default {d['max_samples_per_request']})")
    parser.add_argument("--follow-interval", type=_positive_number, default=d["follow_interval_s"],
                        help=f"seconds between looks at --deltas (default {d['follow_interval_s']:g})")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads per CPU worker (default 1: add --workers to use more cores)")
    parser.add_argument("--missing-features", choices=["empty", "error"], default=d["missing_features"],
                        help="a feature left out of a request: no ids (empty, default) or a 422 (error)")
    parser.add_argument("--timeout", type=_positive_number, default=d["timeout_s"],
                        help=f"a request waiting longer for a worker gets 504 (seconds, default {d['timeout_s']:g})")
    parser.add_argument("--api-servers", type=positive_int, default=None,
                        help="HTTP server processes (default: one per worker)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=d["log_level"])
    return parser


def run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    reject_extra_arguments(rest, parser)
    if importlib.util.find_spec("litserve") is None:
        raise CommandError("`lightrec serve` runs on LitServe, which is not installed: pip install \"lightrec[serve]\"")
    from lightrec.serving.server import serve  # imports LitServe: only for this command

    config = ServeConfig(
        artifact=Path(ns.artifact), deltas=Path(ns.deltas) if ns.deltas else None, host=ns.host, port=ns.port,
        accelerator=ns.accelerator, devices=ns.devices, workers_per_device=ns.workers,
        max_batch_size=ns.max_batch_size, batch_timeout_ms=ns.batch_timeout_ms, max_queue=ns.max_queue,
        max_payload_mb=ns.max_payload_mb, max_samples_per_request=ns.max_samples,
        follow_interval_s=ns.follow_interval, threads_per_worker=ns.threads, missing_features=ns.missing_features,
        timeout_s=ns.timeout, api_servers=ns.api_servers, log_level=ns.log_level,
    )  # fmt: skip
    try:
        serve(config)
    except ServeConfigError as exc:
        raise UsageError(str(exc)) from exc
    except RuntimeError as exc:  # LitServe: "One or more workers failed to start" (their traceback is logged above)
        raise CommandError(f"{exc}; the worker's traceback is above") from exc
    return 0
