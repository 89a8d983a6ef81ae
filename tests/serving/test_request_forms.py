"""Request bodies -> samples -> one batch, without a server: every form scores exactly as
``Predictor.predict`` on the same samples, and every bad body becomes its own 4xx naming the
sample's index, the field and the value."""

from __future__ import annotations

import json

import pytest
import torch

from lightrec.inference import Predictor
from lightrec.inference.export import TensorInputModule, describe_model
from lightrec.serving.batching import ScoredRequest, assemble, split
from lightrec.serving.request_forms import Rejected, SampleColumns, decode_body
from tests.inference.helpers import FEATURES, dlrm

ROWS = {"f0": 40, "f1": 40, "f2": 31, "f3": 17}


def _predictor(missing_features: str = "empty") -> Predictor:
    model = dlrm()
    meta = {**describe_model(model), "takes_dense": True, "format": "torchscript"}
    return Predictor(TensorInputModule(model, FEATURES, True, False).eval(), meta, missing_features)


@pytest.fixture(scope="module")
def predictor() -> Predictor:
    return _predictor()


def _samples(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        sparse = {f: torch.randint(0, ROWS[f], (int(torch.randint(0, 4, (1,), generator=g)),), generator=g).tolist()
                  for f in FEATURES if torch.rand(1, generator=g).item() < 0.8}  # some features left out
        out.append({"dense": torch.rand(5, generator=g).tolist(), "sparse": sparse})
    return out


def _compact(samples: list[dict]) -> dict:
    lengths = {f: [len(s["sparse"].get(f, [])) for s in samples] for f in FEATURES}
    ids = {f: [i for s in samples for i in s["sparse"].get(f, [])] for f in FEATURES}
    return {"batch": {"dense": [s["dense"] for s in samples], "lengths": lengths, "ids": ids}}


def _score(predictor: Predictor, decoded: list[SampleColumns | Rejected]) -> list[ScoredRequest | Rejected]:
    batch = assemble(decoded, predictor.dense_in_features, predictor.is_weighted)
    scores = None
    if batch.dense is not None and batch.values is not None and batch.lengths is not None:
        scores = predictor.probabilities(batch.dense, batch.values, batch.lengths, batch.weights)
    return split(batch, scores, version=7)


def test_every_form_scores_like_predict(predictor: Predictor) -> None:
    samples = _samples(6)
    want = predictor.predict(samples).tolist()
    one_each = [decode_body(predictor, s, 100) for s in samples]
    as_list = decode_body(predictor, samples[:4], 100)
    compact = decode_body(predictor, _compact(samples[4:]), 100)
    text = decode_body(predictor, json.dumps(samples[0]).encode(), 100)  # a client without a JSON content type
    assert isinstance(text, SampleColumns) and text == one_each[0]
    for decoded in (one_each, [as_list, compact]):
        outputs = _score(predictor, decoded)
        got = [x for out in outputs for x in (out.scores if isinstance(out, ScoredRequest) else [])]
        assert got == want and all(isinstance(out, ScoredRequest) and out.version == 7 for out in outputs)
    assert decode_body(predictor, _compact(samples[:4]), 100) == as_list  # the two batch forms agree


def test_a_rejected_request_leaves_its_batch_intact(predictor: Predictor) -> None:
    samples = _samples(3, seed=1)
    bad = {"dense": [0.0] * 5, "sparse": {"f2": [31]}}
    outputs = _score(predictor, [decode_body(predictor, b, 100) for b in (samples[0], bad, samples[1:])])
    assert isinstance(outputs[1], Rejected) and outputs[1].field == "sparse.f2[0]"
    assert outputs[0].scores + outputs[2].scores == predictor.predict(samples).tolist()  # type: ignore[union-attr]
    alone = _score(predictor, [decode_body(predictor, bad, 100)])  # nothing valid: no forward at all
    assert isinstance(alone[0], Rejected)


BAD = [  # (body, status, index, field, value, words of the message)
    ("{not json", 400, None, "body", "{not json", "not JSON"),
    (42, 400, None, "body", "int", "JSON object"),
    ([], 400, None, "body", [], "empty list"),
    ({"dense": [0.0] * 5, "spares": {}}, 422, 0, "spares", "spares", "unknown keys"),
    ({"dense": [0.0] * 4}, 422, 0, "dense", 4, "5 floats, got 4"),
    ({"dense": [0.0, 1, float("nan"), 0, 0]}, 422, 0, "dense[2]", "NaN", "not a finite number"),
    ({"dense": [0.0, 1, 0, 0, 1e39]}, 422, 0, "dense[4]", 1e39, "not a finite number"),
    ({"dense": [10**400, 0, 0, 0, 0]}, 422, 0, "dense[0]", "1" + "0" * 199 + "... (401 characters)", "not a finite"),
    (b'{"dense": [0, 0, 0, 0, Infinity]}', 422, 0, "dense[4]", "Infinity", "not a finite number"),
    ("[" * 100_000 + "]" * 100_000, 400, None, "body", "[" * 80 + "...", "nested too deeply"),
    ({"dense": [0.0] * 5, "sparse": {"nope": [1]}}, 422, 0, "sparse", "nope", "unknown features"),
    ({"dense": [0.0] * 5, "sparse": {"f1": [3, "4"]}}, 422, 0, "sparse.f1[1]", "4", "non-integer id"),
    ({"dense": [0.0] * 5, "sparse": {"f1": [True]}}, 422, 0, "sparse.f1[0]", True, "non-integer id"),
    ({"dense": [0.0] * 5, "sparse": {"f1": [1.5]}}, 422, 0, "sparse.f1[0]", 1.5, "non-integer id"),
    ({"dense": [0.0] * 5, "sparse": {"f3": [-1]}}, 422, 0, "sparse.f3[0]", -1, "outside [0, 17)"),
    ({"dense": [0.0] * 5, "sparse": {"f3": [2**70]}}, 422, 0, "sparse.f3[0]", 2**70, "outside [0, 17)"),
    ({"dense": [0.0] * 5, "sparse": {"f0": 3}}, 422, 0, "sparse.f0", "int", "list of ints"),
    ({"dense": [0.0] * 5, "sparse": {"f0": [1]}, "weights": {"f0": [1.0]}}, 422, 0, "weights", None, "not weighted"),
    ([{"dense": [0.0] * 5}, {"dense": [0.0] * 5, "sparse": {"f2": [99]}}], 422, 1, "sparse.f2[0]", 99, "request 1"),
    ([{"dense": [0.0] * 5}] * 5, 413, None, "size", 5, "limit of 4"),
    ({"batch": [1]}, 400, None, "batch", "list", "'batch' must be an object"),
    ({"batch": {}, "x": 1}, 400, None, "x", "x", "only 'batch'"),
    ({"batch": {"dense": [[0.0] * 5], "idz": {}}}, 400, None, "batch.idz", "idz", "unknown keys"),
    ({"batch": {"dense": [[0.0] * 5], "ids": {"zz": [1]}}}, 422, None, "batch.ids", "zz", "unknown features"),
    ({"batch": {"dense": [[0.0] * 5] * 9}}, 413, None, "batch.dense", 9, "limit of 4"),
    ({"batch": {"dense": [[0.0] * 5, [0.0] * 6]}}, 422, 1, "batch.dense[1]", 6, "request 1"),
    ({"batch": {"dense": [[0.0] * 5] * 2, "size": 3}}, 422, None, "batch.dense", 2, "3 rows"),
    ({"batch": {"dense": [[0.0] * 5] * 2, "lengths": {"f1": [1]}, "ids": {"f1": [0]}}}, 422, None,
     "batch.lengths.f1", [1], "2 non-negative ints"),
    ({"batch": {"dense": [[0.0] * 5] * 2, "lengths": {"f1": [1, 1]}, "ids": {"f1": [0]}}}, 422, None,
     "batch.ids.f1", 1, "sum(lengths) = 2"),
    ({"batch": {"dense": [[0.0] * 5] * 3, "lengths": {"f1": [1, 0, 2]}, "ids": {"f1": [0, 5, 40]}}}, 422, 2,
     "batch.ids.f1[2]", 40, "request 2: batch.ids.f1[2]=40"),
    ({"batch": {"dense": [[0.0] * 5] * 2, "size": 0}}, 422, None, "batch.size", 0, "positive int"),
    ({"batch": {"dense": [[0.0] * 5, [0.0, 10**400, 0, 0, 0]]}}, 422, 1, "batch.dense[1][1]", "1" + "0" * 199 + "... "
     "(401 characters)", "request 1: batch.dense[1][1]="),
    ({"batch": {"dense": [[0.0] * 5], "y" * 10_000: {}}}, 400, None, "batch." + "y" * 194 + "... (10006 characters)",
     "y" * 200 + "... (10000 characters)", "unknown keys"),
]


@pytest.mark.parametrize(("body", "status", "index", "field", "value", "words"), BAD,
                         ids=[f"{b[1]}-{b[3]}-{i}" for i, b in enumerate(BAD)])  # fmt: skip
def test_bad_bodies_name_index_field_and_value(predictor: Predictor, body: object, status: int, index: int | None,
                                               field: str, value: object, words: str) -> None:
    got = decode_body(predictor, body, 4)
    assert isinstance(got, Rejected), got
    assert (got.status, got.index, got.field) == (status, index, field), got
    assert words in got.message and len(got.message) < 600
    assert got.body()["value"] == value, got.body()
    json.dumps(got.body(), allow_nan=False)  # always an answerable body, in strict JSON


def test_missing_features_error_mode() -> None:
    strict = _predictor("error")
    got = decode_body(strict, {"dense": [0.0] * 5, "sparse": {"f0": [1]}}, 10)
    assert isinstance(got, Rejected) and got.field == "sparse" and got.value == "f1"
    got = decode_body(strict, {"batch": {"dense": [[0.0] * 5]}}, 10)
    assert isinstance(got, Rejected) and got.field == "batch.lengths.f0"
    zero = {f: [0] for f in FEATURES}
    assert isinstance(decode_body(strict, {"batch": {"dense": [[0.0] * 5], "lengths": zero, "ids": {}}}, 10),
                      Rejected)  # ids left out but lengths given: each feature needs both
    full = {"batch": {"dense": [[0.0] * 5], "lengths": zero, "ids": {f: [] for f in FEATURES}}}
    assert isinstance(decode_body(strict, full, 10), SampleColumns)


def test_large_values_are_not_echoed(predictor: Predictor) -> None:
    got = decode_body(predictor, {"dense": [0.0] * 5, "sparse": {"f0": 7}, "weights": {"f0": list(range(10**4))}}, 4)
    assert isinstance(got, Rejected)
    huge = Rejected(422, "x", 0, "dense", list(range(10**5)))
    shown = huge.body()["value"]
    assert isinstance(shown, str) and len(shown) < 300 and "characters" in shown


def test_weighted_requests_of_every_form_score_like_predict() -> None:
    import lightrec
    from lightrec.models import DLRM
    from tests.inference.helpers import tables

    torch.manual_seed(0)
    model = DLRM(lightrec.EmbeddingBagCollection(tables(mean_last=False), is_weighted=True), dense_in_features=5,
                 dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1]).eval()  # fmt: skip
    meta = {**describe_model(model), "takes_dense": True, "format": "torchscript"}
    predictor = Predictor(TensorInputModule(model, FEATURES, True, True).eval(), meta)
    samples = _samples(5, seed=3)
    for s in samples[:3]:  # weights on some features; the others weigh 1
        s["weights"] = {f: [0.5 + k for k in range(len(ids))] for f, ids in s["sparse"].items() if f != "f1"}
    compact = _compact(samples[3:])
    compact["batch"]["weights"] = {"f0": [2.0] * len(compact["batch"]["ids"]["f0"])}
    for s in samples[3:]:
        s["weights"] = {"f0": [2.0] * len(s["sparse"].get("f0", []))} if s["sparse"].get("f0") else {}
    outputs = _score(predictor, [decode_body(predictor, b, 100) for b in (samples[0], samples[1:3], compact)])
    got = [x for out in outputs for x in out.scores]  # type: ignore[union-attr]
    assert got == predictor.predict(samples).tolist()


