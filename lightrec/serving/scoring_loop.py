"""``ScoringLoop``: the inference worker's loop -- collect a batch, score it, answer it in one write.

LitServe runs a ``LitLoop`` in every inference worker; its ``BatchedLoop`` calls the ``LitAPI``'s
methods in the same order this one does (``decode_request`` per request -> ``batch`` -> ``predict``
-> ``unbatch`` -> ``encode_response`` per request). Profiled at 32 one-sample clients, a third of
the worker's CPU went to the loop itself rather than to scoring:

* it calls every method through ``_inject_context``, which runs ``inspect.signature`` on each call
  (two per request: ~25 us each);
* it writes each answer to the response pipe on its own (a pickle and a pipe write per request);
* it waits for each request with ``get(timeout=1 ms)`` (a lock taken with a timeout, a ``poll``).

This loop calls the methods directly (``RecServingAPI`` takes no LitServe context), takes what is
already queued without waiting, and sends a batch's answers to each HTTP server as one message
(:meth:`~lightrec.serving.transport.PipeTransport.send_many`). Batching is LitServe's: up to
``max_batch_size`` requests, waiting at most ``batch_timeout`` after the first one arrived for more;
a request older than the server's ``timeout`` is answered 504 unscored; at the stop sentinel the requests
queued before it are still answered (LitServe's loop drops them). LitServe's callbacks
(``BEFORE_PREDICT`` ...) are not triggered: ``lightrec serve`` registers none.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import defaultdict

from fastapi import HTTPException
from litserve.api import LitAPI
from litserve.callbacks.base import CallbackRunner
from litserve.loops.base import _SENTINEL_VALUE
from litserve.loops.simple_loops import BatchedLoop
from litserve.specs.base import LitSpec
from litserve.transport.base import MessageTransport
from litserve.utils import LitAPIStatus, LoopResponseType, PickleableHTTPException

from lightrec.serving.transport import PipeTransport

__all__ = ["ScoringLoop"]

log = logging.getLogger(__name__)

# (consumer, uid, encoded response or PickleableHTTPException, LitAPIStatus): what a worker sends back.
_Answer = tuple[int, str, object, str]

_IDLE_WAIT_S = 1.0  # an idle worker wakes this often (the sentinel that stops it also wakes it)


class ScoringLoop(BatchedLoop):
    """See the module docstring. Works with any ``LitAPI`` whose methods take no context."""

    def run_batched_loop(self, lit_api: LitAPI, request_queue: queue.Queue, transport: MessageTransport,
                         callback_runner: CallbackRunner, lit_spec: LitSpec | None = None) -> None:  # fmt: skip
        timeout = lit_api.request_timeout if lit_api.request_timeout not in (-1, False, None) else None
        stop = False
        while not stop:
            requests, stop = collect(request_queue, lit_api.max_batch_size, lit_api.batch_timeout)
            answers: list[_Answer] = []
            now = time.monotonic()
            fresh = []
            for consumer, uid, arrived, body in requests:
                if timeout is not None and now - arrived > timeout:
                    late = PickleableHTTPException(504, "the request waited in the queue longer than the server's "
                                                   "timeout; retry, or add workers")
                    answers.append((consumer, uid, late, LitAPIStatus.ERROR))
                else:
                    fresh.append((consumer, uid, body))
            if fresh:
                answers += self._score(lit_api, fresh)
            self._send(transport, answers)

    def _score(self, lit_api: LitAPI, requests: list[tuple[int, str, object]]) -> list[_Answer]:
        """Answers to ``requests`` (consumer, uid, body): encoded responses, or errors for all of them."""
        try:
            decoded = [lit_api.decode_request(body) for _, _, body in requests]
            outputs = lit_api.unbatch(lit_api.predict(lit_api.batch(decoded)))
            if len(outputs) != len(requests):
                raise RuntimeError(f"predict answered {len(outputs)} requests of a batch of {len(requests)}")
            return [(c, uid, lit_api.encode_response(y), LitAPIStatus.OK) for (c, uid, _), y in zip(requests, outputs)]
        except HTTPException as exc:
            error = PickleableHTTPException.from_exception(exc)
        except Exception:  # noqa: BLE001 - the worker must keep serving; every request of the batch learns of it
            log.exception("scoring a batch of %d requests failed", len(requests))
            error = PickleableHTTPException(500, "the server failed to score this request (its log has the traceback)")
        return [(c, uid, error, LitAPIStatus.ERROR) for c, uid, _ in requests]

    def _send(self, transport: MessageTransport, answers: list[_Answer]) -> None:
        """One message per HTTP server: LitServe's ``(uid, (response, status, type, worker))`` items."""
        per_consumer: defaultdict[int, list[object]] = defaultdict(list)
        for consumer, uid, response, status in answers:
            per_consumer[consumer].append((uid, (response, status, LoopResponseType.REGULAR, self.worker_id)))
        for consumer, items in per_consumer.items():
            if isinstance(transport, PipeTransport):
                transport.send_many(items, consumer)
            else:  # LitServe's own transports
                for item in items:
                    transport.send(item, consumer_id=consumer)


def collect(request_queue: queue.Queue, max_batch: int, batch_timeout_s: float) -> tuple[list[tuple[int, str, float, object]], bool]:
    """Up to ``max_batch`` requests: the first as it comes (waking every second when none does), then
    those already queued, then those that come within ``batch_timeout_s`` of the first; and whether
    the server's stop sentinel came (the requests before it are still answered).
    """
    items: list[tuple[int, str, float, object]] = []
    deadline = 0.0
    while len(items) < max_batch:
        try:
            if not items:
                item = request_queue.get(timeout=_IDLE_WAIT_S)
                deadline = time.monotonic() + batch_timeout_s
            else:
                try:
                    item = request_queue.get_nowait()
                except queue.Empty:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    item = request_queue.get(timeout=left)
        except queue.Empty:
            if items:
                break
            continue
        if item == _SENTINEL_VALUE:
            return items, True
        items.append(item)
    return items, False
