"""Compact-batch errors of ``lightrec serve`` (``request_forms.decode_body``, no server) name the field where the
client wrote it: a bad dense row is ``batch.dense[b]`` / ``batch.dense[b][j]`` (not the per-sample ``dense`` field
the compact form does not have), a batch too large or of no size names the key its size came from, and a bad
``batch.lengths.<f>`` is shown in the message as JSON (``[NaN]``, ``[true]``, ``null``), not as a Python repr."""

from __future__ import annotations

import json

import pytest
from torch import nn

from lightrec.inference import Predictor
from lightrec.serving.request_forms import Rejected, SampleColumns, decode_body

META = {"feature_names": ["a", "b"], "format": "torchscript", "dense_in_features": 2, "takes_dense": True,
        "tables": [{"feature_names": ["a"], "num_embeddings": 10}, {"feature_names": ["b"], "num_embeddings": 5}]}
BIG = "1" + "0" * 199 + "... (401 characters)"  # 10**400 shown truncated


@pytest.fixture(scope="module")
def predictor() -> Predictor:
    return Predictor(nn.Identity(), META)  # type: ignore[arg-type]  # decoding never runs the module


def _rejected(predictor: Predictor, body: object, max_samples: int = 8) -> Rejected:
    got = decode_body(predictor, body, max_samples)
    assert isinstance(got, Rejected), got
    assert len(got.message) < 600, got.message
    json.dumps(got.body(), allow_nan=False)  # always strict JSON
    return got


BAD_ROWS = [  # (body, sample index, field, value shown, words of the message)
    ({"batch": {"dense": [[0, 0], [0, 0, 0]]}}, 1, "batch.dense[1]", 3,
     "request 1: 'batch.dense[1]' must be a list of 2 floats, got 3 values"),
    ({"batch": {"dense": [[0, 0], [0]], "size": 2}}, 1, "batch.dense[1]", 1, "2 floats, got 1"),
    ({"batch": {"dense": [[0, 0], "x", [0, 0]]}}, 1, "batch.dense[1]", "str", "2 floats, got str"),
    ({"batch": {"dense": [None, [0, 0]], "size": 2}}, 0, "batch.dense[0]", None, "request 0: 'batch.dense[0]' is missing"),
    ({"batch": {"dense": [[0, 0], {"k": 1}]}}, 1, "batch.dense[1]", "dict", "got dict"),
    ({"batch": {"dense": [[0, 0], [0, "x"]]}}, 1, "batch.dense[1][1]", "x",
     "request 1: batch.dense[1][1]='x' is not a finite number"),
    ({"batch": {"dense": [[True, 0]]}}, 0, "batch.dense[0][0]", True, "batch.dense[0][0]=True is not a finite"),
    ({"batch": {"dense": [[0, 0], [0, 0], [0, 1e39]]}}, 2, "batch.dense[2][1]", 1e39, "|x| <= 3.402823e+38"),
    ({"batch": {"dense": [[0, 0], [10**400, 0]]}}, 1, "batch.dense[1][0]", BIG, "request 1: batch.dense[1][0]='1000"),
    (b'{"batch": {"dense": [[0, 0], [0, NaN]]}}', 1, "batch.dense[1][1]", "NaN", "batch.dense[1][1]='NaN' is not"),
    (b'{"batch": {"dense": [[-Infinity, 0]]}}', 0, "batch.dense[0][0]", "-Infinity", "not a finite number"),
]


@pytest.mark.parametrize(("body", "index", "field", "value", "words"), BAD_ROWS,
                         ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD_ROWS)])  # fmt: skip
def test_a_bad_dense_row_is_named_as_the_client_wrote_it(predictor: Predictor, body: object, index: int, field: str,
                                                         value: object, words: str) -> None:
    got = _rejected(predictor, body)
    assert (got.status, got.index, got.field, got.body()["value"]) == (422, index, field, value), got.body()
    assert words in got.message, got.message
    assert "'dense'" not in got.message and ": dense[" not in got.message, got.message


def test_good_dense_rows_are_accepted_as_before(predictor: Predictor) -> None:
    got = decode_body(predictor, {"batch": {"dense": [[0, 1.5], [-2, 3e38]], "lengths": {"a": [1, 0]},
                                            "ids": {"a": [9]}}}, 8)  # fmt: skip
    assert isinstance(got, SampleColumns), got
    assert (got.size, got.dense, got.lengths, got.ids) == (2, [0.0, 1.5, -2.0, 3e38], [[1, 0], [0, 0]], [[9], []])
    rows = decode_body(predictor, {"batch": {"dense": [(0, 1), (2, 3)]}}, 8)  # tuple rows, as Predictor takes
    assert isinstance(rows, SampleColumns) and rows.dense == [0.0, 1.0, 2.0, 3.0], rows


