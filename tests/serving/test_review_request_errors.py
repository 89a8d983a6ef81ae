"""Request-decoding errors of ``lightrec serve`` (``request_forms.decode_body``, no server): a compact batch's bad
id is named where the client wrote it (``batch.ids.<feature>[k]`` and the sample it belongs to), not as a
per-sample ``sparse`` field its request does not have; a JSON integer past Python's 4300 digits gets a 400 that says
a number is too long and where, not Python's int-string error; and malformed bodies of every kind become a 4xx."""

from __future__ import annotations

import json

import pytest
from torch import nn

from lightrec.inference import Predictor
from lightrec.serving.request_forms import Rejected, SampleColumns, decode_body

ROWS = {"a": 10, "b": 1000}  # b: a managed-collision table taking raw ids in [0, 1000)
META = {"feature_names": ["a", "b"], "format": "torchscript", "dense_in_features": 2, "takes_dense": True,
        "tables": [{"feature_names": ["a"], "num_embeddings": 10},
                   {"feature_names": ["b"], "num_embeddings": 5, "id_space": 1000}]}  # fmt: skip


@pytest.fixture(scope="module")
def predictor() -> Predictor:
    return Predictor(nn.Identity(), META)  # type: ignore[arg-type]  # decoding never runs the module


def _batch(lengths: list[int], ids: list[object], feature: str = "a") -> dict:
    return {"batch": {"dense": [[0.0, 1.0]] * len(lengths), "lengths": {feature: lengths}, "ids": {feature: ids}}}


BAD_IDS = [  # (body, sample index, field, value shown, words)
    (_batch([1, 0, 2], [0, 5, 10]), 2, "batch.ids.a[2]", 10, "request 2: batch.ids.a[2]=10 is outside [0, 10)"),
    (_batch([2, 1], [0, 1, -1]), 1, "batch.ids.a[2]", -1, "hash or take ids modulo"),
    (_batch([1, 2], [3, "x", 4]), 1, "batch.ids.a[1]", "x", "batch.ids.a[1]='x' is not an integer id"),
    (_batch([1], [True]), 0, "batch.ids.a[0]", True, "is not an integer id"),
    (_batch([0, 2], [[1], 2]), 1, "batch.ids.a[0]", [1], "is not an integer id"),
    (_batch([0, 0, 1], [1.0]), 2, "batch.ids.a[0]", 1.0, "is not an integer id"),
    (_batch([1, 1], [4, 10**300]), 1, "batch.ids.a[1]", "1" + "0" * 199 + "... (301 characters)", "outside [0, 10)"),
    (_batch([1, 1], [999, 1000], "b"), 1, "batch.ids.b[1]", 1000, "managed-collision table takes raw ids"),
    (b'{"batch": {"dense": [[0, 0]], "lengths": {"a": [1]}, "ids": {"a": [NaN]}}}', 0, "batch.ids.a[0]", "NaN",
     "is not an integer id"),
]


@pytest.mark.parametrize(("body", "index", "field", "value", "words"), BAD_IDS,
                         ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD_IDS)])  # fmt: skip
def test_a_compact_batch_bad_id_is_named_as_the_client_wrote_it(predictor: Predictor, body: object, index: int,
                                                                field: str, value: object, words: str) -> None:
    got = decode_body(predictor, body, 8)
    assert isinstance(got, Rejected), got
    assert (got.status, got.index, got.field, got.body()["value"]) == (422, index, field, value), got.body()
    assert words in got.message and "sparse" not in got.message and len(got.message) < 600, got.message
    json.dumps(got.body(), allow_nan=False)


def test_the_per_sample_form_keeps_predictors_field(predictor: Predictor) -> None:
    got = decode_body(predictor, [{"dense": [0, 0]}, {"dense": [0, 0], "sparse": {"a": [1, 10]}}], 8)
    assert isinstance(got, Rejected) and (got.index, got.field, got.value) == (1, "sparse.a[1]", 10), got
    assert got.message.startswith("request 1: feature 'a' has id 10, outside [0, 10)"), got.message
    good = decode_body(predictor, _batch([1, 0, 2], [0, 5, 9]), 8)  # in range: accepted as before
    assert isinstance(good, SampleColumns) and good.ids[0] == [0, 5, 9] and good.lengths[0] == [1, 0, 2]


