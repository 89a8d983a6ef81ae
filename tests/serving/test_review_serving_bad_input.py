"""Bad input to ``lightrec serve`` that the other serving tests leave out, through one real server on
127.0.0.1 (started by the CLI, as a user does): a compact batch whose ``batch.size`` is a long value
(a 40000-character string, a list of 10000 numbers, a 4000-digit number) gets its 4xx with the value
shown truncated -- in ``value`` and in the message -- instead of echoing the whole value back (up to
the payload limit, 8 MB by default), and the server keeps scoring. Compact-form ``lengths`` of thousands
of digits get their 422 too: their sum was printed whole in the message, and one past the 4300 digits
Python prints (two 4300-digit lengths) made the request a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from lightrec.inference import export
from tests.inference.helpers import dlrm
from tests.serving.server_process import free_port, running_server, serve_command

requests = pytest.importorskip("requests")
pytest.importorskip("litserve")

MAX_SAMPLES = 64


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    artifact = export(dlrm(), tmp_path_factory.mktemp("review") / "dlrm.pt")
    port = free_port()
    command = serve_command(artifact, port, "--max-samples", str(MAX_SAMPLES), "--max-payload-mb", "0.5")
    with running_server(command, port, tmp_path_factory.mktemp("log") / "server.log") as base:
        yield base


def _post(url: str, body: object) -> requests.Response:
    return requests.post(f"{url}/predict", data=json.dumps(body), headers={"content-type": "application/json"},
                         timeout=30)


LONG_SIZES = [  # (batch.size, status, value shown, its length as the truncation names it)
    ("x" * 40_000, 422, "x" * 200, 40_000),
    ([7] * 10_000, 422, "[7, 7, 7", 30_000),
    ({"k" * 20_000: 1}, 422, '{"' + "k" * 198, 20_007),
    (-(10**4000), 422, "-1" + "0" * 198, 4002),
    (10**4000, 413, "1" + "0" * 199, 4001),  # a positive count, but past --max-samples
]


@pytest.mark.parametrize(("size", "status", "start", "length"), LONG_SIZES,
                         ids=["string", "list", "object", "negative-number", "huge-number"])  # fmt: skip
def test_a_long_batch_size_is_not_echoed_back_whole(url: str, size: object, status: int, start: str,
                                                    length: int) -> None:
    answer = _post(url, {"batch": {"dense": [[0.0] * 5], "size": size}})
    assert answer.status_code == status, answer.text[:300]
    error = answer.json()
    assert error["index"] is None and error["field"] in ("batch.size", "size"), error["field"]
    assert error["value"].startswith(start) and error["value"].endswith(f"... ({length} characters)"), error["value"]
    assert f"({length} characters)" in error["error"], error["error"][:300]  # the message truncates it too
    assert len(error["error"]) < 600 and len(answer.content) < 1500, len(answer.content)
    good = _post(url, {"dense": [0.1] * 5, "sparse": {"f0": [1]}})
    assert good.status_code == 200 and len(good.json()["scores"]) == 1, good.text


HUGE_LENGTHS = [  # (lengths of f0 in a batch of two samples, digits of their sum)
    ([10**4000, 0], 4001),  # shown whole in the message before
    ([9 * 10**4299, 9 * 10**4299], 4301),  # JSON takes 4300 digits; their 4301-digit sum failed to print: a 500
]


@pytest.mark.parametrize(("lengths", "digits"), HUGE_LENGTHS, ids=["4001-digits", "4301-digits"])
def test_huge_lengths_get_a_422_without_echoing_their_sum(url: str, lengths: list[int], digits: int) -> None:
    body = {"batch": {"dense": [[0.0] * 5] * 2, "lengths": {"f0": lengths}, "ids": {"f0": [1]}}}
    answer = _post(url, body)
    assert answer.status_code == 422, answer.text[:300]
    error = answer.json()
    assert (error["index"], error["field"], error["value"]) == (None, "batch.ids.f0", 1), error
    assert "sum(lengths)" in error["error"] and len(answer.content) < 1500, error["error"][:300]
