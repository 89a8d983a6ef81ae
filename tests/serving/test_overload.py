"""A worker that hangs, and bodies that pile up, through a real server on 127.0.0.1 (this file's own:
``--timeout 2``, ``--max-payload-mb 0.5``, ``--max-queue-mb 0.5``, the fake updater of
``fake_updates.py``). An announced version whose apply holds the model's lock for ``HOLD_S``
seconds is a worker that hangs mid-batch with a request in hand: the client gets 504 once
``--timeout`` has passed (not when the worker comes back); the request keeps its place and bytes
until the worker's late answer comes (its body is still in front of the worker: given back at the
504, each ``--timeout`` of a hang let another budget's worth of bodies pile up in the queue), and
that answer does not disturb the server, which answers the next request. While one large body is in
flight, another that would take the bytes in flight past ``--max-queue-mb`` gets 503 +
``Retry-After`` -- though far fewer than ``--max-queue`` requests are in flight -- and a small one
is still admitted."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from lightrec.inference import export
from tests.inference.helpers import dlrm
from tests.serving.fake_updates import announce
from tests.serving.server_process import free_port, running_server, script_command

requests = pytest.importorskip("requests")
pytest.importorskip("litserve")

TIMEOUT_S = 2.0
HOLD_S = 5.0  # well past TIMEOUT_S: the worker comes back long after the client was answered
MAX_QUEUE_BYTES = 2**19  # --max-queue-mb 0.5 (and --max-payload-mb 0.5: each large body fits alone)
GOOD = {"dense": [0.1] * 5, "sparse": {"f0": [1]}}


class Server(NamedTuple):
    url: str
    updates: Path
    artifact: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    artifact = export(dlrm(), tmp_path_factory.mktemp("overload") / "dlrm.pt")
    updates = tmp_path_factory.mktemp("updates")
    port = free_port()
    command = script_command(artifact, port, "--updates", str(updates), "--follow-interval", "0.1", "--timeout",
                             str(TIMEOUT_S), "--max-payload-mb", "0.5", "--max-queue-mb", "0.5")  # fmt: skip
    with running_server(command, port, tmp_path_factory.mktemp("log") / "server.log") as url:
        yield Server(url, updates, artifact)


def _body(size: int) -> bytes:
    """A valid request of exactly ``size`` bytes (JSON allows trailing whitespace)."""
    text = json.dumps(GOOD).encode()
    return text + b" " * (size - len(text))


def _post(url: str, body: bytes) -> requests.Response:
    return requests.post(f"{url}/predict", data=body, headers={"Content-Type": "application/json"}, timeout=60)


def _ready(url: str) -> dict:
    return requests.get(f"{url}/ready", timeout=10).json()


def _hold_worker(server: Server) -> tuple[int, float]:
    """Announce the next version with an apply that holds the model ``HOLD_S`` s; once it holds it,
    return that version and the time the hold started."""
    version = _ready(server.url)["workers"][0]["version"] + 1
    marker = server.updates / f"holding-{version}"
    announce(server.updates, version, server.artifact, apply_delay_s=HOLD_S, started_marker=str(marker))
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < deadline, "the update never started"
        time.sleep(0.01)
    return version, time.monotonic()


def _served_after_the_hold(server: Server, version: int) -> None:
    """The worker is back (its late answers came and went) and the server scores the next request."""
    deadline = time.monotonic() + 30
    while _ready(server.url)["workers"][0]["version"] != version:
        assert time.monotonic() < deadline, f"version {version} not served after 30 s"
        time.sleep(0.05)
    answer = _post(server.url, _body(100))
    assert answer.status_code == 200 and answer.json()["version"] == version, answer.text
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200


def _metric(url: str, name: str) -> float:
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


def test_a_hung_worker_gets_its_requests_a_504_after_the_timeout(server: Server) -> None:
    version, held_at = _hold_worker(server)
    start = time.monotonic()
    answer = _post(server.url, _body(100))  # the worker takes it into a batch, then waits on the model's lock
    waited = time.monotonic() - start
    assert answer.status_code == 504, answer.text
    assert TIMEOUT_S - 0.1 <= waited < TIMEOUT_S + 1.5, waited
    body = answer.json()
    assert set(body) == {"error", "index", "field", "value"} and "--timeout" in body["error"], body
    ready = _ready(server.url)  # the body is still in front of the hung worker: it keeps its place and bytes
    assert time.monotonic() - held_at < HOLD_S, "the worker came back before the check: raise HOLD_S"
    assert ready["in_flight"] == 1 and ready["in_flight_bytes"] == 100, ready
    _served_after_the_hold(server, version)  # the late answer gave them back
    assert _metric(server.url, 'lightrec_serving_requests_total{code="504"}') >= 1
    assert _metric(server.url, "lightrec_serving_in_flight") == 0


def test_bodies_past_the_byte_budget_get_503_with_retry_after(server: Server) -> None:
    version, held_at = _hold_worker(server)
    large = _body(300_000)  # two of them: past the 524288 bytes of --max-queue-mb 0.5
    answers: dict[str, requests.Response] = {}

    def client(name: str, body: bytes) -> None:
        answers[name] = _post(server.url, body)

    first = threading.Thread(target=client, args=("first", large))
    first.start()
    deadline = time.monotonic() + TIMEOUT_S
    while (ready := _ready(server.url))["in_flight"] == 0:  # admitted, and held in front of the worker
        assert time.monotonic() < deadline, "the first request was never admitted"
        time.sleep(0.01)
    assert ready["in_flight_bytes"] == len(large) and ready["queue_limit_bytes"] == MAX_QUEUE_BYTES, ready
    assert _metric(server.url, "lightrec_serving_in_flight_bytes") == len(large)
    refused = _post(server.url, large)  # one request in flight of --max-queue 512, but too many bytes
    small = threading.Thread(target=client, args=("small", _body(100)))  # still fits beside the first
    small.start()
    first.join(60)
    small.join(60)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
    body = refused.json()
    assert set(body) == {"error", "index", "field", "value"} and "--max-queue-mb" in body["error"], body
    assert answers["first"].status_code == 504 and answers["small"].status_code == 504  # admitted; the worker hangs
    # Answered 504, both bodies still wait in front of the worker: the queue stays bounded across timeouts.
    again = _post(server.url, large)
    ready = _ready(server.url)
    assert time.monotonic() - held_at < HOLD_S, "the worker came back before the check: raise HOLD_S"
    assert again.status_code == 503 and "--max-queue-mb" in again.json()["error"], again.text
    assert ready["in_flight"] == 2 and ready["in_flight_bytes"] == len(large) + 100, ready
    assert _metric(server.url, "lightrec_serving_queue_limit_bytes") == MAX_QUEUE_BYTES
    _served_after_the_hold(server, version)
    assert _ready(server.url)["in_flight_bytes"] == 0
