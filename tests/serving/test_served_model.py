"""The seam for live updates, in one process: updates land between batches (never half-applied),
the follower applies chains, refuses bad versions and keeps serving; metrics render in
Prometheus' text format."""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass

import pytest
import torch

from lightrec.inference import Predictor
from lightrec.inference.export import TensorInputModule, describe_model
from lightrec.serving import (
    ModelDamaged,
    PredictorMismatch,
    ServedModel,
    UpdateFailed,
    UpdateFollower,
    UpdateRefused,
)
from lightrec.serving.metrics import RING, ServingMetrics, WorkerState
from tests.inference.helpers import FEATURES, dlrm
from tests.serving.fake_updates import SwapPredictor

REQUEST = [{"dense": [0.5] * 5, "sparse": {"f0": [1, 2], "f1": [3], "f2": [4], "f3": [5]}}]


def _predictor(seed: int = 0, model: torch.nn.Module | None = None, missing_features: str = "empty") -> Predictor:
    model = model if model is not None else dlrm(seed)
    meta = {**describe_model(model), "takes_dense": True, "format": "torchscript"}
    return Predictor(TensorInputModule(model, FEATURES, True, False).eval(), meta, missing_features)


def _tables(predictor: Predictor) -> list[torch.Tensor]:
    return [p for name, p in predictor.module.named_parameters() if "embedding_bags" in name]


def _inputs(predictor: Predictor) -> tuple[torch.Tensor, ...]:
    dense = torch.tensor(REQUEST[0]["dense"]).reshape(1, 5)
    values = torch.tensor([1, 2, 3, 4, 5])
    return dense, values, torch.tensor([2, 1, 1, 1])


@dataclass
class RowPatch:
    """Adds ``delta`` to row 1..5 of every table, one table at a time, pausing between tables."""

    version: int
    published_at: float
    delta: float
    pause_s: float = 0.0
    fail_after_first: bool = False

    def apply(self, model: ServedModel) -> None:
        with torch.no_grad():
            for k, table in enumerate(_tables(model.predictor)):
                table[1:6] += self.delta
                if self.fail_after_first:
                    raise OSError("disk vanished")
                if k == 0:
                    time.sleep(self.pause_s)  # a batch arriving now must wait for the rest


class ListUpdater:
    def __init__(self, updates: list[object]) -> None:
        self.updates = list(updates)
        self.polls = 0

    def poll(self) -> RowPatch | None:
        self.polls += 1
        if not self.updates:
            return None
        item = self.updates.pop(0)
        if isinstance(item, Exception):
            raise item
        assert isinstance(item, RowPatch)
        return item


def test_no_batch_sees_a_half_applied_update() -> None:
    model = ServedModel(_predictor(), version=0, published_at=time.time())
    before, version = model.score(*_inputs(model.predictor))
    assert version == 0
    seen: list[tuple[float, int]] = []
    stop = threading.Event()

    def score_forever() -> None:
        while not stop.is_set():
            scores, v = model.score(*_inputs(model.predictor))
            seen.append((float(scores[0]), v))

    scorer = threading.Thread(target=score_forever)
    scorer.start()
    time.sleep(0.05)
    model.apply(RowPatch(version=1, published_at=time.time(), delta=0.5, pause_s=0.2))
    time.sleep(0.05)
    stop.set()
    scorer.join(10)
    after, version = model.score(*_inputs(model.predictor))
    assert version == 1 and float(after[0]) != float(before[0])
    allowed = {(float(before[0]), 0), (float(after[0]), 1)}
    assert set(seen) <= allowed and len(set(seen)) == 2, set(seen) - allowed  # before or after, never between


def test_replace_predictor_only_inside_apply() -> None:
    model = ServedModel(_predictor())
    with pytest.raises(RuntimeError, match="under ServedModel.apply's lock"):
        model.replace_predictor(_predictor(1))
    other = _predictor(1)

    @dataclass
    class Swap:
        version: int = 3
        published_at: float = 5.0

        def apply(self, m: ServedModel) -> None:
            m.replace_predictor(other)

    model.apply(Swap())
    assert model.predictor is other and (model.version, model.published_at) == (3, 5.0)
    assert torch.equal(model.score(*_inputs(other))[0], other.predict(REQUEST))


def _smaller_tables() -> Predictor:
    import lightrec
    from lightrec.models import DLRM
    from tests.inference.helpers import tables

    smaller = [lightrec.EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings - 5,
                                           embedding_dim=t.embedding_dim, feature_names=t.feature_names)
               for t in tables()]  # fmt: skip
    torch.manual_seed(0)
    return _predictor(model=DLRM(lightrec.EmbeddingBagCollection(smaller), dense_in_features=5,
                                 dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1]).eval())


@pytest.mark.parametrize("kind", ["table sizes", "missing features"])
def test_replace_predictor_refuses_one_that_accepts_other_requests(kind: str) -> None:
    served = _predictor()
    model = ServedModel(served, version=4, published_at=2.0)
    other = _smaller_tables() if kind == "table sizes" else _predictor(missing_features="error")
    with pytest.raises(PredictorMismatch, match="id_spaces|missing_features") as caught:
        model.apply(SwapPredictor(other))
    assert isinstance(caught.value, UpdateRefused) and isinstance(caught.value, ValueError)  # refused, not failed
    assert model.predictor is served and (model.version, model.published_at, model.damaged) == (4, 2.0, None)
    assert torch.equal(model.score(*_inputs(served))[0], served.predict(REQUEST))  # still serving


