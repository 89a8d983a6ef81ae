"""``lightrec serve`` as a user runs it: one real server (started by the CLI) on 127.0.0.1 for the
module, real HTTP clients. Scores equal ``Predictor``'s for the same requests, concurrent clients
are batched together, every kind of bad input gets its own 4xx without disturbing the others,
and /health, /ready, /info, /metrics answer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lightrec.inference import Predictor, export, load
from tests.inference.helpers import FEATURES, dlrm
from tests.serving.server_process import free_port, running_server, serve_command

requests = pytest.importorskip("requests")
pytest.importorskip("litserve")

ROWS = {"f0": 40, "f1": 40, "f2": 31, "f3": 17}
MAX_SAMPLES = 64
MAX_PAYLOAD_MB = 0.05  # 52428 bytes: small enough to exceed cheaply


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(dlrm(), tmp_path_factory.mktemp("serve") / "dlrm.pt")


@pytest.fixture(scope="module")
def predictor(artifact: Path) -> Predictor:
    return load(artifact)


@pytest.fixture(scope="module")
def url(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    command = serve_command(artifact, port, "--max-samples", str(MAX_SAMPLES), "--max-payload-mb", str(MAX_PAYLOAD_MB),
                            "--max-batch-size", "16", "--batch-timeout-ms", "5")  # fmt: skip
    with running_server(command, port, tmp_path_factory.mktemp("log") / "server.log") as base:
        yield base


def _samples(n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"dense": torch.rand(5, generator=g).tolist(),
             "sparse": {f: torch.randint(0, ROWS[f], (int(torch.randint(0, 4, (1,), generator=g)),),
                                         generator=g).tolist() for f in FEATURES}}
            for _ in range(n)]  # fmt: skip


def _compact(samples: list[dict]) -> dict:
    return {"batch": {"dense": [s["dense"] for s in samples],
                      "lengths": {f: [len(s["sparse"][f]) for s in samples] for f in FEATURES},
                      "ids": {f: [i for s in samples for i in s["sparse"][f]] for f in FEATURES}}}  # fmt: skip


def _post(url: str, body: object, session: requests.Session | None = None) -> requests.Response:
    return (session or requests).post(f"{url}/predict", json=body, timeout=30)


def test_scores_equal_the_predictors(url: str, predictor: Predictor) -> None:
    samples = _samples(12, seed=0)
    for sample in samples[:6]:  # one request at a time: each is a batch of its own, as in predict([sample])
        answer = _post(url, sample)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["version"] == 0
        assert torch.equal(torch.tensor(body["scores"], dtype=torch.float32), predictor.predict([sample]))
    for body in (samples[6:], _compact(samples[6:])):  # Predictor's list, the compact batch form
        answer = _post(url, body)
        assert answer.status_code == 200, answer.text
        assert torch.equal(torch.tensor(answer.json()["scores"], dtype=torch.float32), predictor.predict(samples[6:]))


def test_concurrent_clients_are_batched_and_answered(url: str, predictor: Predictor) -> None:
    clients, per_client = 12, 15
    samples = _samples(clients * per_client, seed=1)
    want = predictor.predict(samples)
    got: dict[int, object] = {}
    barrier = threading.Barrier(clients)

    def client(c: int) -> None:
        with requests.Session() as session:
            barrier.wait(30)
            for k in range(per_client):
                i = c * per_client + k
                answer = _post(url, samples[i] if k % 2 else [samples[i]], session)
                got[i] = answer.json()["scores"][0] if answer.status_code == 200 else answer.text

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(got) == list(range(len(samples))), "every request was answered"
    assert all(isinstance(x, float) for x in got.values()), [x for x in got.values() if not isinstance(x, float)]
    # batches of several requests: the float rounding of a row may differ by batch composition
    assert torch.allclose(torch.tensor([got[i] for i in range(len(samples))]), want, rtol=0, atol=1e-6)
    metrics = requests.get(f"{url}/metrics", timeout=10).text
    single = float(metrics.split('lightrec_serving_batch_size_bucket{le="1"} ')[1].split()[0])
    batches = float(metrics.split("lightrec_serving_batch_size_count ")[1].split()[0])
    assert batches > single, "some forward scored more than one sample"


BAD = [  # (body as sent, content type, status, index, field)
    (b'{"dense": [0.1, ', "application/json", 400, None, "body"),
    (b"", "application/json", 400, None, "body"),
    (b'"a string"', "application/json", 400, None, "body"),
    (b'{"dense": [0,0,0,0,0], "sparse": {"nope": [1]}}', "application/json", 422, 0, "sparse"),
    (b'{"dense": [0,0,0,0,0], "sparse": {"f1": ["7"]}}', "application/json", 422, 0, "sparse.f1[0]"),
    (b'{"dense": [0,0,0,0,0], "sparse": {"f1": [7.0]}}', "application/json", 422, 0, "sparse.f1[0]"),
    (b'{"dense": [0,0,0,0,0], "sparse": {"f3": [17]}}', "application/json", 422, 0, "sparse.f3[0]"),
    (b'{"dense": [0,0,0,0,0], "sparse": {"f3": [18446744073709551616]}}', "application/json", 422, 0, "sparse.f3[0]"),
    (b'[{"dense": [0,0,0,0,0]}, {"dense": [0,0,0]}]', "application/json", 422, 1, "dense"),
    (b'{"dense": [0,0,0,0,0], "sparse": {}} trailing', "text/plain", 400, None, "body"),
    # numbers JSON allows but float32 cannot hold: a 4xx naming them, not a 500 (OverflowError) or a NaN score
    (b'{"dense": [1' + b"0" * 400 + b', 0, 0, 0, 0], "sparse": {"f0": [1]}}', "application/json", 422, 0, "dense[0]"),
    (b'{"batch": {"dense": [[0, 0, 0, 0, 0], [0, 1' + b"0" * 400 + b', 0, 0, 0]]}}', "application/json", 422, 1,
     "batch.dense[1][1]"),
    (b'{"dense": [0, 0, 1e39, 0, 0]}', "application/json", 422, 0, "dense[2]"),
    (b'{"dense": [0, 0, 0, NaN, 0]}', "application/json", 422, 0, "dense[3]"),
    (b"[" * 20_000 + b"]" * 20_000, "application/json", 400, None, "body"),  # json.loads: RecursionError
]


@pytest.mark.parametrize(("body", "content_type", "status", "index", "field"), BAD,
                         ids=[f"{b[2]}-{b[4]}-{i}" for i, b in enumerate(BAD)])  # fmt: skip
def test_bad_input_gets_a_4xx_naming_index_field_value(url: str, body: bytes, content_type: str, status: int,
                                                       index: int | None, field: str) -> None:
    answer = requests.post(f"{url}/predict", data=body, headers={"content-type": content_type}, timeout=30)
    assert answer.status_code == status, answer.text
    error = _strict_json(answer)
    assert set(error) == {"error", "index", "field", "value"} and (error["index"], error["field"]) == (index, field)
    assert len(answer.content) < 1000  # a long offending value comes back truncated


def _strict_json(answer: requests.Response) -> dict:
    """The body, parsed as strict JSON (NaN and Infinity are not JSON: strict clients refuse them)."""
    import json

    return json.loads(answer.text, parse_constant=lambda c: pytest.fail(f"{c} in the response {answer.text[:200]}"))


def test_huge_keys_and_values_come_back_truncated(url: str) -> None:
    key = "k" * 40_000
    for body, field in (({"dense": [0.0] * 5, key: 1}, "k" * 200 + "... (40000 characters)"),
                        ({"dense": [0.0] * 5, "sparse": {"f0": ["x" * 40_000]}}, "sparse.f0[0]")):
        answer = _post(url, body)
        error = _strict_json(answer)
        assert answer.status_code == 422 and error["field"] == field and len(answer.content) < 1500, answer.text[:300]


def test_a_score_the_model_makes_nan_is_an_error_in_strict_json(url: str, predictor: Predictor) -> None:
    overflow = {"dense": [3.4e38] * 5, "sparse": {"f0": [1]}}  # finite float32 values the forward turns into NaN
    assert torch.isnan(predictor.predict([overflow])).all()
    answer = _post(url, overflow)
    error = _strict_json(answer)
    assert answer.status_code == 500 and (error["index"], error["field"], error["value"]) == (0, "scores", "NaN")
    assert "not a probability" in error["error"]
    good = _samples(1, seed=6)[0]
    assert _post(url, good).status_code == 200


def test_a_json_body_without_a_json_content_type_is_still_read(url: str, predictor: Predictor) -> None:
    sample = _samples(1, seed=3)[0]
    import json

    answer = requests.post(f"{url}/predict", data=json.dumps(sample), timeout=30)  # form-encoded by default
    assert answer.status_code == 200 and torch.equal(torch.tensor(answer.json()["scores"]), predictor.predict([sample]))


def test_oversized_payloads_and_batches_get_413(url: str) -> None:
    limit = int(MAX_PAYLOAD_MB * 2**20)
    big = {"dense": [0.0] * 5, "sparse": {"f0": [1] * (limit // 2)}}
    answer = _post(url, big)  # Content-Length over the limit: refused before it is read
    assert answer.status_code == 413 and answer.json()["field"] == "body" and answer.json()["value"] > limit
    chunks = (b"[" + b"1, " * 1000 for _ in range(limit // 3000 + 2))  # no Content-Length: chunked
    answer = requests.post(f"{url}/predict", data=chunks, headers={"content-type": "application/json"}, timeout=30)
    assert answer.status_code == 413, answer.text
    many = {"batch": {"dense": [[0.0] * 5] * (MAX_SAMPLES + 1)}}
    answer = _post(url, many)
    assert answer.status_code == 413 and answer.json()["value"] == MAX_SAMPLES + 1


def test_a_bad_request_fails_alone_among_concurrent_good_ones(url: str, predictor: Predictor) -> None:
    good = _samples(1, seed=4)[0]
    want = float(predictor.predict([good])[0])
    bad = {"dense": [0.0] * 5, "sparse": {"f2": [31]}}
    results: list[tuple[str, int, object]] = []
    barrier = threading.Barrier(16)

    def client(kind: str) -> None:
        with requests.Session() as session:
            barrier.wait(30)
            for _ in range(5):
                answer = _post(url, good if kind == "good" else bad, session)
                results.append((kind, answer.status_code, answer.json()))

    threads = [threading.Thread(target=client, args=("good" if c % 2 else "bad",)) for c in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 80
    for kind, status, body in results:
        if kind == "good":
            assert status == 200 and abs(body["scores"][0] - want) <= 1e-6, body  # type: ignore[index]
        else:
            assert status == 422 and body["field"] == "sparse.f2[0]" and body["value"] == 31, body  # type: ignore[index]


def test_health_ready_info_and_metrics(url: str) -> None:
    assert requests.get(f"{url}/health", timeout=10).status_code == 200
    ready = requests.get(f"{url}/ready", timeout=10)
    assert ready.status_code == 200
    assert ready.json()["ready"] is True and ready.json()["workers"] == [{"state": "serving", "version": 0}]
    info = requests.get(f"{url}/info", timeout=10).json()
    assert info["model"]["feature_names"] == FEATURES and info["model"]["dense_in_features"] == 5
    _post(url, {"dense": [0.0] * 4})  # one 422 at least
    scrape = requests.get(f"{url}/metrics", timeout=10)
    assert scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in scrape.text.splitlines()
              if line and not line.startswith("#")}  # fmt: skip
    assert values['lightrec_serving_requests_total{code="422"}'] >= 1
    assert values['lightrec_serving_requests_total{code="200"}'] >= 1
    assert values['lightrec_serving_model_version{worker="0"}'] == 0
    assert values['lightrec_serving_worker_state{worker="0"}'] == 1
    assert values['lightrec_serving_request_latency_seconds{quantile="0.5"}'] > 0
    assert values["lightrec_serving_queue_limit"] == 512
