"""Server metrics in shared memory, rendered in Prometheus' text format at ``GET /metrics``.

A LitServe server is several processes: HTTP servers (forked; they time requests) and inference
workers (spawned; they score batches and apply updates). Each process writes only its own slot of
one shared array of float64 -- no lock, one writer per slot, 8-byte stores that are never torn --
and any HTTP server reads all slots to answer a scrape::

    API slot a      counts per status code, latency sum/count, a ring of the last RING latencies
    worker slot w   state, version, published/applied times, updates applied/refused, batches,
                    samples, forward sum, samples-per-batch histogram, a ring of forward times

Quantiles (``quantile="0.5"|"0.9"|"0.99"``) are over the last ``RING`` values of each process.
The array is created by the server builder before any process starts and reaches the workers with
the ``LitAPI`` (a shared-memory array pickles while a process is being spawned).
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing
import time
from collections.abc import Sequence

__all__ = ["BATCH_BUCKETS", "CODES", "RING", "ServingMetrics", "WorkerMetrics", "WorkerState"]

RING = 1024  # latencies / forward times kept per process for the quantiles
CODES = (200, 400, 401, 408, 413, 422, 500, 503, 504)  # status codes counted one by one; others count as "other"
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)  # samples per forward
QUANTILES = (0.5, 0.9, 0.99)


class WorkerState:
    """Values of a worker slot's ``state``: starting (loading or catching up), serving, damaged."""

    STARTING = 0.0
    SERVING = 1.0
    DAMAGED = 2.0


# API slot layout
_A_CODES = 0
_A_OTHER = _A_CODES + len(CODES)
_A_LAT_SUM = _A_OTHER + 1
_A_LAT_COUNT = _A_LAT_SUM + 1
_A_RING = _A_LAT_COUNT + 1
_A_SIZE = _A_RING + RING

# worker slot layout
_W_STATE, _W_VERSION, _W_PUBLISHED, _W_APPLIED, _W_LAG = 0, 1, 2, 3, 4
_W_UPDATES_OK, _W_UPDATES_REFUSED, _W_BATCHES, _W_SAMPLES, _W_REQUESTS, _W_FWD_SUM = 5, 6, 7, 8, 9, 10
_W_BUCKETS = 11
_W_RING = _W_BUCKETS + len(BATCH_BUCKETS) + 1  # + the +Inf bucket
_W_SIZE = _W_RING + RING


class WorkerMetrics:
    """The slot of one inference worker (written by that worker only)."""

    def __init__(self, array: ctypes.Array[ctypes.c_double], offset: int) -> None:
        self._a = array
        self._o = offset

    def set_state(self, state: float) -> None:
        self._a[self._o + _W_STATE] = state

    def set_damaged(self) -> None:
        self.set_state(WorkerState.DAMAGED)

    def set_model(self, version: int, published_at: float) -> None:
        """The model as loaded (before any update): its version and publish time; no lag yet."""
        a, o = self._a, self._o
        a[o + _W_VERSION], a[o + _W_PUBLISHED], a[o + _W_LAG] = float(version), published_at, math.nan

    def update_applied(self, version: int, published_at: float, applied_at: float) -> None:
        """An update took effect: its version, and the freshness lag ``applied_at - published_at``."""
        a, o = self._a, self._o
        a[o + _W_VERSION], a[o + _W_PUBLISHED], a[o + _W_APPLIED] = float(version), published_at, applied_at
        a[o + _W_LAG] = max(0.0, applied_at - published_at)
        a[o + _W_UPDATES_OK] += 1

    def update_refused(self, versions: int = 1) -> None:
        """``versions`` published versions were refused (the served version stays)."""
        self._a[self._o + _W_UPDATES_REFUSED] += versions

    def record_batch(self, requests: int, samples: int, seconds: float) -> None:
        """One forward over ``samples`` samples from ``requests`` requests, taking ``seconds``."""
        a, o = self._a, self._o
        a[o + _W_BATCHES] += 1
        a[o + _W_SAMPLES] += samples
        a[o + _W_REQUESTS] += requests
        a[o + _W_FWD_SUM] += seconds
        bucket = next((i for i, le in enumerate(BATCH_BUCKETS) if samples <= le), len(BATCH_BUCKETS))
        a[o + _W_BUCKETS + bucket] += 1
        a[o + _W_RING + int(a[o + _W_BATCHES] - 1) % RING] = seconds


