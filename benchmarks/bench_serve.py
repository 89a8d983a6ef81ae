"""``lightrec serve`` against a plain FastAPI endpoint: throughput and latency under 1-128 clients.

The model is the DLRM recipe's int8 artifact (``lightrec run dlrm --devices 2`` writes
``lightning_logs/dlrm/version_N/export/model_int8.pt``; pass it with ``--artifact``). Without one,
the benchmark exports the same architecture itself -- 26 Criteo tables capped at 100k rows, dim
16, dense MLP [64, 16], over MLP [64, 32, 1], int8 rows, TorchScript -- with untrained weights
(speed does not depend on them). Requests are Criteo-shaped samples (13 dense floats, one id per
feature) in ``Predictor``'s JSON form, one sample per request (``--samples-per-request N``: lists
of N samples, which the baseline then scores with one ``predict`` call per request too).

Contenders, one after the other (an idle server still costs CPU), each a process on 127.0.0.1
that this script starts and stops:

* ``lightrec``: ``lightrec serve ARTIFACT`` (LitServe, dynamic batching; ``--workers``,
  ``--max-batch-size``, ``--batch-timeout-ms`` as given);
* ``fastapi``: one uvicorn process whose ``POST /predict`` calls the same ``Predictor.predict``
  once per request (a sync endpoint, FastAPI's thread pool) -- what "write a server" gives.

For each of 1, 8, 32 and 128 concurrent clients (keep-alive connections, one request in flight
each, for ``--seconds``): requests/s, p50/p99 latency, errors, and for lightrec the mean samples per
forward and mean in-server forward time (from its ``/metrics``). Also the model's own forward time,
measured in this process, at batch 1 and at the batch size lightrec served at 32 clients. Targets
(issue 35): lightrec >= 3x FastAPI's throughput at 32 clients; lightrec's p99 at 32 clients <=
2 x forward(served batch) + batch timeout.

``freshness`` (publish -> first response carrying the new version) is measured by
:func:`freshness_lag` when :func:`make_publisher` returns a publisher; it returns None until the
delta writer of ``lightrec.distributed.deltas`` lands (the hook the deltas work fills).

Run::

    python benchmarks/bench_serve.py --smoke                      # a quick pass (1 s per level)
    python benchmarks/bench_serve.py --seconds 10 --out serve.json
    python benchmarks/bench_serve.py --artifact lightning_logs/dlrm/version_0/export/model_int8.pt
    python benchmarks/bench_serve.py --samples-per-request 16 --workers 2    # clients that batch themselves

Numbers from a shared or loaded machine are noise; take final ones on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (1, 8, 32, 128)


# ---------------------------------------------------------------------------------------- the model
def build_artifact(folder: Path) -> Path:
    """The DLRM recipe's architecture, quantized to int8 and exported as TorchScript."""
    from lightrec.data.criteo_spec import resolve_cardinalities, table_configs
    from lightrec.inference import export, quantize
    from lightrec.models import DLRM
    from lightrec.modules import EmbeddingBagCollection

    torch.manual_seed(0)
    tables = table_configs(16, resolve_cardinalities("kaggle", num_embeddings_cap=100_000))
    model = DLRM(EmbeddingBagCollection(tables), dense_in_features=13, dense_arch_layer_sizes=[64, 16],
                 over_arch_layer_sizes=[64, 32, 1]).eval()  # fmt: skip
    return export(quantize(model, dtype="int8"), folder / "model_int8.pt")


def request_bodies(meta: dict[str, Any], count: int, samples_per_request: int = 1, seed: int = 0) -> list[bytes]:
    """``count`` JSON bodies of Criteo-shaped samples (dense floats, one id per feature): one sample
    each, or Predictor's list of ``samples_per_request`` samples."""
    g = torch.Generator().manual_seed(seed)
    rows = {f: t.get("id_space", t["num_embeddings"]) for t in meta["tables"] for f in t["feature_names"]}

    def sample() -> dict[str, Any]:
        dense = torch.rand(int(meta.get("dense_in_features") or 0), generator=g).tolist()
        return {"dense": dense, "sparse": {f: [int(torch.randint(0, n, (1,), generator=g))] for f, n in rows.items()}}

    if samples_per_request == 1:
        return [json.dumps(sample()).encode() for _ in range(count)]
    return [json.dumps([sample() for _ in range(samples_per_request)]).encode() for _ in range(count)]


def forward_seconds(artifact: Path, bodies: list[bytes], batch: int, threads: int, repeats: int = 20) -> float:
    """Median time of the artifact's forward (``Predictor.probabilities``) on ``batch`` samples."""
    from lightrec.inference import load

    torch.set_num_threads(threads)
    predictor = load(artifact)
    first = [json.loads(b) for b in bodies]
    flat = [x for body in first for x in (body if isinstance(body, list) else [body])]
    samples = [predictor.check_request(x, i) for i, x in enumerate(flat[:batch])]
    features = predictor.feature_names
    dense = torch.tensor([s.dense for s in samples])
    values = torch.tensor([i for f in features for s in samples for i in s.ids.get(f, [])])
    lengths = torch.tensor([len(s.ids.get(f, [])) for f in features for s in samples])
    times = []
    for _ in range(repeats + 3):
        start = time.perf_counter()
        predictor.probabilities(dense, values, lengths)
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:])