def test_follower_catches_up_refuses_and_keeps_serving() -> None:
    metrics = ServingMetrics(api_servers=1, workers=1)
    slot = metrics.worker(0)
    model = ServedModel(_predictor(), published_at=time.time())
    slot.set_model(model.version, model.published_at)
    now = time.time()
    updater = ListUpdater([RowPatch(1, now - 2.0, 0.1), RowPatch(2, now - 1.0, 0.1), ValueError("v3: sha256 mismatch"),
                           RowPatch(4, now, 0.1)])  # fmt: skip
    follower = UpdateFollower(model, updater, interval_s=0.05, metrics=slot)
    assert follower.catch_up() == 2 and model.version == 2  # stops at the refused version, still serving v2
    text = metrics.render(in_flight=0, queue_limit=8)
    assert 'lightrec_serving_updates_total{worker="0",outcome="refused"} 1' in text
    assert 'lightrec_serving_model_version{worker="0"} 2' in text
    lag = float(re.search(r'lightrec_serving_delta_lag_seconds\{worker="0"\} (\S+)', text).group(1))  # type: ignore[union-attr]
    assert 0.9 < lag < 60
    follower.start()
    deadline = time.monotonic() + 10
    while model.version != 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    follower.stop(5)
    assert model.version == 4 and updater.polls >= 5


def test_an_apply_that_fails_part_way_marks_the_worker_damaged() -> None:
    metrics = ServingMetrics(api_servers=1, workers=2)
    model = ServedModel(_predictor())
    follower = UpdateFollower(model, ListUpdater([RowPatch(1, 0.0, 1.0, fail_after_first=True)]), 1.0,
                              metrics.worker(1))
    with pytest.raises(UpdateFailed, match="applying version 1 failed part way"):
        follower.catch_up()
    assert model.version == 0
    assert [state for state, _ in metrics.worker_states()] == [WorkerState.STARTING, WorkerState.DAMAGED]
    assert model.damaged is not None and "disk vanished" in model.damaged
    with pytest.raises(ModelDamaged, match="scores nothing: applying version 1 failed part way"):
        model.score(*_inputs(model.predictor))  # never a score of a half-written model


_LINE = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*",?)*\})? (NaN|[+-]Inf|-?[0-9.e+-]+)$')


def test_latency_quantiles_are_nearest_rank() -> None:
    metrics = ServingMetrics(api_servers=1, workers=1)
    for i in range(1, 101):  # 0.01 .. 1.00 s: the q quantile is q itself
        metrics.record_request(0, 200, i / 100)
    text = metrics.render(in_flight=0, queue_limit=1, now=0.0)
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[0] != "#"}
    for q in ("0.5", "0.9", "0.99"):  # one rank too high before: 0.51, 0.91, 1.0
        assert values[f'lightrec_serving_request_latency_seconds{{quantile="{q}"}}'] == pytest.approx(float(q))
    two = ServingMetrics(api_servers=1, workers=1)
    two.record_request(0, 200, 1.0)
    two.record_request(0, 200, 2.0)
    assert 'lightrec_serving_request_latency_seconds{quantile="0.5"} 1' in two.render(in_flight=0, queue_limit=1, now=0.0)


def test_metrics_are_prometheus_text() -> None:
    metrics = ServingMetrics(api_servers=2, workers=2)
    for i in range(RING + 10):  # wraps the ring of API server 1
        metrics.record_request(1, 200, 0.001 * (i % 100))
    metrics.record_request(0, 422, 0.5)
    metrics.record_request(0, 418, 0.5)
    metrics.worker(0).record_batch(requests=3, samples=5, seconds=0.002)
    metrics.worker(1).record_batch(requests=1, samples=5000, seconds=0.02)
    text = metrics.render(in_flight=3, queue_limit=512, now=1e9, in_flight_bytes=4096, queue_limit_bytes=2**28)
    families = set()
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            families.add(line.split()[2])
        elif not line.startswith("# HELP"):
            assert _LINE.match(line), line
    assert {"lightrec_serving_requests_total", "lightrec_serving_batch_size", "lightrec_serving_in_flight",
            "lightrec_serving_request_latency_seconds", "lightrec_serving_delta_lag_seconds"} <= families
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[0] != "#"}
    assert values['lightrec_serving_requests_total{code="200"}'] == RING + 10
    assert values['lightrec_serving_requests_total{code="other"}'] == 1
    assert values["lightrec_serving_request_latency_seconds_count"] == RING + 12
    assert values['lightrec_serving_request_latency_seconds{quantile="0.99"}'] == pytest.approx(0.099)  # 2 slow in 1026
    assert values['lightrec_serving_batch_size_bucket{le="8"}'] == 1
    assert values['lightrec_serving_batch_size_bucket{le="4096"}'] == 1
    assert values['lightrec_serving_batch_size_bucket{le="+Inf"}'] == values["lightrec_serving_batch_size_count"] == 2
    assert values["lightrec_serving_scored_requests_total"] == 4
    assert math.isnan(values['lightrec_serving_delta_lag_seconds{worker="1"}'])
    assert values["lightrec_serving_in_flight_bytes"] == 4096 and values["lightrec_serving_queue_limit_bytes"] == 2**28


def test_model_age_is_nan_until_a_worker_has_loaded_its_model() -> None:
    metrics = ServingMetrics(api_servers=1, workers=2)
    metrics.worker(1).set_model(version=0, published_at=1e9 - 30)
    text = metrics.render(in_flight=0, queue_limit=8, now=1e9)
    assert 'lightrec_serving_model_age_seconds{worker="0"} NaN' in text  # not now - 0: 31 years
    assert 'lightrec_serving_model_age_seconds{worker="1"} 30' in text