class ServingMetrics:
    """The shared array of ``api_servers`` HTTP-server slots and ``workers`` worker slots.

    Args:
        api_servers: number of HTTP server processes (LitServe's ``num_api_servers``).
        workers: number of inference workers (devices x workers per device).
    """

    def __init__(self, api_servers: int, workers: int) -> None:
        if api_servers < 1 or workers < 1:
            raise ValueError(f"api_servers and workers must be >= 1, got {api_servers} and {workers}")
        self.api_servers = api_servers
        self.workers = workers
        self._array = multiprocessing.RawArray("d", api_servers * _A_SIZE + workers * _W_SIZE)
        for w in range(workers):  # no model loaded, no update applied yet: no age, no freshness lag to report
            self._array[api_servers * _A_SIZE + w * _W_SIZE + _W_PUBLISHED] = math.nan
            self._array[api_servers * _A_SIZE + w * _W_SIZE + _W_LAG] = math.nan

    def worker(self, index: int) -> WorkerMetrics:
        """The slot of worker ``index`` (LitServe's worker id)."""
        if not 0 <= index < self.workers:
            raise IndexError(f"worker {index} outside [0, {self.workers})")
        return WorkerMetrics(self._array, self.api_servers * _A_SIZE + index * _W_SIZE)

    def record_request(self, api_server: int, status: int, seconds: float) -> None:
        """One HTTP request to the predict path answered with ``status`` after ``seconds`` (its API server's slot)."""
        a, o = self._array, (api_server % self.api_servers) * _A_SIZE
        a[o + (_A_CODES + CODES.index(status) if status in CODES else _A_OTHER)] += 1
        a[o + _A_RING + int(a[o + _A_LAT_COUNT]) % RING] = seconds
        a[o + _A_LAT_SUM] += seconds
        a[o + _A_LAT_COUNT] += 1

    def worker_states(self) -> list[tuple[float, int]]:
        """``(state, version)`` of every worker."""
        return [(self._w(w, _W_STATE), int(self._w(w, _W_VERSION))) for w in range(self.workers)]

    def _w(self, worker: int, field: int) -> float:
        return float(self._array[self.api_servers * _A_SIZE + worker * _W_SIZE + field])

    def _a(self, api_server: int, field: int) -> float:
        return float(self._array[api_server * _A_SIZE + field])

    def _ring(self, start: int, count: int) -> list[float]:
        return list(self._array[start:start + min(count, RING)])

    def render(self, in_flight: int, queue_limit: int, now: float | None = None, *, in_flight_bytes: int = 0,
               queue_limit_bytes: int | None = None) -> str:
        """The Prometheus text exposition (format 0.0.4) of every metric.

        Args:
            in_flight, queue_limit: requests admitted and not yet answered; the most there may be.
            now: the time the ages are measured at (None: now).
            in_flight_bytes, queue_limit_bytes: bytes of their bodies; the most there may be (None: no
                limit, and no ``lightrec_serving_queue_limit_bytes``).
        """
        now = time.time() if now is None else now
        apis, workers = range(self.api_servers), range(self.workers)
        out = _Writer()
        out.family("lightrec_serving_requests_total", "counter", "HTTP requests to the predict path by status code")
        for i, code in enumerate((*CODES, "other")):
            out.sample("lightrec_serving_requests_total", {"code": str(code)}, sum(self._a(a, _A_CODES + i) for a in apis))
        latencies = [x for a in apis for x in self._ring(a * _A_SIZE + _A_RING, int(self._a(a, _A_LAT_COUNT)))]
        out.summary("lightrec_serving_request_latency_seconds", "time from a request's arrival to its response "
                    f"(quantiles over the last {RING} requests of each HTTP server)", latencies,
                    sum(self._a(a, _A_LAT_SUM) for a in apis), sum(self._a(a, _A_LAT_COUNT) for a in apis))
        base = [self.api_servers * _A_SIZE + w * _W_SIZE for w in workers]
        forwards = [x for w in workers for x in self._ring(base[w] + _W_RING, int(self._w(w, _W_BATCHES)))]
        out.summary("lightrec_serving_forward_seconds", "time of one batched forward, lock and sigmoid included",
                    forwards, sum(self._w(w, _W_FWD_SUM) for w in workers), sum(self._w(w, _W_BATCHES) for w in workers))
        buckets = [sum(self._w(w, _W_BUCKETS + i) for w in workers) for i in range(len(BATCH_BUCKETS) + 1)]
        out.histogram("lightrec_serving_batch_size", "samples per forward (a batch joins requests; a request may "
                      "hold many samples)", buckets, sum(self._w(w, _W_SAMPLES) for w in workers))
        out.family("lightrec_serving_scored_requests_total", "counter", "requests scored (valid ones reach a batch)")
        out.sample("lightrec_serving_scored_requests_total", {}, sum(self._w(w, _W_REQUESTS) for w in workers))
        out.family("lightrec_serving_in_flight", "gauge", "requests admitted and not yet answered")
        out.sample("lightrec_serving_in_flight", {}, in_flight)
        out.family("lightrec_serving_queue_limit", "gauge", "requests in flight above which new ones get 503")
        out.sample("lightrec_serving_queue_limit", {}, queue_limit)
        out.family("lightrec_serving_in_flight_bytes", "gauge", "bytes of the bodies of the requests in flight")
        out.sample("lightrec_serving_in_flight_bytes", {}, in_flight_bytes)
        if queue_limit_bytes is not None:
            out.family("lightrec_serving_queue_limit_bytes", "gauge", "bytes of bodies in flight that no new "
                       "request may take the total past (else 503)")
            out.sample("lightrec_serving_queue_limit_bytes", {}, queue_limit_bytes)
        self._render_workers(out, now)
        return out.text()

    def _render_workers(self, out: _Writer, now: float) -> None:
        per_worker = [
            ("lightrec_serving_worker_state", "gauge", "0 starting, 1 serving, 2 damaged (a failed update)",
             lambda w: self._w(w, _W_STATE)),
            ("lightrec_serving_model_version", "gauge", "the model version this worker scores with",
             lambda w: self._w(w, _W_VERSION)),
            ("lightrec_serving_delta_lag_seconds", "gauge", "freshness lag of the last applied version: publish "
             "to apply (NaN until a version is applied)", lambda w: self._w(w, _W_LAG)),
            ("lightrec_serving_model_age_seconds", "gauge", "time since the served version was published (NaN "
             "until the worker has loaded the model)", lambda w: _age(now, self._w(w, _W_PUBLISHED))),
        ]
        for name, kind, text, value in per_worker:
            out.family(name, kind, text)
            for w in range(self.workers):
                out.sample(name, {"worker": str(w)}, value(w))
        out.family("lightrec_serving_updates_total", "counter", "published versions applied or refused (corrupt, "
                   "partial, out of order; a failed poll naming no version counts one), per worker")
        for w in range(self.workers):
            out.sample("lightrec_serving_updates_total", {"worker": str(w), "outcome": "applied"},
                       self._w(w, _W_UPDATES_OK))
            out.sample("lightrec_serving_updates_total", {"worker": str(w), "outcome": "refused"},
                       self._w(w, _W_UPDATES_REFUSED))