# ---------------------------------------------------------------------------------------- servers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(command: list[str], port: int, log: Path, timeout_s: float = 300) -> Iterator[str]:
    """Start a server process (its own process group), wait for ``/health``, stop it on the way out."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not come up: {log.read_text(errors='replace')[-3000:]}")
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                    break
            time.sleep(0.25)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(20)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def fastapi_server(artifact: str, port: int, threads: int) -> None:
    """The baseline: ``POST /predict`` calls ``Predictor.predict`` on the one sample of each request."""
    import uvicorn
    from fastapi import Body, FastAPI
    from fastapi.responses import PlainTextResponse

    from lightrec.inference import load

    torch.set_num_threads(threads)
    predictor = load(artifact)
    app = FastAPI()

    @app.post("/predict")
    def predict(body: Any = Body(...)) -> dict:  # noqa: B008 - FastAPI's declaration
        return {"scores": predictor.predict(body if isinstance(body, list) else [body]).tolist()}

    @app.get("/health")
    def health() -> PlainTextResponse:
        return PlainTextResponse("ok")

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---------------------------------------------------------------------------------------- load
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


async def _clients(port: int, clients: int, bodies: list[bytes], seconds: float, samples: int = 1) -> dict[str, Any]:
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
    elapsed = time.perf_counter() - start
    ordered = sorted(latencies)
    return {"clients": clients, "requests": len(latencies), "seconds": elapsed,
            "requests_per_s": statuses[200] / elapsed, "samples_per_s": statuses[200] * samples / elapsed,
            "p50_ms": 1e3 * ordered[len(ordered) // 2], "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "errors": {str(k): v for k, v in statuses.items() if k != 200}}  # fmt: skip


def _scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+) (\S+)$", text, re.M)}


def run_levels(url: str, bodies: list[bytes], seconds: float, levels: tuple[int, ...], metrics: bool,
               samples: int) -> dict[str, Any]:
    port = int(url.rsplit(":", 1)[1])
    asyncio.run(_clients(port, 8, bodies, min(1.0, seconds)))  # warm-up: connections, first batches
    out = {}
    for clients in levels:
        before = _scrape(url) if metrics else {}
        result = asyncio.run(_clients(port, clients, bodies, seconds, samples))
        if metrics:
            after = _scrape(url)
            forwards = after["lightrec_serving_batch_size_count"] - before["lightrec_serving_batch_size_count"]
            scored = after["lightrec_serving_batch_size_sum"] - before["lightrec_serving_batch_size_sum"]
            seconds_in = after["lightrec_serving_forward_seconds_sum"] - before["lightrec_serving_forward_seconds_sum"]
            result["samples_per_forward"] = scored / max(forwards, 1)
            result["forward_ms_in_server"] = 1e3 * seconds_in / max(forwards, 1)
        out[str(clients)] = result
        print(f"  {clients:4d} clients: {result['requests_per_s']:8.0f} req/s  {result['samples_per_s']:8.0f} samples/s  p50 {result['p50_ms']:7.2f} ms  "
              f"p99 {result['p99_ms']:7.2f} ms" + (f"  {result['samples_per_forward']:.1f} samples/forward"
                                                 if metrics else "") + (f"  errors {result['errors']}" if result["errors"] else ""),
              file=sys.stderr)  # fmt: skip
    return out


# ---------------------------------------------------------------------------------------- freshness hook
def make_publisher(artifact: Path, folder: Path) -> Callable[[], int] | None:
    """A function that publishes one new version to ``folder`` and returns its number -- or None
    while lightrec has no delta writer (``lightrec.distributed.deltas``, the online-training work).
    The deltas work fills this in: write a snapshot of ``artifact``'s tables, then deltas."""
    return None


def freshness_lag(url: str, publish: Callable[[], int], body: bytes, timeout_s: float = 60) -> float:
    """Seconds from ``publish()`` returning to the first response that carries its version."""
    version = publish()
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        request = urllib.request.Request(f"{url}/predict", data=body, headers={"content-type": "application/json"})
        if json.loads(urllib.request.urlopen(request, timeout=30).read())["version"] >= version:
            return time.perf_counter() - start
        time.sleep(0.01)
    raise TimeoutError(f"version {version} not served within {timeout_s} s")