def _weighted_predictor() -> Predictor:
    import lightrec
    from lightrec.models import DLRM
    from tests.inference.helpers import tables

    torch.manual_seed(0)
    model = DLRM(lightrec.EmbeddingBagCollection(tables(mean_last=False), is_weighted=True), dense_in_features=5,
                 dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1]).eval()  # fmt: skip
    meta = {**describe_model(model), "takes_dense": True, "format": "torchscript"}
    return Predictor(TensorInputModule(model, FEATURES, True, True).eval(), meta)


WEIGHTS = [  # (body, index, field, value shown): weights JSON allows but float32 cannot hold
    (b'{"dense": [0,0,0,0,0], "sparse": {"f0": [1]}, "weights": {"f0": [NaN]}}', 0, "weights.f0[0]", "NaN"),
    (b'{"dense": [0,0,0,0,0], "sparse": {"f0": [1]}, "weights": {"f0": [-Infinity]}}', 0, "weights.f0[0]",
     "-Infinity"),
    ({"dense": [0] * 5, "sparse": {"f0": [1, 2]}, "weights": {"f0": [1, 10**400]}}, 0, "weights.f0[1]",
     "1" + "0" * 199 + "... (401 characters)"),
    ({"dense": [0] * 5, "sparse": {"f0": [1]}, "weights": {"f0": [1e39]}}, 0, "weights.f0[0]", 1e39),
    ({"batch": {"dense": [[0.0] * 5] * 3, "lengths": {"f0": [1, 0, 2]}, "ids": {"f0": [1, 2, 3]},
                "weights": {"f0": [1.0, 0.5, float("nan")]}}}, 2, "batch.weights.f0[2]", "NaN"),
    ({"batch": {"dense": [[0.0] * 5] * 2, "lengths": {"f0": [1, 1]}, "ids": {"f0": [1, 2]},
                "weights": {"f0": [10**400, 1.0]}}}, 0, "batch.weights.f0[0]", "1" + "0" * 199 + "... (401 characters)"),
]


