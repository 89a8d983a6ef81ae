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
