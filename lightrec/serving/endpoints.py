"""The server's endpoints besides ``POST /predict``, and the answer to a body that is not JSON.

=============  ======================================================================================
``/health``    LitServe's: 200 once every worker has loaded the model and caught up on published
               versions, 503 before, and 503 when a worker's model was damaged by a failed update
               (``RecServingAPI.health``). For a liveness probe.
``/ready``     200 when every worker serves and fewer than ``--max-queue`` requests are in flight,
               else 503; the body says why: ``{"ready", "workers": [{"state", "version"}],
               "in_flight", "queue_limit"}``. For a load balancer's readiness probe.
``/metrics``   Prometheus' text format (:mod:`lightrec.serving.metrics`).
``/info``      LitServe's: the artifact's features and tables, the server's devices and limits.
=============  ======================================================================================

FastAPI parses the body of ``/predict`` before LitServe sees it; a body that is not JSON (or
none) would get FastAPI's own 422. :func:`add_endpoints` answers it as the server answers every
bad request: 400 with ``{"error", "index", "field", "value"}``.
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from lightrec.serving.admission import AdmissionGate
from lightrec.serving.metrics import ServingMetrics, WorkerState
from lightrec.serving.request_forms import Rejected

__all__ = ["METRICS_CONTENT_TYPE", "add_endpoints"]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_STATE_NAMES = {WorkerState.STARTING: "starting", WorkerState.SERVING: "serving", WorkerState.DAMAGED: "damaged"}


def add_endpoints(app: FastAPI, metrics: ServingMetrics, gate: AdmissionGate) -> None:
    """Add ``/ready`` and ``/metrics`` to LitServe's app, and the 400 answer to bodies that are not JSON."""

    async def ready() -> Response:
        states = metrics.worker_states()
        workers = [{"state": _STATE_NAMES.get(state, "unknown"), "version": version} for state, version in states]
        serving = all(state == WorkerState.SERVING for state, _ in states)
        in_flight = gate.in_flight
        is_ready = serving and in_flight < gate.limit
        body = {"ready": is_ready, "workers": workers, "in_flight": in_flight, "queue_limit": gate.limit}
        return Response(json.dumps(body), status_code=200 if is_ready else 503, media_type="application/json")

    async def scrape() -> Response:
        return Response(metrics.render(gate.in_flight, gate.limit), media_type=METRICS_CONTENT_TYPE)

    async def not_json(request: Request, exc: Exception) -> Response:
        problems = exc.errors() if isinstance(exc, RequestValidationError) else []
        first = problems[0] if problems else {}
        if first.get("type") == "missing":
            rejected = Rejected(400, "the body is empty; send a JSON object (one sample or {'batch': ...}) or a list",
                                None, "body", None)
        else:
            where = first.get("loc", ("body",))
            position = f" at character {where[1]}" if len(where) > 1 else ""
            reason = first.get("ctx", {}).get("error", first.get("msg", "not JSON"))
            rejected = Rejected(400, f"the body is not valid JSON ({reason}{position}); send a JSON object or list",
                                None, "body", None)
        return Response(json.dumps(rejected.body()), status_code=400, media_type="application/json")

    app.add_api_route("/ready", ready, methods=["GET"])
    app.add_api_route("/metrics", scrape, methods=["GET"])
    app.add_exception_handler(RequestValidationError, not_json)
