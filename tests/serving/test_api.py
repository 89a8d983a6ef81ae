"""``RecServingAPI`` called the way LitServe's loops call it, in this process: batched
(``decode_request`` -> ``batch`` -> ``predict`` -> ``unbatch`` -> ``encode_response``) and one
request at a time (``max_batch_size=1``: no ``batch``), with an updater that catches up at set-up."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from lightrec.inference import export, load
from lightrec.serving import PredictorMismatch, ServeConfig, ServedModel
from lightrec.serving.metrics import ServingMetrics, WorkerState
from tests.inference.helpers import dlrm, tables
from tests.serving.fake_updates import SwapPredictor

pytest.importorskip("litserve")
from lightrec.serving.api import RecServingAPI  # noqa: E402 - needs LitServe

GOOD = {"dense": [0.5] * 5, "sparse": {"f0": [1, 2], "f3": [16]}}
BAD = {"dense": [0.5] * 5, "sparse": {"f3": [17]}}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(dlrm(), tmp_path_factory.mktemp("api") / "m.pt")


@dataclass
class Bump:
    version: int
    published_at: float

    def apply(self, model: ServedModel) -> None:
        pass  # the rows stay: only the version moves


class TwoVersions:
    def __init__(self) -> None:
        self.pending = [Bump(1, time.time() - 1), Bump(2, time.time())]

    def poll(self) -> Bump | None:
        return self.pending.pop(0) if self.pending else None


def two_versions(model: ServedModel) -> TwoVersions:
    return TwoVersions()


def _api(artifact: Path, max_batch_size: int, factory: object = None) -> tuple[RecServingAPI, ServingMetrics]:
    metrics = ServingMetrics(api_servers=1, workers=1)
    config = ServeConfig(artifact, max_batch_size=max_batch_size, follow_interval_s=0.05)
    api = RecServingAPI(config, metrics, factory, threads=1)  # type: ignore[arg-type]
    api.setup("cpu")
    return api, metrics


def _body(response: object) -> tuple[int, dict]:
    return response.status_code, json.loads(response.body)  # type: ignore[attr-defined]


def test_batched_path_scores_good_requests_and_rejects_bad_ones(artifact: Path) -> None:
    api, metrics = _api(artifact, max_batch_size=8, factory=two_versions)
    assert api.model.version == 2  # caught up before serving
    assert metrics.worker_states() == [(WorkerState.SERVING, 2)]
    decoded = [api.decode_request(b) for b in (GOOD, BAD, [GOOD, GOOD], b"{oops")]
    outputs = api.unbatch(api.predict(api.batch(decoded)))
    answers = [_body(api.encode_response(o)) for o in outputs]
    want = float(load(artifact).predict([GOOD])[0])
    assert answers[0] == (200, {"scores": [want], "version": 2})
    assert answers[1][0] == 422 and answers[1][1]["field"] == "sparse.f3[0]" and answers[1][1]["value"] == 17
    assert answers[2][0] == 200 and answers[2][1]["scores"] == [want, want]
    assert answers[3][0] == 400 and answers[3][1]["field"] == "body"
    text = metrics.render(0, 1)
    assert "lightrec_serving_batch_size_sum 3" in text and "lightrec_serving_scored_requests_total 2" in text
    api.close()


def test_one_request_at_a_time(artifact: Path) -> None:
    api, _ = _api(artifact, max_batch_size=1)
    assert _body(api.encode_response(api.predict(api.decode_request(GOOD))))[1]["version"] == 0
    assert _body(api.encode_response(api.predict(api.decode_request(BAD))))[0] == 422


def test_health_turns_false_when_a_worker_is_damaged(artifact: Path) -> None:
    api, metrics = _api(artifact, max_batch_size=4)
    assert api.health() is True
    metrics.worker(0).set_damaged()
    assert api.health() is False


def test_a_predictor_with_other_tables_is_refused_between_decode_and_score(artifact: Path, tmp_path: Path) -> None:
    import lightrec
    from lightrec.models import DLRM

    smaller = [lightrec.EmbeddingBagConfig(name=t.name, num_embeddings=10, embedding_dim=t.embedding_dim,
                                           feature_names=t.feature_names) for t in tables()]  # fmt: skip
    other = export(DLRM(lightrec.EmbeddingBagCollection(smaller), dense_in_features=5, dense_arch_layer_sizes=[16, 8],
                        over_arch_layer_sizes=[8, 1]).eval(), tmp_path / "small.pt")  # fmt: skip
    api, _ = _api(artifact, max_batch_size=4)
    decoded = [api.decode_request(b) for b in ({"dense": [0.5] * 5, "sparse": {"f0": [35]}}, GOOD)]  # both valid now
    with pytest.raises(PredictorMismatch, match="id_spaces"):
        api.model.apply(SwapPredictor(load(other)))  # the follower's apply, landing between ScoringLoop's decode and forward
    answers = [_body(api.encode_response(o)) for o in api.unbatch(api.predict(api.batch(decoded)))]
    assert [a[0] for a in answers] == [200, 200] and answers[1][1]["version"] == 0


@dataclass
class HalfWrite:
    version: int = 1
    published_at: float = 1.0

    def apply(self, model: ServedModel) -> None:
        weight = next(p for name, p in model.predictor.module.named_parameters() if name.endswith("weight"))
        with torch.no_grad():
            weight.add_(1.0)
        raise OSError("device error half way")


class FailsOnce:
    def __init__(self) -> None:
        self.sent = False

    def poll(self) -> HalfWrite | None:
        if self.sent:
            return None
        self.sent = True
        return HalfWrite()


def fails_once(model: ServedModel) -> FailsOnce:
    return FailsOnce()


def test_a_worker_damaged_by_a_failed_update_answers_503_not_a_score(artifact: Path) -> None:
    from lightrec.serving import UpdateFailed

    metrics = ServingMetrics(api_servers=1, workers=1)
    api = RecServingAPI(ServeConfig(artifact, max_batch_size=4), metrics, fails_once, threads=1)
    with pytest.raises(UpdateFailed):
        api.setup("cpu")  # the catch-up applies the failing update
    assert api.health() is False and metrics.worker_states() == [(WorkerState.DAMAGED, 0)]
    answers = [_body(api.encode_response(o)) for o in api.predict(api.batch([api.decode_request(GOOD),
                                                                               api.decode_request(BAD)]))]
    assert answers[0][0] == 503 and "failed part way" in answers[0][1]["error"]
    assert answers[1][0] == 422  # a bad request keeps its own answer


class FailsAtTheFollowersFirstPoll:
    """Nothing new at set-up's catch-up; on the follower thread's first poll, an apply that fails part way."""

    def __init__(self) -> None:
        self.polls = 0

    def poll(self) -> HalfWrite | None:
        self.polls += 1
        return HalfWrite() if self.polls == 2 else None


def test_an_update_failing_while_set_up_ends_leaves_the_worker_damaged(
    artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set-up marked the worker serving after starting the follower: a failed apply in between was overwritten,
    and /health said 200 for a damaged model."""
    import lightrec.serving.api as api_module

    metrics = ServingMetrics(api_servers=1, workers=1)

    def damaged() -> bool:
        return metrics.worker_states()[0][0] == WorkerState.DAMAGED

    def slow_collect(*args: object) -> int:  # set-up's last steps take a while: the follower may poll meanwhile
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not damaged():
            time.sleep(0.01)
        return 0

    monkeypatch.setattr(api_module.gc, "collect", slow_collect)
    config = ServeConfig(artifact, max_batch_size=4, follow_interval_s=0.05)
    api = RecServingAPI(config, metrics, lambda model: FailsAtTheFollowersFirstPoll(), threads=1)
    api.setup("cpu")
    try:
        deadline = time.monotonic() + 10
        while not damaged():
            assert time.monotonic() < deadline, f"the failed apply left the worker {metrics.worker_states()}"
            time.sleep(0.01)
        time.sleep(0.2)  # nothing marks it serving again
        assert damaged() and api.health() is False
    finally:
        api.close()


def test_responses_are_strict_json_even_when_the_model_scores_nan(artifact: Path) -> None:
    api, _ = _api(artifact, max_batch_size=4)
    overflow = {"dense": [3.4e38] * 5, "sparse": {"f0": [1]}}  # valid float32 values; the forward makes NaN of them
    answers = [api.encode_response(o) for o in api.predict(api.batch([api.decode_request(b) for b in (GOOD, overflow)]))]
    assert [a.status_code for a in answers] == [200, 500]
    body = json.loads(answers[1].body, parse_constant=lambda c: pytest.fail(f"{c} in a response"))
    assert (body["index"], body["field"], body["value"]) == (0, "scores", "NaN")