LONG = "9" * 5000
LONG_NUMBERS = [  # (body text, the number, its line): the number's only (or last) occurrence is where it stands
    ('{"dense": [0, 0], "sparse": {"a": [' + LONG + "]}}", LONG, 1),
    ('{"dense": [0,\n -' + LONG + "]}", "-" + LONG, 2),
    ('{"batch": {"size": 1, "dense": [[0, 0]],\n  "lengths": {"a": [1]}, "ids": {"a": [1' + "0" * 4300 + "]}}}",
     "1" + "0" * 4300, 2),
    # digits in a string and a long float's fraction and exponent are no integer: the one after them is
    ('{"dense": [1.' + LONG + ", 1e" + LONG + '], "sparse": {"' + LONG + '": [' + LONG + "]}}", LONG, 1),
    ('{"sparse": {"a\\"' + LONG + '\\\\": [' + LONG + "]}}", LONG, 1),  # escaped quotes and backslashes
]


@pytest.mark.parametrize(("text", "number", "line"), LONG_NUMBERS,
                         ids=["id", "negative-dense", "compact-4301", "after-floats-and-strings", "after-escapes"])
@pytest.mark.parametrize("as_bytes", [False, True], ids=["str", "bytes"])
def test_a_too_long_json_integer_says_so_and_where(predictor: Predictor, text: str, number: str, line: int,
                                                   as_bytes: bool) -> None:
    got = decode_body(predictor, text.encode() if as_bytes else text, 8)
    assert isinstance(got, Rejected), got
    assert (got.status, got.index, got.field, got.value) == (400, None, "body", number), got.message
    char = text.rindex(number)
    column = char + 1 if line == 1 else char - text.rindex("\n", 0, char)
    where = f"a number of {len(number.lstrip('-'))} digits at line {line} column {column} (char {char})"
    assert where in got.message and "64-bit" in got.message and "float32" in got.message, got.message
    assert "set_int_max_str_digits" not in got.message and len(got.message) < 600, got.message
    assert got.body()["value"] == number[:200] + f"... ({len(number)} characters)"  # shown truncated
    json.dumps(got.body(), allow_nan=False)


@pytest.mark.parametrize(("body", "error"), [('{"dense": ["' + LONG + '"], oops', "Expecting"),
                                             ('{"dense": "' + LONG, "Unterminated string"),
                                             (b'{"dense": [' + LONG.encode() + b", \xff]}", "can't decode")],
                         ids=["syntax", "unterminated-string", "not-utf8"])
def test_other_unparsable_bodies_keep_the_not_json_error(predictor: Predictor, body: object, error: str) -> None:
    got = decode_body(predictor, body, 8)  # long digits, but the body fails for another reason first
    assert isinstance(got, Rejected) and got.status == 400, got
    assert got.message.startswith("the body is not JSON (") and error in got.message, got.message


CRASHERS = [  # bodies that must come back as a 4xx naming a field, never as an exception
    {"batch": {"dense": [[0, 0], "x", 3, None]}},
    {"batch": {"dense": [None, [0, 0]], "size": 2}},
    {"batch": {"size": 10**4000}},
    {"batch": {"dense": [[0, 0]], "lengths": {"a": [True]}, "ids": {"a": [1]}}},
    {"batch": {"dense": [[0, 0]], "lengths": {"a": [10**30]}, "ids": {"a": [1]}}},
    {"batch": {"dense": [[0, 0]], "lengths": {"a": [1]}, "ids": {"a": {"k": 1}}}},
    {"batch": {"dense": {"k": 1}}},
    {"batch": {"lengths": {"a": 3}}},
    b'{"batch": {"size": NaN}}',
    b'{"batch": {"dense": [[0, 0]], "lengths": {"a": [NaN]}, "ids": {"a": [1]}}}',
    b'{"dense": [0, -Infinity]}',
    b'{"dense": [0, 0], "sparse": {"a": [[[[[[1]]]]]]}}',
    b'\xff\xfe{"dense"',
    '{"batch": {"size": 1}, "batch": 3}',
]


@pytest.mark.parametrize("body", CRASHERS, ids=[str(i) for i in range(len(CRASHERS))])
def test_malformed_bodies_get_a_4xx(predictor: Predictor, body: object) -> None:
    got = decode_body(predictor, body, 8)
    assert isinstance(got, Rejected) and 400 <= got.status < 500 and got.field, got
    json.dumps(got.body(), allow_nan=False)
