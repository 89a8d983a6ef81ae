"""Load for ``bench_serve.py``: closed-loop clients, an open-loop fixed rate, and what a server used.

Both loads are one asyncio process of raw HTTP/1.1 keep-alive connections (no HTTP library: on 2
cores the client shares the machine with the server, and this one costs ~0.05 ms of CPU per
request), the same for every server measured.

* :func:`closed_loop`: ``clients`` connections, each sends its next request when the previous one
  is answered. Throughput at saturation; its latency is a queueing figure (Little's law: mean
  latency = clients / throughput), not the server's own latency.
* :func:`open_loop`: requests scheduled at a fixed rate whatever the answers do; latency counts
  from each request's scheduled moment (a request that waits for a free connection waits on the
  clock: no coordinated omission). Below saturation it is the latency a request sees in the server,
  plus the client's timer lag (an asyncio sleep wakes up to ~1 ms late); ``p50_sent_ms`` /
  ``p99_sent_ms`` count from the moment each request was written instead.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["closed_loop", "open_loop", "scrape", "session_cpu_seconds"]

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> tuple[int, bytes]:
    writer.write(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


def _summary(latencies: list[float], statuses: Counter[int], elapsed: float, samples: int) -> dict[str, Any]:
    ordered = sorted(latencies) or [float("nan")]
    return {"requests": len(latencies), "seconds": elapsed,
            "requests_per_s": statuses[200] / elapsed, "samples_per_s": statuses[200] * samples / elapsed,
            "p50_ms": 1e3 * ordered[len(ordered) // 2],
            "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "errors": {str(k): v for k, v in statuses.items() if k != 200}}  # fmt: skip


async def closed_loop(port: int, clients: int, bodies: list[bytes], seconds: float, samples: int = 1) -> dict[str, Any]:
    """``clients`` keep-alive connections, one request in flight each, for ``seconds``."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    start = time.perf_counter()
    stop_at = start + seconds

    async def client(c: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        i = c
        try:
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                status, _ = await asyncio.wait_for(_request(reader, writer, bodies[i % len(bodies)]), 60)
                latencies.append(time.perf_counter() - t)
                statuses[status] += 1
                i += clients
        finally:
            writer.close()

    await asyncio.gather(*(client(c) for c in range(clients)))
    return {"clients": clients, **_summary(latencies, statuses, time.perf_counter() - start, samples)}


async def open_loop(port: int, rate: float, bodies: list[bytes], seconds: float, connections: int = 64,
                    samples: int = 1) -> dict[str, Any]:  # fmt: skip
    """Requests at ``rate`` per second (evenly spaced) for ``seconds`` over up to ``connections``
    keep-alive connections; each latency counts from the request's scheduled moment."""
    latencies: list[float] = []
    round_trips: list[float] = []  # from the moment the request is written: the client's timer lag left out
    statuses: Counter[int] = Counter()
    total = int(rate * seconds)
    start = time.perf_counter() + 0.05
    due: asyncio.Queue[int | None] = asyncio.Queue()

    async def schedule() -> None:
        for k in range(total):
            delay = start + k / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            due.put_nowait(k)
        for _ in range(connections):
            due.put_nowait(None)

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while (k := await due.get()) is not None:
                sent = time.perf_counter()
                status, _ = await asyncio.wait_for(_request(reader, writer, bodies[k % len(bodies)]), 60)
                done = time.perf_counter()
                latencies.append(done - (start + k / rate))
                round_trips.append(done - sent)
                statuses[status] += 1
        finally:
            writer.close()

    await asyncio.gather(schedule(), *(connection() for _ in range(connections)))
    sent = sorted(round_trips) or [float("nan")]
    return {"rate": rate, "connections": connections,
            **_summary(latencies, statuses, time.perf_counter() - start, samples),
            "p50_sent_ms": 1e3 * sent[len(sent) // 2], "p99_sent_ms": 1e3 * sent[min(len(sent) - 1, int(0.99 * len(sent)))]}  # fmt: skip


def scrape(url: str) -> dict[str, float]:
    """A server's ``/metrics`` as ``{name{labels}: value}``."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+) (\S+)$", text, re.M)}


def session_cpu_seconds(leader: int) -> float | None:
    """CPU time (user + system) used so far by every process of ``leader``'s session (Linux /proc)."""
    if not Path("/proc/self/stat").exists():
        return None
    total = 0.0
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split() if stat else []
        if len(fields) > 12 and int(fields[3]) == leader:  # session id; utime, stime in clock ticks
            total += (int(fields[11]) + int(fields[12])) / _CLK_TCK
    return total