class _Writer:
    """Lines of the text format: ``# HELP`` / ``# TYPE`` per family, then its samples."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, text: str) -> None:
        self._lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, labels: dict[str, str], value: float) -> None:
        body = ",".join(f'{k}="{v}"' for k, v in labels.items())
        self._lines.append(f"{name}{{{body}}} {_number(value)}" if body else f"{name} {_number(value)}")

    def summary(self, name: str, text: str, window: Sequence[float], total: float, count: float) -> None:
        self.family(name, "summary", text)
        ordered = sorted(window)
        for q in QUANTILES:
            # nearest rank: the smallest value with at least q of the window at or below it (the 1e-9: a product
            # such as 0.07 * 100 comes out a hair above its whole number)
            value = ordered[max(math.ceil(q * len(ordered) - 1e-9) - 1, 0)] if ordered else math.nan
            self.sample(name, {"quantile": str(q)}, value)
        self.sample(f"{name}_sum", {}, total)
        self.sample(f"{name}_count", {}, count)

    def histogram(self, name: str, text: str, buckets: Sequence[float], total: float) -> None:
        self.family(name, "histogram", text)
        cumulative = 0.0
        for le, count in zip((*BATCH_BUCKETS, "+Inf"), buckets):
            cumulative += count
            self.sample(f"{name}_bucket", {"le": str(le)}, cumulative)
        self.sample(f"{name}_sum", {}, total)
        self.sample(f"{name}_count", {}, cumulative)

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def _age(now: float, published_at: float) -> float:
    """Seconds since ``published_at``; NaN while it is unset (NaN), not ``now - 0`` (56 years)."""
    return math.nan if math.isnan(published_at) else max(0.0, now - published_at)


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))
