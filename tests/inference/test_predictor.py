"""``Predictor``'s request checks at the edges of numbers and sizes: a number JSON allows but float32
cannot hold (``10**400``, ``1e39``, NaN, infinities) is a ``RequestError`` naming the index, the field
and the value -- never an ``OverflowError`` or an ``inf`` fed to the model -- and a huge offending
value is shown truncated in the message and the field. ``Predictor.rules`` tells predictors that
accept the same requests from those that do not."""

from __future__ import annotations

import json
import math

import pytest
import torch

import lightrec
from lightrec.inference import Predictor, RequestError
from lightrec.inference.export import TensorInputModule, describe_model
from lightrec.inference.predictor import FLOAT32_MAX, finite_float32, shown
from lightrec.models import DLRM
from tests.inference.helpers import FEATURES, dlrm, tables

GOOD = {"dense": [0.5] * 5, "sparse": {"f0": [1, 2], "f3": [16]}}


def _predictor(model: torch.nn.Module | None = None, weighted: bool = False, missing_features: str = "empty") -> Predictor:
    model = model if model is not None else dlrm()
    meta = {**describe_model(model), "takes_dense": True, "format": "torchscript"}
    return Predictor(TensorInputModule(model, FEATURES, True, weighted).eval(), meta, missing_features)


def _weighted() -> Predictor:
    torch.manual_seed(0)
    model = DLRM(lightrec.EmbeddingBagCollection(tables(mean_last=False), is_weighted=True), dense_in_features=5,
                 dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1]).eval()  # fmt: skip
    return _predictor(model, weighted=True)


def _error(predictor: Predictor, request: dict, index: int = 1) -> RequestError:
    with pytest.raises(RequestError) as caught:
        predictor.predict([GOOD, request] if index == 1 else [request])
    return caught.value


@pytest.mark.parametrize("x", [10**400, -(10**400), 1e39, -1e39, 2**128, float("nan"), float("inf"), float("-inf"),
                               "1.0", True, None])  # fmt: skip
def test_dense_values_float32_cannot_hold_are_refused(x: object) -> None:
    error = _error(_predictor(), {"dense": [0.0, 0.0, x, 0.0, 0.0]})
    assert (error.index, error.field) == (1, "dense[2]") and error.value is x
    assert str(error).startswith("request 1: dense[2]=") and "not a finite number" in str(error)
    assert len(str(error)) < 400


@pytest.mark.parametrize("x", [10**400, 1e39, float("nan"), float("inf"), "2"])
def test_weights_float32_cannot_hold_are_refused(x: object) -> None:
    predictor = _weighted()
    error = _error(predictor, {"dense": [0.0] * 5, "sparse": {"f0": [1, 2]}, "weights": {"f0": [0.5, x]}})
    assert (error.index, error.field) == (1, "weights.f0[1]") and error.value is x
    assert "not a finite number" in str(error) and len(str(error)) < 400


def test_the_largest_float32_numbers_are_accepted() -> None:
    predictor = _weighted()
    request = {"dense": [FLOAT32_MAX, -FLOAT32_MAX, 10**38, 0, 1], "sparse": {"f0": [1]}, "weights": {"f0": [FLOAT32_MAX]}}
    checked = predictor.check_request(request)
    assert checked.dense[:3] == [FLOAT32_MAX, -FLOAT32_MAX, 1e38] and checked.weights == {"f0": [FLOAT32_MAX]}
    assert [finite_float32(x) for x in (1, 2.5, 10**400, math.nan, False)] == [1.0, 2.5, None, None, None]


def test_large_offending_values_are_truncated_in_messages_and_fields() -> None:
    predictor = _weighted()
    long_key = "k" * 100_000
    cases = [
        ({**GOOD, long_key: 1}, long_key),  # an unknown key: its name is the field
        ({"dense": [0.0] * 5, "sparse": {long_key: [1]}}, "sparse"),
        ({"dense": [0.0] * 5, "sparse": {"f0": ["x" * 100_000]}}, "sparse.f0[0]"),
        ({"dense": [0.0] * 5, "sparse": {"f0": [10**4000]}}, "sparse.f0[0]"),  # out of range, 4001 digits
        ({"dense": [0.0, "y" * 100_000, 0, 0, 0]}, "dense[1]"),
        ({"dense": [0.0] * 5, "sparse": {"f0": [1]}, "weights": {"f0": list(range(100_000))}}, "weights.f0"),
        ({"dense": [0.0] * 5, "sparse": {"f0": [1]}, "weights": {long_key: [1.0]}}, "weights." + long_key),
    ]
    for request, field in cases:
        error = _error(predictor, request)
        assert len(str(error)) < 700, str(error)[:300]
        assert error.field is not None and len(error.field) < 300
        assert error.field == field or (error.field.startswith(field[:100]) and "characters)" in error.field)
    assert shown(long_key) == "k" * 200 + "... (100000 characters)"


def test_shown_values_are_strict_json() -> None:
    for value in (math.nan, math.inf, -math.inf, [1.0, math.nan], 10**400):
        json.dumps(shown(value), allow_nan=False)
    assert [shown(x) for x in (math.nan, math.inf, -math.inf)] == ["NaN", "Infinity", "-Infinity"]
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert "nested too deeply" in str(shown(deep))


def test_rules_tell_predictors_that_accept_the_same_requests() -> None:
    assert _predictor(dlrm(0)).rules == _predictor(dlrm(1)).rules  # other weights, same inputs
    assert _predictor().rules != _predictor(missing_features="error").rules
    smaller = [lightrec.EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings // 2,
                                           embedding_dim=t.embedding_dim, feature_names=t.feature_names)
               for t in tables()]  # fmt: skip
    model = DLRM(lightrec.EmbeddingBagCollection(smaller), dense_in_features=5, dense_arch_layer_sizes=[16, 8],
                 over_arch_layer_sizes=[8, 1]).eval()  # fmt: skip
    rules, other = _predictor().rules, _predictor(model).rules
    assert rules.feature_names == other.feature_names and rules.id_spaces != other.id_spaces
