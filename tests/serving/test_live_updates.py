"""The seam for live deltas, through a real server: a fake updater (``fake_updates.py``) swaps in a
model whose rows of a few ids changed while clients keep sending -- scores of exactly those ids
change, responses carry the new version, no request is dropped; a refused version leaves the
served one in place; an update that holds the model makes requests pile up until the bounded
queue answers 503 with ``Retry-After``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lightrec.inference import export, load
from tests.inference.helpers import dlrm
from tests.serving.fake_updates import announce
from tests.serving.server_process import free_port, running_server, script_command

requests = pytest.importorskip("requests")
pytest.importorskip("litserve")

TOUCHED = {"dense": [0.5] * 5, "sparse": {"f0": [3], "f2": [7]}}  # f0's rows 1..5 change (table t0)
UNTOUCHED = {"dense": [0.5] * 5, "sparse": {"f0": [30], "f1": [12], "f3": [2]}}
MAX_QUEUE = 6


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    base = dlrm()
    first = export(base, folder / "v0.pt")
    with torch.no_grad():
        table = base.sparse_arch.embedding_bag_collection.embedding_bags["t0"].weight
        table[1:6] += 0.75
    return {"v0": first, "v1": export(base, folder / "v1.pt")}


@pytest.fixture(scope="module")
def updates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("updates")


@pytest.fixture(scope="module")
def url(models: dict[str, Path], updates: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    command = script_command(models["v0"], port, "--updates", str(updates), "--max-queue", str(MAX_QUEUE),
                             "--follow-interval", "0.2")  # fmt: skip
    with running_server(command, port, tmp_path_factory.mktemp("log") / "server.log") as base:
        yield base


def _post(url: str, body: object, session: requests.Session | None = None) -> requests.Response:
    return (session or requests).post(f"{url}/predict", json=body, timeout=60)


def _wait_for_version(url: str, version: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while _post(url, UNTOUCHED).json()["version"] != version:
        assert time.monotonic() < deadline, f"version {version} not served after {timeout_s} s"
        time.sleep(0.1)


def _metric(url: str, name: str) -> float:
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


def test_a_new_version_changes_exactly_the_touched_scores_without_dropping_requests(
        url: str, models: dict[str, Path], updates: Path) -> None:
    old, new = load(models["v0"]), load(models["v1"])
    want = {(name, 0): float(old.predict([r])[0]) for name, r in (("touched", TOUCHED), ("untouched", UNTOUCHED))}
    want |= {(name, 1): float(new.predict([r])[0]) for name, r in (("touched", TOUCHED), ("untouched", UNTOUCHED))}
    assert want[("touched", 0)] != want[("touched", 1)] and want[("untouched", 0)] == want[("untouched", 1)]
    seen: list[tuple[str, int, float, int]] = []  # (request, status, score, version)
    stop = threading.Event()

    def client(name: str, request: dict) -> None:
        with requests.Session() as session:
            while not stop.is_set():
                answer = _post(url, request, session)
                body = answer.json()
                seen.append((name, answer.status_code, body.get("scores", [0.0])[0], body.get("version", -1)))

    threads = [threading.Thread(target=client, args=(n, r)) for n, r in [("touched", TOUCHED), ("untouched", UNTOUCHED)] * 2]
    for t in threads:
        t.start()
    time.sleep(1.0)
    announce(updates, 1, models["v1"])
    published = time.monotonic()
    deadline = published + 30
    while not any(v == 1 for *_, v in seen) and time.monotonic() < deadline:
        time.sleep(0.02)
    lag = time.monotonic() - published
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(60)
    assert all(status == 200 for _, status, _, _ in seen), [s for s in seen if s[1] != 200][:3]
    assert {v for *_, v in seen} == {0, 1} and lag < 10, lag
    for name, _, score, version in seen:
        assert abs(score - want[(name, version)]) <= 1e-6, (name, score, version)
    assert _metric(url, 'lightrec_serving_model_version{worker="0"}') == 1
    assert 0 <= _metric(url, 'lightrec_serving_delta_lag_seconds{worker="0"}') < 10


def test_a_refused_version_keeps_the_served_one(url: str, models: dict[str, Path], updates: Path) -> None:
    _wait_for_version(url, 1)
    refused = _metric(url, 'lightrec_serving_updates_total{worker="0",outcome="refused"}')
    announce(updates, 2, models["v0"], corrupt=True)
    time.sleep(1.0)  # five follow intervals
    assert _post(url, UNTOUCHED).json()["version"] == 1
    assert _metric(url, 'lightrec_serving_updates_total{worker="0",outcome="refused"}') > refused
    assert requests.get(f"{url}/health", timeout=10).status_code == 200
    announce(updates, 3, models["v0"])  # the next good version is applied
    _wait_for_version(url, 3)
    answer = _post(url, TOUCHED).json()
    assert answer["scores"][0] == pytest.approx(float(load(models["v0"]).predict([TOUCHED])[0]), abs=1e-6)


def test_overload_answers_503_with_retry_after(url: str, models: dict[str, Path], updates: Path) -> None:
    _wait_for_version(url, 3)
    marker = updates / "applying"
    announce(updates, 4, models["v1"], apply_delay_s=6.0, started_marker=str(marker))  # holds the model 6 s
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < deadline, "the update never started"
        time.sleep(0.02)
    answers: list[requests.Response] = []
    barrier = threading.Barrier(3 * MAX_QUEUE)

    def client() -> None:
        barrier.wait(30)
        answers.append(_post(url, UNTOUCHED))

    threads = [threading.Thread(target=client) for _ in range(3 * MAX_QUEUE)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 4.0  # while the model is held, the queue fills and /ready turns 503
    while (ready := requests.get(f"{url}/ready", timeout=10)).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    for t in threads:
        t.join(60)
    statuses = sorted(a.status_code for a in answers)
    assert set(statuses) == {200, 503} and statuses.count(200) <= MAX_QUEUE, statuses
    busy = next(a for a in answers if a.status_code == 503)
    assert busy.headers["retry-after"] == "1" and "limit of 6 requests in flight" in busy.json()["error"]
    assert all(a.json()["version"] == 4 for a in answers if a.status_code == 200)  # scored after the update, none lost
    assert ready.status_code == 503 and ready.json()["in_flight"] == MAX_QUEUE
    assert _metric(url, 'lightrec_serving_requests_total{code="503"}') >= statuses.count(503)


@pytest.fixture(scope="module")
def fragile(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A server of its own (this one gets damaged), following an empty folder of announcements."""
    folder = tmp_path_factory.mktemp("fragile")
    port = free_port()
    command = script_command(models["v0"], port, "--updates", str(folder), "--follow-interval", "0.2")
    with running_server(command, port, tmp_path_factory.mktemp("log") / "fragile.log") as base:
        yield base, folder


@pytest.mark.slow  # its own server (~11 s); tests/serving/test_api.py checks the 503 without one
def test_a_worker_damaged_by_a_failed_update_stops_scoring(fragile: tuple[str, Path], models: dict[str, Path]) -> None:
    url, folder = fragile
    before = _post(url, UNTOUCHED)
    assert before.status_code == 200 and before.json()["version"] == 0
    announce(folder, 1, models["v1"], fail=True)  # writes a dense weight, then raises: the model is half-written
    deadline = time.monotonic() + 30
    while requests.get(f"{url}/health", timeout=10).status_code == 200:
        assert time.monotonic() < deadline, "the failed update never marked the worker damaged"
        time.sleep(0.1)
    answer = _post(url, UNTOUCHED)  # not a 200 with the old version number from a half-written model
    assert answer.status_code == 503 and "failed part way" in answer.json()["error"], answer.text
    ready = requests.get(f"{url}/ready", timeout=10)
    assert ready.status_code == 503 and ready.json()["workers"] == [{"state": "damaged", "version": 0}]
    assert _metric(url, 'lightrec_serving_requests_total{code="503"}') >= 1