@pytest.mark.parametrize(("body", "index", "field", "value"), WEIGHTS, ids=[w[2] + str(i) for i, w in enumerate(WEIGHTS)])
def test_weights_float32_cannot_hold_get_a_422(body: object, index: int, field: str, value: object) -> None:
    got = decode_body(_weighted_predictor(), body, 10)
    assert isinstance(got, Rejected), got
    assert (got.status, got.index, got.field, got.body()["value"]) == (422, index, field, value), got.body()
    assert "not a finite number" in got.message and len(got.message) < 600
    json.dumps(got.body(), allow_nan=False)


def test_a_nan_score_fails_its_request_alone(predictor: Predictor) -> None:
    good = _samples(2, seed=5)
    decoded = [decode_body(predictor, b, 10) for b in (good[0], [good[1], good[0]], good[1])]
    batch = assemble(decoded, predictor.dense_in_features, predictor.is_weighted)
    scores = predictor.probabilities(batch.dense, batch.values, batch.lengths, batch.weights)  # type: ignore[arg-type]
    scores[2] = float("nan")  # the second sample of the second request
    outputs = split(batch, scores, version=3)
    assert [type(o) for o in outputs] == [ScoredRequest, Rejected, ScoredRequest]
    bad = outputs[1]
    assert isinstance(bad, Rejected) and (bad.status, bad.index, bad.field) == (500, 1, "scores")
    assert bad.body()["value"] == "NaN" and "not a probability" in bad.message
    json.dumps(bad.body(), allow_nan=False)
    assert outputs[0].scores == [float(scores[0])] and outputs[2].scores == [float(scores[3])]  # type: ignore[union-attr]
