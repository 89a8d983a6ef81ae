"""The queues between a server's HTTP processes and its workers: pipes, not a Manager's proxies.

LitServe 0.2 passes every request and every response through queues that live in a Manager
process (``multiprocessing.Manager().Queue()``), so a request crosses four process boundaries,
each a round trip over a socket to the manager's Python::

    LitServe                                          lightrec serve (PipeQueueServer)
    HTTP server --put--> manager <--get-- worker      HTTP server --pipe--> worker
    HTTP server --get--> manager <--put-- worker      HTTP server <--pipe-- worker

:class:`PipeQueueServer` swaps them, as soon as LitServe has made them, for ``multiprocessing.Queue``
pipes of the spawn context (usable by the forked HTTP servers and the spawned workers alike):
two boundaries, no third process, and a ``put`` that no longer blocks the HTTP server's event loop
for a round trip. Measured on a 1 KB request between two processes (``put`` + ``get`` there and
back): 130-150 us against 390-500 us through a manager, whose own CPU comes on top.

:class:`PipeTransport` is the response side. LitServe's HTTP server awaits one ``areceive`` per
response, and its own transport answers each with a hop to a thread (``asyncio.to_thread(get)``);
this one hands out every response already in the pipe -- a batch's responses arrive together --
from a single hop.

:class:`PredictDispatch` is the request side of ``POST /predict`` in the HTTP servers: the admission
middleware hands it the body it has read, and it puts the raw bytes on the workers' queue and
waits for the answer, skipping FastAPI's routing, its dependency solving and its JSON parsing of the
body, and LitServe's request handler. The worker parses the JSON (``RecServingAPI.decode_request``:
it validates each body there anyway) and answers ``(status, body bytes)``
(:class:`EncodedResponse`), which the HTTP server writes as it is. Measured at 32 one-sample clients
on 2 cores, the HTTP server's CPU per request fell from 0.48 ms to about half (docs/performance.md).

LitServe's ``fast_queue=True`` (ZeroMQ) would only change the response side; in 0.2.19 it does not
take effect (``TransportConfig`` is built with a misspelt field, so the transport stays "mp"), and
with that field set by hand requests went unanswered in our try. The worker loops, the batching
and every other part of LitServe are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import multiprocessing
import queue
import sys
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.queues import Queue
from typing import Any, NamedTuple

import litserve as ls
import litserve.server
from fastapi import HTTPException
from litserve.transport.base import MessageTransport
from litserve.transport.process_transport import MPQueueTransport
from litserve.utils import LitAPIStatus, ResponseBufferItem

from lightrec.serving.request_forms import Rejected

__all__ = ["EncodedResponse", "PipeQueueServer", "PipeTransport", "PredictDispatch"]

_MAX_DRAIN = 256  # responses taken from the pipe per hop to the thread, at most
_WAIT_S = 1.0  # a receiving thread wakes up this often when nothing comes (LitServe's own period)


class PipeTransport(MessageTransport):
    """Responses from the workers to HTTP server ``consumer_id``, one pipe per HTTP server.

    Args:
        queues: one ``multiprocessing.Queue`` per HTTP server (LitServe's ``response_queue_id``).
    """

    def __init__(self, queues: list[Queue[object]]) -> None:
        self._queues = queues
        self._ready: dict[int, deque[object]] = {}
        self._closed = False

    def send(self, item: object, consumer_id: int) -> None:
        """Queue ``item`` for HTTP server ``consumer_id`` (a worker calls it; the pipe's feeder thread writes)."""
        self._queues[consumer_id].put(item)

    def send_many(self, items: list[object], consumer_id: int) -> None:
        """Queue ``items`` for HTTP server ``consumer_id`` as one message (one pickle, one pipe write):
        a batch's answers (:class:`~lightrec.serving.scoring_loop.ScoringLoop`)."""
        self._queues[consumer_id].put(items)

    async def areceive(self, consumer_id: int, timeout: float | None = None, block: bool = True) -> object:
        """The next response for ``consumer_id``; None when none came within a second (LitServe polls again).

        Raises:
            queue.Empty: none came within ``timeout`` (when given, and at most a second).
            asyncio.CancelledError: the transport was closed.
        """
        ready = self._ready.setdefault(consumer_id, deque())
        if ready:
            return ready.popleft()
        if self._closed:
            raise asyncio.CancelledError("the transport is closed")
        wait = _WAIT_S if timeout is None else min(timeout, _WAIT_S)
        items = await asyncio.to_thread(_drain, self._queues[consumer_id], wait)
        if not items:
            if timeout is not None:
                raise queue.Empty
            return None
        ready.extend(items[1:])
        return items[0]

    def close(self, send_sentinel: bool = True) -> None:
        """Stop receiving; with ``send_sentinel``, wake every receiver with a None."""
        self._closed = True
        if send_sentinel:
            for pipe in self._queues:
                with contextlib.suppress(Exception):
                    pipe.put(None, block=False)

    def __reduce__(self) -> tuple[object, ...]:  # sent to the spawned workers with their arguments
        return (PipeTransport, (self._queues,))


def _drain(pipe: Queue[object], wait: float) -> list[object]:
    """The first item within ``wait`` seconds, then whatever else is in ``pipe`` already."""
    items: list[object] = []
    try:
        _add(items, pipe.get(timeout=wait))
    except queue.Empty:
        return []
    while len(items) < _MAX_DRAIN:
        try:
            _add(items, pipe.get_nowait())
        except queue.Empty:
            break
    return items


def _add(items: list[object], message: object) -> None:
    """A message is one response (LitServe's tuple), or a list of them (:meth:`PipeTransport.send_many`)."""
    if isinstance(message, list):
        items.extend(message)
    else:
        items.append(message)


class PipeQueueServer(ls.LitServer):
    """A ``LitServer`` whose request queues and response transport are pipes (module docstring).

    LitServe builds its queues in ``_init_manager`` (called by ``run`` before any process starts);
    this override replaces them right after, before a worker or an HTTP server is started. A
    transport other than LitServe's Manager queues (its ZeroMQ one) is left as it is.
    """

    _transport: MessageTransport  # LitServe's: set by _init_manager, read when processes start
    litapi_request_queues: dict[str, Any]  # LitServe's: api path -> the queue its workers read

    def _init_manager(self, num_api_servers: int) -> Any:
        manager = super()._init_manager(num_api_servers)
        if isinstance(self._transport, MPQueueTransport):
            pipes = multiprocessing.get_context("spawn")  # SemLocks of the fork context cannot reach spawned workers
            for path in list(self.litapi_request_queues):
                self.litapi_request_queues[path] = pipes.Queue()
            self._transport = PipeTransport([pipes.Queue() for _ in range(num_api_servers)])
        return manager


class EncodedResponse(NamedTuple):
    """A worker's answer to one ``/predict`` request, as the HTTP server writes it (JSON bytes)."""

    status_code: int
    body: bytes


class PredictDispatch:
    """``POST /predict`` from an HTTP server process straight to the workers (module docstring).

    Built before the server, bound to it by :meth:`bind` (the HTTP server processes are forked
    after, and find the server's queues, response buffer and response queue id through it).

    A request not answered within ``timeout_s`` of being queued gets 504: the HTTP server stops
    waiting (a worker may hang, not die, and LitServe only notices dead ones). Its body is still on the
    workers' queue (or being scored), so the request keeps its place and bytes in the admission gate
    until the worker's late answer arrives (``release`` runs then): a stuck worker fills the gate, and
    new requests get 503 at once, instead of each ``--timeout`` letting another gate's worth of bodies
    pile up in the queue. A worker that takes the request from the queue after ``timeout_s`` answers it
    504 unscored (``ScoringLoop``); the answer is dropped here.

    Args:
        path: the predict path (the ``api_path`` whose workers' queue requests go to).
        timeout_s: seconds from queueing a request to its answer, at most (the server's ``--timeout``).
    """

    def __init__(self, path: str, timeout_s: float = 30.0) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
        self.path = path
        self.timeout_s = timeout_s
        self._server: ls.LitServer | None = None
        self._uids = itertools.count()
        self._late: set[asyncio.Task[None]] = set()  # requests given up on, waiting for their late answers

    def bind(self, server: ls.LitServer) -> None:
        self._server = server

    @property
    def awaiting_late_answers(self) -> int:
        """Requests answered 504 (or whose client left) whose bodies the workers have not answered yet."""
        return len(self._late)

    async def answer(
        self, app: Any, headers: dict[bytes, bytes], body: bytes, release: Callable[[], None] = lambda: None
    ) -> EncodedResponse:
        """The worker's answer to ``body``; ``app`` is the HTTP server's copy of LitServe's app
        (it carries the ``response_queue_id`` the worker answers to). ``release`` is called once, when
        no worker will read the body any more: at once when it is answered (or was never queued), else
        when the worker's late answer arrives (class docstring).

        LitServe's ``LIT_SERVER_API_KEY`` check (header ``X-API-Key``) applies as on its own endpoint.
        """
        server = self._server
        if server is None:
            release()
            raise RuntimeError("PredictDispatch.bind was not called before the server ran")
        key = litserve.server.LIT_SERVER_API_KEY  # LitServe reads its variable once, at import
        if key and headers.get(b"x-api-key", b"").decode("latin-1") != key:
            release()
            return _error(401, "Invalid API Key. Check that you are passing a correct 'X-API-Key' in your header.")
        uid = next(self._uids)  # the key of this process's response buffer: unique within the process
        event = asyncio.Event()
        server.response_buffer[uid] = ResponseBufferItem(event)
        queued = answered = False
        try:
            server.litapi_request_queues[self.path].put((app.response_queue_id, uid, time.monotonic(), body))
            queued = True
            answered = await _wait(event, self.timeout_s)
        finally:  # also when the client left (this task cancelled) with the body queued
            if queued and not answered:
                self._settle_when_answered(server.response_buffer, uid, event, release)
            else:
                item = server.response_buffer.pop(uid)
                release()
        if not answered:
            return _error(504, f"no worker answered within {self.timeout_s:g} s (--timeout); retry, or add workers")
        response, status = item.response if item.response is not None else (None, LitAPIStatus.ERROR)
        if status == LitAPIStatus.OK and isinstance(response, EncodedResponse):
            return response
        if isinstance(response, HTTPException):  # LitServe's 504 for a request that waited too long
            return _error(response.status_code, str(response.detail))
        # a worker died, or raised (LitServe sends that exception pickled: not unpickled here)
        return _error(500, "the server failed to score this request (its log has the traceback)")

    def _settle_when_answered(
        self, buffer: dict[Any, ResponseBufferItem], uid: int, event: asyncio.Event, release: Callable[[], None]
    ) -> None:
        """Keep ``uid``'s buffer entry (LitServe's response loop sets its event when the late answer comes),
        then drop it and ``release``; a server stopping cancels the wait, which releases too."""

        async def settle() -> None:
            try:
                await event.wait()
            finally:
                buffer.pop(uid, None)
                release()

        task = asyncio.get_running_loop().create_task(settle())
        self._late.add(task)  # held: the loop keeps only weak references to its tasks
        task.add_done_callback(self._late.discard)


async def _wait(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` was set within ``timeout_s`` seconds."""
    try:
        if sys.version_info >= (3, 11):  # a timer on this task, no task of its own (as admission.py's body read)
            async with asyncio.timeout(timeout_s):
                await event.wait()
        else:
            await asyncio.wait_for(event.wait(), timeout_s)
    except (TimeoutError, asyncio.TimeoutError):  # one class from 3.11 on; wait_for's own before
        return event.is_set()  # set in the same turn the timer fired: the answer is there
    return True


def _error(status: int, message: str) -> EncodedResponse:
    return EncodedResponse(status, json.dumps(Rejected(status, message).body()).encode())
