"""The server's endpoints besides ``POST /predict``.

=============  ======================================================================================
``/health``    LitServe's: 200 once every worker has loaded the model and caught up on published
               versions, 503 before, and 503 when a worker's model was damaged by a failed update
               (``RecServingAPI.health``). For a liveness probe.
``/ready``     200 when every worker serves and fewer than ``--max-queue`` requests (and fewer
               than ``--max-queue-mb`` of bodies) are in flight, else 503; the body says why:
               ``{"ready", "workers": [{"state", "version"}], "in_flight", "queue_limit",
               "in_flight_bytes", "queue_limit_bytes"}``. For a load balancer's readiness probe.
``/metrics``   Prometheus' text format (:mod:`lightrec.serving.metrics`).
``/info``      LitServe's: the artifact's features and tables, the server's devices and limits.
=============  ======================================================================================

With ``LIT_SERVER_API_KEY`` set, every one of them wants the key in ``X-API-Key`` (401 without),
as LitServe's own ``/health`` and ``/info`` do, and so does ``POST /predict`` (checked by the
admission middleware before it reads the body).

``POST /predict`` never reaches FastAPI: the admission middleware hands its body to the workers
(:class:`~lightrec.serving.transport.PredictDispatch`), and a body that is not JSON gets the
worker's 400 (``request_forms.decode_body``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import Depends, FastAPI
from starlette.responses import Response

from lightrec.serving.admission import AdmissionGate
from lightrec.serving.metrics import ServingMetrics, WorkerState

__all__ = ["METRICS_CONTENT_TYPE", "add_endpoints"]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_STATE_NAMES = {WorkerState.STARTING: "starting", WorkerState.SERVING: "serving", WorkerState.DAMAGED: "damaged"}


def add_endpoints(app: FastAPI, metrics: ServingMetrics, gate: AdmissionGate,
                  auth: Callable[..., object] | None = None) -> None:
    """Add ``/ready`` and ``/metrics`` to LitServe's app.

    Args:
        auth: a FastAPI dependency that refuses unauthorized requests (LitServe's ``setup_auth()``,
            which checks ``LIT_SERVER_API_KEY``); None: open.
    """

    async def ready() -> Response:
        states = metrics.worker_states()
        workers = [{"state": _STATE_NAMES.get(state, "unknown"), "version": version} for state, version in states]
        serving = all(state == WorkerState.SERVING for state, _ in states)
        is_ready = serving and not gate.full
        body = {"ready": is_ready, "workers": workers, "in_flight": gate.in_flight, "queue_limit": gate.limit,
                "in_flight_bytes": gate.in_flight_bytes, "queue_limit_bytes": gate.byte_limit}
        return Response(json.dumps(body), status_code=200 if is_ready else 503, media_type="application/json")

    async def scrape() -> Response:
        text = metrics.render(gate.in_flight, gate.limit, in_flight_bytes=gate.in_flight_bytes,
                              queue_limit_bytes=gate.byte_limit)
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    dependencies = [Depends(auth)] if auth is not None else None
    app.add_api_route("/ready", ready, methods=["GET"], dependencies=dependencies)
    app.add_api_route("/metrics", scrape, methods=["GET"], dependencies=dependencies)