# ---------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, help="an int8 artifact (default: export the recipe's DLRM)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per concurrency level")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrent clients, comma-separated")
    parser.add_argument("--workers", type=int, default=1, help="lightrec serve --workers")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--batch-timeout-ms", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per server process (both contenders)")
    parser.add_argument("--samples-per-request", type=int, default=1,
                        help="samples per request (Predictor's list form when > 1), for both contenders")
    parser.add_argument("--smoke", action="store_true", help="1 s per level: checks the script, not the speed")
    parser.add_argument("--out", type=Path, help="write the JSON here as well as to stdout")
    parser.add_argument("--fastapi-server", nargs=2, metavar=("ARTIFACT", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fastapi_server:
        fastapi_server(args.fastapi_server[0], int(args.fastapi_server[1]), args.threads)
        return
    seconds = 1.0 if args.smoke else args.seconds
    levels = tuple(int(x) for x in args.levels.split(","))
    threads_per_worker = args.threads
    with tempfile.TemporaryDirectory(prefix="bench_serve_") as tmp:
        folder = Path(tmp)
        artifact = args.artifact or build_artifact(folder)
        meta = json.loads(Path(f"{artifact}.meta.json").read_text())
        bodies = request_bodies(meta, 512 if args.samples_per_request == 1 else 64, args.samples_per_request)
        results: dict[str, Any] = {}
        print(f"lightrec serve ({args.workers} worker(s) x {threads_per_worker} threads):", file=sys.stderr)
        port = _free_port()
        command = [sys.executable, "-m", "lightrec.cli", "serve", str(artifact), "--port", str(port),
                   "--accelerator", "cpu", "--workers", str(args.workers), "--threads", str(threads_per_worker),
                   "--max-batch-size", str(args.max_batch_size), "--batch-timeout-ms", str(args.batch_timeout_ms),
                   "--max-queue", "4096"]  # fmt: skip
        with running(command, port, folder / "lightrec.log") as url:
            results["lightrec"] = run_levels(url, bodies, seconds, levels, True, args.samples_per_request)
            publisher = make_publisher(Path(artifact), folder / "published")
            lag = freshness_lag(url, publisher, bodies[0]) if publisher is not None else None
        print(f"plain FastAPI + Predictor.predict per request ({args.threads} threads):", file=sys.stderr)
        port = _free_port()
        command = [sys.executable, str(Path(__file__).resolve()), "--fastapi-server", str(artifact), str(port),
                   "--threads", str(args.threads)]  # fmt: skip
        with running(command, port, folder / "fastapi.log") as url:
            results["fastapi"] = run_levels(url, bodies, seconds, levels, False, args.samples_per_request)
        served = results["lightrec"].get("32", results["lightrec"][str(levels[-1])])
        served_batch = max(1, round(served["samples_per_forward"]))
        forward = {"batch_1_ms": 1e3 * forward_seconds(Path(artifact), bodies, 1, threads_per_worker),
                   f"batch_{served_batch}_ms": 1e3 * forward_seconds(Path(artifact), bodies, served_batch,
                                                                     threads_per_worker)}  # fmt: skip
    report = _report(args, levels, results, forward, served_batch, lag, str(args.artifact or "built: recipe DLRM int8"))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def _report(args: argparse.Namespace, levels: tuple[int, ...], results: dict[str, Any], forward: dict[str, float],
            served_batch: int, lag: float | None, artifact: str) -> dict[str, Any]:
    import lightrec

    targets: dict[str, Any] = {}
    if "32" in results["lightrec"] and "32" in results["fastapi"]:
        ours, theirs = results["lightrec"]["32"], results["fastapi"]["32"]
        ratio = ours["requests_per_s"] / max(theirs["requests_per_s"], 1e-9)
        bound = 2 * forward[f"batch_{served_batch}_ms"] + args.batch_timeout_ms
        targets = {"throughput_ratio_at_32": ratio, "throughput_target": 3.0, "throughput_met": ratio >= 3.0,
                   "p99_ms_at_32": ours["p99_ms"], "p99_bound_ms": bound, "p99_met": ours["p99_ms"] <= bound}
        print(f"at 32 clients: lightrec / FastAPI = {ratio:.2f}x (target 3x); p99 {ours['p99_ms']:.1f} ms "
              f"(bound {bound:.1f} ms = 2 x forward({served_batch}) + batch timeout)", file=sys.stderr)
    return {
        "benchmark": "lightrec serve vs a plain FastAPI endpoint (Predictor.predict per request)",
        "config": {"artifact": artifact, "levels": list(levels), "seconds_per_level": 1.0 if args.smoke else args.seconds,
                   "workers": args.workers, "threads": args.threads, "max_batch_size": args.max_batch_size,
                   "samples_per_request": args.samples_per_request,
                   "batch_timeout_ms": args.batch_timeout_ms, "smoke": args.smoke},
        "versions": {"torch": torch.__version__, "lightrec": lightrec.__version__, "python": platform.python_version()},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "results": results,
        "forward": forward,
        "targets": targets,
        "freshness": {"lag_s": lag, "note": None if lag is not None else
                      "no delta writer yet (lightrec.distributed.deltas): make_publisher is the hook"},
    }


if __name__ == "__main__":
    main()
