"""The door of ``POST /predict``, through a real ``lightrec serve`` on 127.0.0.1 started with an API
key (``LIT_SERVER_API_KEY``), ``--max-queue 2`` and a short ``--body-timeout``: clients that send
headers and part of a body hold no place in the queue (others are served, ``/ready`` stays 200) and
get 408 once their time is up; a body cut short by a disconnect is dropped, never scored or
counted; the bytes of half-sent bodies count against ``--max-queue-mb`` (1 MiB here) as they arrive,
so connections holding large unfinished bodies get 503 instead of taking the server's memory; the
key guards every endpoint, and ``/predict`` checks it before reading the body."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from lightrec.inference import export
from tests.inference.helpers import dlrm
from tests.serving.server_process import ServerURL, free_port, running_server, serve_command

requests = pytest.importorskip("requests")
pytest.importorskip("litserve")

KEY = "test-key-3f9a"
AUTH = {"X-API-Key": KEY}
MAX_QUEUE = 2
BODY_TIMEOUT_S = 3.0
MAX_QUEUE_MB = 1  # and --max-payload-mb 1
GOOD = {"dense": [0.1] * 5, "sparse": {"f0": [1]}}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerURL]:
    artifact = export(dlrm(), tmp_path_factory.mktemp("admission") / "dlrm.pt")
    port = free_port()
    command = serve_command(artifact, port, "--accelerator", "cpu", "--max-queue", str(MAX_QUEUE), "--body-timeout",
                            str(BODY_TIMEOUT_S), "--max-queue-mb", str(MAX_QUEUE_MB), "--max-payload-mb", "1")  # fmt: skip
    with running_server(command, port, tmp_path_factory.mktemp("log") / "server.log", env={"LIT_SERVER_API_KEY": KEY},
                        headers=AUTH) as base:  # fmt: skip
        yield base


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _partial_body(url: str, key: str | None = KEY, declared: int = 100, sent: bytes = b'{"dense"') -> socket.socket:
    """A client that sends the headers of a ``declared``-byte body and ``sent`` of it, then nothing."""
    client = socket.create_connection(("127.0.0.1", _port(url)), timeout=30)
    header = f"X-API-Key: {key}\r\n" if key else ""
    client.sendall(f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {declared}\r\n{header}\r\n".encode() + sent)  # fmt: skip
    return client


def _read_all(client: socket.socket, timeout_s: float) -> bytes:
    """What the server sends until it closes the connection (or ``timeout_s`` passes)."""
    client.settimeout(timeout_s)
    data = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            chunk = client.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    return data


def _metrics(url: str) -> dict[str, float]:
    text = requests.get(f"{url}/metrics", headers=AUTH, timeout=10).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}  # fmt: skip


def test_the_gate_counts_requests_and_bytes_and_gives_both_back() -> None:
    from lightrec.serving.admission import AdmissionGate

    gate = AdmissionGate(3, byte_limit=100)
    assert gate.enter(60) is None and gate.enter(40) is None  # exactly at the byte limit: admitted
    assert (gate.in_flight, gate.in_flight_bytes, gate.full) == (2, 100, True)
    refused = gate.enter(1)
    assert refused is not None and "100 bytes" in refused and "--max-queue-mb" in refused, refused
    gate.leave(60)
    assert gate.enter(10) is None and gate.enter(0) is None  # now the count is the limit
    assert gate.enter(0) == "its limit of 3 requests in flight"
    for size in (40, 10, 0):
        gate.leave(size)
    assert (gate.in_flight, gate.in_flight_bytes, gate.full) == (0, 0, False)
    with pytest.raises(ValueError, match="byte limit must be >= 1"):
        AdmissionGate(3, byte_limit=0)
    # a body arriving in pieces holds its bytes (no place in the count) and keeps them when admitted
    assert gate.reserve(70) is None and (gate.in_flight, gate.in_flight_bytes) == (0, 70)
    refused = gate.reserve(31, arrived=70)  # the same body's next piece: refused, nothing taken
    assert refused is not None and "this one 101 so far" in refused and gate.in_flight_bytes == 70, refused
    assert gate.enter(30) is None and gate.enter(1) is not None  # other bodies see the held bytes
    gate.leave(30)
    assert gate.reserve(20) is None and gate.enter(90, reserved=90) is None  # its 90 bytes were all held
    assert (gate.in_flight, gate.in_flight_bytes) == (1, 90)
    gate.leave(90)
    assert gate.reserve(40) is None
    gate.release(40)  # a body never admitted gives its bytes back
    assert (gate.in_flight, gate.in_flight_bytes) == (0, 0)


def test_clients_slow_to_send_hold_no_place_and_get_408(url: str) -> None:
    slow = [_partial_body(url) for _ in range(MAX_QUEUE + 1)]  # more than the queue holds
    try:
        time.sleep(0.5)
        for _ in range(3):  # served meanwhile: the slow clients hold no place in the queue
            answer = requests.post(f"{url}/predict", json=GOOD, headers=AUTH, timeout=30)
            assert answer.status_code == 200, answer.text
        ready = requests.get(f"{url}/ready", headers=AUTH, timeout=10)
        assert ready.status_code == 200 and ready.json()["in_flight"] == 0, ready.text
        for client in slow:  # each gets its 408 once --body-timeout has passed, and the connection is closed
            answer = _read_all(client, BODY_TIMEOUT_S + 20)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b"connection: close" in answer.lower() and b"--body-timeout" in answer
    finally:
        for client in slow:
            client.close()
    assert _metrics(url)['lightrec_serving_requests_total{code="408"}'] >= MAX_QUEUE + 1


def test_a_body_cut_short_by_a_disconnect_is_dropped(url: str) -> None:
    before = _metrics(url)
    for _ in range(3):
        _partial_body(url).close()  # the client leaves before its body is complete
    time.sleep(1.0)
    after = _metrics(url)
    for name in ('lightrec_serving_requests_total{code="400"}', "lightrec_serving_scored_requests_total",
                 "lightrec_serving_request_latency_seconds_count"):  # fmt: skip
        assert after[name] == before[name], name  # never dispatched to a worker, nor counted as answered
    assert after["lightrec_serving_in_flight"] == 0
    assert requests.post(f"{url}/predict", json=GOOD, headers=AUTH, timeout=30).status_code == 200


def test_the_api_key_guards_every_endpoint_and_predict_checks_it_before_the_body(url: str) -> None:
    for path in ("/ready", "/metrics", "/health", "/info"):
        assert requests.get(f"{url}{path}", timeout=10).status_code == 401, path
        assert requests.get(f"{url}{path}", headers={"X-API-Key": "wrong"}, timeout=10).status_code == 401, path
        assert requests.get(f"{url}{path}", headers=AUTH, timeout=10).status_code == 200, path
    for headers in ({}, {"X-API-Key": "wrong"}):
        answer = requests.post(f"{url}/predict", json=GOOD, headers=headers, timeout=30)
        assert answer.status_code == 401 and answer.json()["field"] == "x-api-key", answer.text
    client = _partial_body(url, key=None)  # no key and a body that never completes: refused at once
    try:
        start = time.monotonic()
        answer = _read_all(client, 2.0)
        assert answer.startswith(b"HTTP/1.1 401 ") and time.monotonic() - start < BODY_TIMEOUT_S, answer[:200]
    finally:
        client.close()
    assert _metrics(url)['lightrec_serving_requests_total{code="401"}'] >= 3


def test_half_sent_bodies_hold_their_bytes_and_the_one_past_the_budget_gets_503(url: str) -> None:
    """Each connection declares 600 KiB and sends 400 KiB of it: the second one passes the 1 MiB budget with
    what it sends and is answered 503 (Retry-After, connection closed) at once, not at --body-timeout."""
    piece = b" " * (400 * 1024)
    first = _partial_body(url, declared=600 * 1024, sent=piece)
    try:
        time.sleep(0.5)
        assert _metrics(url)["lightrec_serving_in_flight_bytes"] >= len(piece)  # held while it arrives
        second = _partial_body(url, declared=700 * 1024, sent=b"")
        try:
            # In small pieces, each read by the server before the next: its answer is not lost to a reset
            # (unread bytes at the server's close).
            for _ in range(700 // 32):
                second.sendall(b" " * (32 * 1024))
                time.sleep(0.02)
                second.settimeout(0.05)
                try:
                    answer = second.recv(65536, socket.MSG_PEEK)
                except TimeoutError:
                    continue
                if answer:
                    break
            answer = _read_all(second, BODY_TIMEOUT_S - 1)
            assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
            assert b"retry-after: 1" in answer.lower() and b"connection: close" in answer.lower()
            assert b"--max-queue-mb" in answer
        finally:
            second.close()
        assert requests.post(f"{url}/predict", json=GOOD, headers=AUTH, timeout=30).status_code == 200  # small: fits
        assert _read_all(first, BODY_TIMEOUT_S + 20).startswith(b"HTTP/1.1 408 ")  # and gives its bytes back
    finally:
        first.close()
    time.sleep(0.5)
    assert _metrics(url)["lightrec_serving_in_flight_bytes"] == 0
