"""The pipes between a server's HTTP processes and its workers: responses arrive in order, several
from one hop to a thread; a quiet pipe answers None (LitServe polls again); the server's run
replaces LitServe's Manager queues by pipes. (That the transport reaches the spawned workers whole
is what every test with a real server shows.)"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
from pathlib import Path

import pytest

pytest.importorskip("litserve")
from lightrec.serving import transport as transport_module  # noqa: E402 - needs LitServe
from lightrec.serving.transport import PipeQueueServer, PipeTransport  # noqa: E402


def test_responses_arrive_in_order_many_per_hop(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = multiprocessing.get_context("spawn")
    pipes = [ctx.Queue(), ctx.Queue()]
    transport = PipeTransport(pipes)
    hops = []
    real = transport_module._drain
    monkeypatch.setattr(transport_module, "_drain", lambda pipe, wait: hops.append(wait) or real(pipe, wait))
    for uid in "abcd":
        transport.send((uid, ("ok", 1)), consumer_id=1)

    async def receive(n: int, timeout: float | None = None) -> list[object]:
        return [await transport.areceive(1, timeout) for _ in range(n)]

    got = asyncio.run(receive(4))
    assert [item[0] for item in got] == ["a", "b", "c", "d"]  # type: ignore[index]
    assert len(hops) <= 2  # the pipe's feeder thread may not have written them all by the first hop
    assert asyncio.run(transport.areceive(1, None)) is None  # nothing within a second: None, LitServe asks again
    with pytest.raises(queue.Empty):
        asyncio.run(transport.areceive(0, timeout=0.05))
    transport.close()
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(transport.areceive(0))
    assert asyncio.run(PipeTransport(pipes).areceive(0, timeout=5)) is None  # a receiver elsewhere gets the sentinel


def test_the_server_swaps_litserves_manager_queues_for_pipes(tmp_path: Path) -> None:
    from lightrec.inference import export
    from lightrec.serving import ServeConfig
    from lightrec.serving.server import build_server
    from tests.inference.helpers import dlrm

    built = build_server(ServeConfig(export(dlrm(), tmp_path / "m.pt"), accelerator="cpu"))
    server = built.server
    assert isinstance(server, PipeQueueServer)
    manager = server._init_manager(2)  # what run() calls before it starts any process
    try:
        assert isinstance(server._transport, PipeTransport)
        assert all(isinstance(q, type(multiprocessing.get_context("spawn").Queue())) for q in server.litapi_request_queues.values())
    finally:
        manager.shutdown()


def test_a_batch_of_answers_is_one_message_and_arrives_as_its_items() -> None:
    pipes = [multiprocessing.get_context("spawn").Queue()]
    transport = PipeTransport(pipes)
    transport.send_many([("a", ("ok", 1)), ("b", ("ok", 2))], consumer_id=0)
    transport.send(("c", ("ok", 3)), consumer_id=0)

    async def receive(n: int) -> list[object]:
        return [await transport.areceive(0, 5) for _ in range(n)]

    assert [item[0] for item in asyncio.run(receive(3))] == ["a", "b", "c"]  # type: ignore[index]


def test_collect_takes_what_is_queued_waits_the_batch_timeout_and_stops_on_the_sentinel() -> None:
    import time

    from litserve.loops.base import _SENTINEL_VALUE

    from lightrec.serving.scoring_loop import collect

    requests: queue.Queue[object] = queue.Queue()
    for uid in range(5):
        requests.put((0, uid, 0.0, b"{}"))
    batch, stop = collect(requests, 3, 10.0)  # a full batch returns at once
    assert [r[1] for r in batch] == [0, 1, 2] and not stop
    start = time.monotonic()
    batch, stop = collect(requests, 8, 0.05)  # then what is queued, waiting the batch timeout for more
    assert [r[1] for r in batch] == [3, 4] and not stop
    assert 0.04 <= time.monotonic() - start < 5
    requests.put((0, 5, 0.0, b"{}"))
    requests.put(_SENTINEL_VALUE)
    batch, stop = collect(requests, 8, 0.05)  # the requests before the sentinel still come
    assert [r[1] for r in batch] == [5] and stop


def test_dispatch_answers_worker_errors_without_unpickling_them() -> None:
    from fastapi import HTTPException
    from litserve.utils import LitAPIStatus

    from lightrec.serving.transport import EncodedResponse, PredictDispatch

    class Server:  # what PredictDispatch uses of a LitServer
        def __init__(self, answer: tuple[object, str]) -> None:
            self.response_buffer: dict[object, object] = {}
            self.answer = answer
            self.litapi_request_queues = {"/predict": self}

        def put(self, item: tuple[int, int, float, bytes]) -> None:  # the worker answers at once
            slot = self.response_buffer[item[1]]
            slot.response = self.answer  # type: ignore[attr-defined]
            slot.event.set()  # type: ignore[attr-defined]

    class App:
        response_queue_id = 0

    def answer(response: object, status: str) -> EncodedResponse:
        dispatch = PredictDispatch("/predict")
        dispatch.bind(Server((response, status)))  # type: ignore[arg-type]
        return asyncio.run(dispatch.answer(App(), {}, b"{}"))

    assert answer(EncodedResponse(200, b'{"scores": [0.5]}'), LitAPIStatus.OK) == (200, b'{"scores": [0.5]}')
    late = answer(HTTPException(504, "waited too long"), LitAPIStatus.ERROR)
    assert late.status_code == 504 and b"waited too long" in late.body
    assert answer(b"\x80\x04pickled exception", LitAPIStatus.ERROR).status_code == 500
    with pytest.raises(RuntimeError, match="bind"):
        asyncio.run(PredictDispatch("/predict").answer(App(), {}, b"{}"))


def test_dispatch_keeps_litserves_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import litserve.server
    from litserve.utils import LitAPIStatus

    from lightrec.serving.transport import EncodedResponse, PredictDispatch

    class Server:
        def __init__(self) -> None:
            self.response_buffer: dict[object, object] = {}
            self.litapi_request_queues = {"/predict": self}

        def put(self, item: tuple[int, int, float, bytes]) -> None:
            slot = self.response_buffer[item[1]]
            slot.response = (EncodedResponse(200, b"{}"), LitAPIStatus.OK)  # type: ignore[attr-defined]
            slot.event.set()  # type: ignore[attr-defined]

    class App:
        response_queue_id = 0

    dispatch = PredictDispatch("/predict")
    dispatch.bind(Server())  # type: ignore[arg-type]
    assert asyncio.run(dispatch.answer(App(), {}, b"{}")).status_code == 200  # no LIT_SERVER_API_KEY: all pass
    monkeypatch.setattr(litserve.server, "LIT_SERVER_API_KEY", "s3cret")
    for headers in ({}, {b"x-api-key": b"nope"}):
        assert asyncio.run(dispatch.answer(App(), headers, b"{}")).status_code == 401
    assert asyncio.run(dispatch.answer(App(), {b"x-api-key": b"s3cret"}, b"{}")).status_code == 200


def test_the_scoring_loop_answers_a_batch_in_one_message_504s_stale_requests_and_survives_a_failed_batch() -> None:
    import time

    from litserve.loops.base import _SENTINEL_VALUE
    from litserve.utils import LitAPIStatus

    from lightrec.serving.scoring_loop import ScoringLoop

    class API:  # the LitAPI methods the loop calls; doubles each body, fails on a body of 0
        request_timeout, max_batch_size, batch_timeout = 30.0, 8, 0.0

        def decode_request(self, body: int) -> int:
            return body

        def batch(self, xs: list[int]) -> list[int]:
            return xs

        def predict(self, xs: list[int]) -> list[int]:
            if 0 in xs:
                raise ValueError("a broken batch")
            return [2 * x for x in xs]

        def unbatch(self, ys: list[int]) -> list[int]:
            return ys

        def encode_response(self, y: int) -> int:
            return y

    class Transport(PipeTransport):
        def __init__(self) -> None:
            self.messages: list[tuple[int, list[object]]] = []

        def send_many(self, items: list[object], consumer_id: int) -> None:
            self.messages.append((consumer_id, items))

    requests: queue.Queue[object] = queue.Queue()
    now = time.monotonic()
    for consumer, uid, arrived, body in [(0, "a", now, 1), (1, "b", now, 2), (0, "stale", now - 60, 3), (0, "c", now, 4)]:
        requests.put((consumer, uid, arrived, body))
    transport = Transport()
    loop = ScoringLoop()

    def run() -> None:
        requests.put(_SENTINEL_VALUE)
        loop.run_batched_loop(API(), requests, transport, None)  # returns at the sentinel

    run()
    answers = {consumer: {uid: answer for uid, answer in items} for consumer, items in transport.messages}  # type: ignore[misc]
    assert len(transport.messages) == 2  # one message per HTTP server for the whole batch
    assert answers[0]["a"][:2] == (2, LitAPIStatus.OK) and answers[0]["c"][:2] == (8, LitAPIStatus.OK)
    assert answers[1]["b"][:2] == (4, LitAPIStatus.OK)
    assert answers[0]["stale"][1] == LitAPIStatus.ERROR and answers[0]["stale"][0].status_code == 504
    transport.messages.clear()
    requests.put((0, "bad", time.monotonic(), 0))
    run()  # a batch whose predict raises: each of its requests gets a 500, the loop goes on to the sentinel
    ((_, [(uid, (error, status, *_))]),) = transport.messages
    assert uid == "bad" and status == LitAPIStatus.ERROR and error.status_code == 500
