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
import contextlib
import dataclasses
import importlib.util
import math
from collections.abc import Callable
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
    if not (number > 0 and math.isfinite(number)):  # inf: an overflowing byte count, a wait that never ends
        raise argparse.ArgumentTypeError(f"must be a finite positive number such as 2.5, got {value!r}")
    return number


def _non_negative_number(value: str) -> float:
    with contextlib.suppress(ValueError):
        if float(value) == 0:  # any spelling of zero: 0.00, 0e0, -0
            return 0.0
    try:
        return _positive_number(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be 0 or a finite positive number such as 2.5, got {value!r}") from None


# The numeric settings: (option, ServeConfig field, argument type, help before its "(default ...)").
_TUNING: tuple[tuple[str, str, Callable[[str], float], str], ...] = (
    ("--workers", "workers_per_device", positive_int, "worker processes per device, each with a copy of the model"),
    ("--max-batch-size", "max_batch_size", positive_int, "requests joined into one forward"),
    ("--batch-timeout-ms", "batch_timeout_ms", _non_negative_number,
     "after a batch's first request, wait this long for more (0: score what is queued at once)"),
    ("--max-queue", "max_queue", positive_int, "requests in flight above which new ones get 503"),
    ("--max-queue-mb", "max_queue_mb", _positive_number, "MiB of request bodies in flight above which new ones "
     "get 503"),
    ("--body-timeout", "body_timeout_s", _positive_number, "a request body not sent in full within this many "
     "seconds gets 408"),
    ("--max-payload-mb", "max_payload_mb", _positive_number, "largest request body in MiB"),
    ("--max-samples", "max_samples_per_request", positive_int, "most samples in one request"),
    ("--follow-interval", "follow_interval_s", _positive_number, "seconds between looks at --deltas"),
    ("--timeout", "timeout_s", _positive_number, "a request not answered this many seconds after it was queued "
     "for the workers gets 504"),
)


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
    for flag, field, kind, text in _TUNING:
        parser.add_argument(flag, dest=field, metavar=flag[2:].upper().replace("-", "_"), type=kind, default=d[field],
                            help=f"{text} (default {d[field]:g})")
    parser.add_argument("--threads", dest="threads_per_worker", metavar="THREADS", type=positive_int, default=None,
                        help="torch threads per CPU worker (default 1: add --workers to use more cores)")
    parser.add_argument("--missing-features", choices=["empty", "error"], default=d["missing_features"],
                        help="a feature left out of a request: no ids (empty, default) or a 422 (error)")
    parser.add_argument("--api-servers", type=positive_int, default=None,
                        help="HTTP server processes (default: one per worker)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=d["log_level"])
    return parser


def run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    reject_extra_arguments(rest, parser)
    if importlib.util.find_spec("litserve") is None:
        raise CommandError("`lightrec serve` runs on LitServe, which is not installed: pip install \"lightrec[serve]\"")
    from lightrec.serving.server import serve  # imports LitServe: only for this command

    tuning = {field: getattr(ns, field) for _, field, _, _ in _TUNING}
    config = ServeConfig(
        artifact=Path(ns.artifact), deltas=Path(ns.deltas) if ns.deltas else None, host=ns.host, port=ns.port,
        accelerator=ns.accelerator, devices=ns.devices, threads_per_worker=ns.threads_per_worker,
        missing_features=ns.missing_features, api_servers=ns.api_servers, log_level=ns.log_level, **tuning,
    )  # fmt: skip
    try:
        serve(config)
    except ServeConfigError as exc:
        raise UsageError(str(exc)) from exc
    except RuntimeError as exc:  # LitServe: "One or more workers failed to start" (their traceback is logged above)
        raise CommandError(f"{exc}; the worker's traceback is above") from exc
    return 0