def _lengths(lengths: object, rows: int = 1) -> dict:
    return {"batch": {"dense": [[0, 0]] * rows, "lengths": {"a": lengths}, "ids": {"a": [1]}}}


BAD_LENGTHS = [  # (body, the lengths as the message shows them)
    (b'{"batch": {"dense": [[0, 0]], "lengths": {"a": [NaN]}, "ids": {"a": [1]}}}', "got [NaN]"),
    (b'{"batch": {"dense": [[0, 0]], "lengths": {"a": [Infinity]}, "ids": {"a": [1]}}}', "got [Infinity]"),
    (_lengths([True]), "got [true]"),
    (_lengths([None]), "got [null]"),
    (_lengths("1"), 'got "1"'),
    (_lengths({"k": 1}), 'got {"k": 1}'),
    (_lengths([1, -1], 2), "got [1, -1]"),
    ({"batch": {"dense": [[0, 0]], "ids": {"a": [1]}}}, "got null"),  # ids without lengths
    (_lengths([float("nan")] * 100), "got [" + ", ".join(["NaN"] * 100)[:79] + "... (500 characters)"),
    (_lengths(list(range(1000))), "got [0, 1, 2, 3, "),  # truncated, as before
]


@pytest.mark.parametrize(("body", "words"), BAD_LENGTHS, ids=[str(i) for i in range(len(BAD_LENGTHS))])
def test_bad_lengths_are_shown_as_json(predictor: Predictor, body: object, words: str) -> None:
    got = _rejected(predictor, body)
    assert (got.status, got.index, got.field) == (422, None, "batch.lengths.a"), got.body()
    assert "'batch.lengths.a' must be" in got.message and words in got.message, got.message
    assert len(got.message) < 250, got.message  # a long list stays truncated (80 characters)


SIZES = [  # (body, max_samples, status, field, value): a batch's size named by the key it came from
    ({"batch": {"dense": [[0, 0]] * 5}}, 4, 413, "batch.dense", 5),
    ({"batch": {"dense": [[0, 0]] * 5, "size": 5}}, 4, 413, "batch.size", 5),
    ({"batch": {"size": 10**4000}}, 4, 413, "batch.size", "1" + "0" * 199 + "... (4001 characters)"),
    ({"batch": {"lengths": {"b": [0] * 6, "a": [1] * 6}, "ids": {"a": [1] * 6}}}, 4, 413, "batch.lengths.b", 6),
    ({"batch": {"dense": []}}, 4, 422, "batch.dense", 0),
    ({"batch": {"lengths": {"a": []}}}, 4, 422, "batch.lengths.a", 0),
    ({"batch": {"lengths": {"a": 3}}}, 4, 422, "batch.lengths.a", "int"),
    ({"batch": {"size": 0}}, 4, 422, "batch.size", 0),
    ({"batch": {"size": "2"}}, 4, 422, "batch.size", "2"),
    ({"batch": {}}, 4, 422, "batch.size", None),  # nothing gives the size: the key to give
]


@pytest.mark.parametrize(("body", "max_samples", "status", "field", "value"), SIZES,
                         ids=[f"{s[3]}-{i}" for i, s in enumerate(SIZES)])  # fmt: skip
def test_a_batch_size_error_names_the_key_it_came_from(predictor: Predictor, body: object, max_samples: int,
                                                       status: int, field: str, value: object) -> None:
    got = _rejected(predictor, body, max_samples)
    assert (got.status, got.index, got.field, got.body()["value"]) == (status, None, field, value), got.body()
    words = f"limit of {max_samples}" if status == 413 else "give 'batch.size' (a positive int)"
    assert words in got.message, got.message


def test_a_batch_size_is_shown_as_json(predictor: Predictor) -> None:
    assert "the batch's size is null" in _rejected(predictor, {"batch": {}}).message
    assert "the batch's size is true" in _rejected(predictor, {"batch": {"size": True}}).message
    assert 'the batch\'s size is "2"' in _rejected(predictor, {"batch": {"size": "2"}}).message
    assert "the batch's size is NaN" in _rejected(predictor, b'{"batch": {"size": NaN}}').message
    long = _rejected(predictor, {"batch": {"size": "x" * 1000}})  # truncated as its value: by its characters
    assert f'the batch\'s size is "{"x" * 200}... (1000 characters)": give' in long.message, long.message
    assert long.body()["value"] == "x" * 200 + "... (1000 characters)"
