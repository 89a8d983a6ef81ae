"""Admission at the door of ``POST /predict``: an API key, a payload limit, a body deadline, a
bounded queue, and the request clock.

:class:`AdmissionMiddleware` is an ASGI middleware of every HTTP server process. For a request to
the predict path it

1. answers **401** when the server has an API key (``LIT_SERVER_API_KEY``) and the request's
   ``X-API-Key`` header is not it -- before it reads a byte of the body;
2. answers **413** when the body is larger than ``max_payload_bytes`` (by its ``Content-Length``,
   or while reading a body sent without one), before anything parses it;
3. reads the whole body within ``body_timeout_s`` -- a client that sends less answers **408** (and
   its connection is closed); a client that disconnects before its body is complete is dropped:
   nothing is answered, dispatched or counted;
4. answers **503** with ``Retry-After`` when :class:`AdmissionGate` already holds ``limit``
   requests in flight (admitted, not answered) across all HTTP server processes, or when the body
   would take the bytes in flight past ``byte_limit`` -- the queue in front of the workers stays
   bounded, in requests and in bytes, instead of growing until requests time out (or memory runs
   out). A request takes its place only once its body is complete, so clients that are slow to
   send (or never finish) cannot hold the places of others; but the bytes of a body that arrives in
   several messages count against ``byte_limit`` as they arrive (a 503 and a closed connection for
   the body that would pass it), so many connections each holding a large half-sent body cannot
   take the server's memory past it either (they used to: 120 x 8 MB held, ``in_flight_bytes`` 0);
5. otherwise hands the body to :class:`~lightrec.serving.transport.PredictDispatch`, which queues it
   for a worker and returns the worker's answer, or a 504 once ``--timeout`` has passed without
   one (without a dispatch, passes the request on to the app); whatever the outcome, the request's
   place and bytes are given back once no worker will read its body any more -- when it is answered,
   or, after a 504 or a client that left, when the worker's late answer arrives (a stuck worker fills
   the gate: 503s, not bodies piling up in the queue) -- and its status code and latency are recorded
   in the server's metrics.

Error bodies have the one shape every rejection of the server has: ``{"error", "index", "field",
"value"}`` (:class:`~lightrec.serving.request_forms.Rejected`).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import multiprocessing
import os
import sys
import time
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lightrec.serving.metrics import ServingMetrics
from lightrec.serving.request_forms import Rejected

if TYPE_CHECKING:  # transport.py imports LitServe, an optional dependency; this module does not need it
    from lightrec.serving.transport import PredictDispatch

__all__ = ["AdmissionGate", "AdmissionMiddleware"]

class AdmissionGate:
    """The requests in flight and the bytes of their bodies, shared by the HTTP server processes
    (forked from the builder's process, which creates it), bounded by ``limit`` and ``byte_limit``.

    Args:
        limit: requests in flight above which new ones are refused (>= 1).
        byte_limit: bytes of bodies in flight that no admitted request may take the total past (>= 1;
            None: unbounded).
    """

    def __init__(self, limit: int, byte_limit: int | None = None) -> None:
        if limit < 1:
            raise ValueError(f"the queue limit must be >= 1 request, got {limit}")
        if byte_limit is not None and byte_limit < 1:
            raise ValueError(f"the queue's byte limit must be >= 1 byte, got {byte_limit}")
        self.limit = limit
        self.byte_limit = byte_limit
        fork = multiprocessing.get_context("fork")
        self._count = fork.Value("i", 0)
        self._bytes = fork.Value("q", 0, lock=self._count.get_lock())  # one lock: both change together

    def enter(self, size: int = 0, reserved: int = 0) -> str | None:
        """Admit one request of ``size`` body bytes, ``reserved`` of which it already holds (:meth:`reserve`,
        while they arrived): None; else why not (the limit it would pass; the reserved bytes stay held)."""
        with self._count.get_lock():
            if self._count.value >= self.limit:
                return f"its limit of {self.limit} requests in flight"
            more = size - reserved
            if self.byte_limit is not None and more > 0 and self._bytes.value + more > self.byte_limit:
                return self._over_bytes(size)
            self._count.value += 1
            self._bytes.value += more
            return None

    def reserve(self, size: int, arrived: int = 0) -> str | None:
        """Hold ``size`` more bytes of a body still arriving, ``arrived`` of which came before (held already; no
        place in the count): None; else why not."""
        with self._count.get_lock():
            if self.byte_limit is not None and self._bytes.value + size > self.byte_limit:
                return self._over_bytes(arrived + size, " so far")
            self._bytes.value += size
            return None

    def release(self, size: int) -> None:
        """Give back ``size`` reserved bytes of a body that was never admitted."""
        with self._count.get_lock():
            self._bytes.value -= size

    def _over_bytes(self, size: int, arriving: str = "") -> str:
        return (f"its limit of {self.byte_limit} bytes of requests in flight (--max-queue-mb; "
                f"{self._bytes.value} held, this one {size}{arriving})")

    def leave(self, size: int = 0) -> None:
        """An admitted request of ``size`` body bytes was answered: give back its place and bytes."""
        with self._count.get_lock():
            self._count.value -= 1
            self._bytes.value -= size

    @property
    def in_flight(self) -> int:
        return int(self._count.value)

    @property
    def in_flight_bytes(self) -> int:
        return int(self._bytes.value)

    @property
    def full(self) -> bool:
        """Whether a request would be refused now (``limit`` requests, or ``byte_limit`` bytes, in flight)."""
        return self.in_flight >= self.limit or (self.byte_limit is not None and self.in_flight_bytes >= self.byte_limit)


@dataclass(eq=False)  # a middleware instance compares by identity, as before
class AdmissionMiddleware:
    """See the module docstring.

    Args:
        app: the ASGI app it wraps.
        path: the predict path (LitServe's ``api_path``).
        gate: the shared count of requests and bytes in flight.
        metrics: where status codes and latencies go (the slot of this HTTP server process).
        max_payload_bytes: the largest body accepted.
        body_timeout_s: seconds from a request's arrival by which its whole body must have come (else 408).
        retry_after_s: the ``Retry-After`` of a 503.
        dispatch: answers admitted requests from the workers; None: the wrapped app answers them.
        api_key: the ``X-API-Key`` every request must carry (LitServe's ``LIT_SERVER_API_KEY``); None: none.
    """

    app: ASGIApp
    _: KW_ONLY
    path: str
    gate: AdmissionGate
    metrics: ServingMetrics
    max_payload_bytes: int
    body_timeout_s: float = 10.0
    retry_after_s: int = 1
    dispatch: PredictDispatch | None = None
    api_key: str | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        headers = dict(scope.get("headers", ()))
        answered = True
        held = _Held()  # bytes of this body reserved in the gate while they arrived
        try:
            if self.api_key and not _same_key(headers.get(b"x-api-key", b""), self.api_key):
                await _answer(send_and_note, Rejected(401, "Invalid API Key. Check that you are passing a correct "
                                                      "'X-API-Key' in your header.", None, "x-api-key", None))
                return
            body = await self._body(headers, receive, held)
            if body is None:  # the client left before its body was complete: no one to answer, nothing to score
                answered = False
                return
            if isinstance(body, Rejected):
                # A 408's or 503's body may still arrive (or never): close the connection rather than read it as a
                # request.
                close = [(b"connection", b"close")] if body.status in (408, 503) else []
                await _answer(send_and_note, body, close + self._retry(body.status))
                return
            refused = self.gate.enter(len(body), reserved=held.bytes)
            if refused is not None:
                await _answer(send_and_note, self._busy(refused), self._retry(503))
                return
            held.bytes = 0  # the admitted request holds them now; leave() gives them back
            if self.dispatch is not None:
                # The dispatch gives the place back when no worker will read the body any more: after a 504,
                # not before the worker's late answer (transport.PredictDispatch).
                answer = await self.dispatch.answer(scope["app"], headers, body, functools.partial(
                    self.gate.leave, len(body)))  # fmt: skip
                await _send(send_and_note, answer.status_code, answer.body)
                return
            try:
                await self.app(scope, _replay(body, receive), send_and_note)
            finally:
                self.gate.leave(len(body))
        finally:
            if held.bytes:  # a body in pieces that was never admitted (refused, timed out, abandoned)
                self.gate.release(held.bytes)
            if answered:  # LitServe's HTTP servers are forked with LITSERVE_WORKER_ID = their index (0 without it)
                self.metrics.record_request(int(os.environ.get("LITSERVE_WORKER_ID", "0")), status,
                                            time.perf_counter() - start)

    def _busy(self, refused: str) -> Rejected:
        return Rejected(503, f"the server is at {refused}; retry after {self.retry_after_s} s or add workers/replicas")

    def _retry(self, status: int) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after_s).encode())] if status == 503 else []

    async def _body(self, headers: dict[bytes, bytes], receive: Receive, held: _Held) -> bytes | Rejected | None:
        """The whole body; a 413 as soon as it is known to exceed the limit, a 408 when it has not come
        within ``body_timeout_s``, a 503 when the bytes of the bodies in flight and arriving would pass the
        gate's byte limit; None when the client disconnected before it was complete. ``held``: the bytes
        reserved in the gate so far (the caller gives them back unless the request is admitted)."""
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_payload_bytes:
            return self._too_large(int(declared))
        try:
            if sys.version_info >= (3, 11):  # a timer on this task: ~4 us a request, where wait_for's task costs ~13
                async with asyncio.timeout(self.body_timeout_s):
                    return await self._read(receive, held)
            return await asyncio.wait_for(self._read(receive, held), self.body_timeout_s)
        except (TimeoutError, asyncio.TimeoutError):  # one class from 3.11 on; wait_for's own before
            return Rejected(408, f"the body did not arrive in full within {self.body_timeout_s:g} s (--body-timeout); "
                            "send it at once, or raise the limit for slow links", None, "body", None)

    async def _read(self, receive: Receive, held: _Held) -> bytes | Rejected | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_payload_bytes:
                return self._too_large(size, at_least=True)
            more = message.get("more_body", False)
            if not more and not chunks:  # the common case, a body in one message: the gate counts it at entry
                return chunk
            refused = self.gate.reserve(len(chunk), held.bytes)  # a body in pieces: its bytes are held as they arrive
            if refused is not None:
                return self._busy(refused)
            held.bytes += len(chunk)
            chunks.append(chunk)
            if not more:
                return b"".join(chunks)

    def _too_large(self, size: int, at_least: bool = False) -> Rejected:
        return Rejected(413, f"the body is {'over ' if at_least else ''}{size} bytes, more than the server's limit of "
                        f"{self.max_payload_bytes} (--max-payload-mb); split it", None, "body", size)


@dataclass
class _Held:
    """Bytes of one request's body reserved in the gate while they arrived."""

    bytes: int = 0


def _same_key(given: bytes, key: str) -> bool:
    """Whether header bytes ``given`` are ``key`` (compared in constant time: no timing hint of a prefix)."""
    return hmac.compare_digest(given, key.encode("latin-1", "replace"))


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body read already, then the client's later messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _answer(send: Send, rejected: Rejected, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await _send(send, rejected.status, json.dumps(rejected.body()).encode(), headers)


async def _send(send: Send, status: int, payload: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A JSON response: ``payload`` with ``status``."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *(headers or [])]})  # fmt: skip
    await send({"type": "http.response.body", "body": payload})
