"""Review checks of the shared-memory collectives on real gloo ranks (``comm/shm_allreduce.py``,
``comm/shm_transport.py``, ``comm/shm_segments.py``).

* ``shm_allreduce_`` against gloo's ``all_reduce`` of the tensor divided by the world (what DDP does):
  float32 / float64 / float16 / bfloat16, empty and odd sizes, more buckets than the transport has
  slots, a bucket larger than the first arena; the same bytes on every rank;
* refused input (not 1-D, not contiguous) names the fix;
* two jobs on one host at once keep their segments apart;
* a peer that is alive but stuck is reported within ``LIGHTREC_SHM_TIMEOUT``;
* a segment folder that cannot be written is a clear error on every rank, not a hang;
* a data segment grown for an exchange that some peer never reads is unlinked when the run ends.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from lightrec._native import native_ops
from tests.multiprocess import run_ranks

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or native_ops() is None or not native_ops().shm,  # type: ignore[union-attr]
    reason="the shared-memory transport needs Linux and lightrec's native ops",
)

_CASES = [
    (0, torch.float32),
    (1, torch.float32),
    (2, torch.float16),
    (3, torch.bfloat16),
    (7, torch.float64),
    (1001, torch.float16),
    (1001, torch.bfloat16),
    (4_500_001, torch.float32),  # 18 MB: larger than the first 16 MiB arena
]


def _cases_body(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    from lightrec.distributed.comm.shm_allreduce import shm_allreduce_
    from lightrec.distributed.comm.shm_transport import shm_transport

    transport = shm_transport(dist.new_group(backend="gloo"))
    assert transport is not None
    gloo = dist.new_group(backend="gloo")
    mine, same_as_gloo = [], []
    for numel, dtype in _CASES:
        g = torch.Generator().manual_seed(100 * rank + numel)
        x = (torch.randn(numel, generator=g, dtype=torch.float64) * 10).to(dtype)
        expected = x / world_size
        dist.all_reduce(expected, group=gloo)
        got = shm_allreduce_(transport, x.clone())
        mine.append(got)
        same_as_gloo.append(torch.equal(got, expected))
    for step in range(150):  # more buckets than slots, of changing sizes
        x = torch.full((1 + step % 13,), float(rank + step))
        expected = x / world_size
        dist.all_reduce(expected, group=gloo)
        same_as_gloo.append(torch.equal(shm_allreduce_(transport, x), expected))
    refusals = []
    for bad in (torch.zeros(4, 4), torch.zeros(8)[::2]):
        try:
            shm_allreduce_(transport, bad)
        except ValueError as exc:
            refusals.append(str(exc))
    return {"mine": mine, "gloo": same_as_gloo, "refusals": refusals}


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_ranks(_cases_body, 2, timeout=180)


def test_shm_mean_is_gloos_for_every_dtype_size_and_bucket_count(two_ranks: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(two_ranks):
        assert all(r["gloo"]), f"rank {rank}: {[i for i, ok in enumerate(r['gloo']) if not ok]}"


def test_shm_mean_is_the_same_bytes_on_every_rank(two_ranks: list[dict[str, Any]]) -> None:
    for a, b in zip(two_ranks[0]["mine"], two_ranks[1]["mine"], strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_shm_allreduce_refuses_a_tensor_that_is_not_flat_and_contiguous(two_ranks: list[dict[str, Any]]) -> None:
    for r in two_ranks:
        assert len(r["refusals"]) == 2 and all("contiguous 1-D" in m for m in r["refusals"]), r["refusals"]


@pytest.mark.slow  # a 3-rank spawn
def test_on_three_ranks_odd_sizes_give_the_same_bytes_everywhere() -> None:
    per_rank = run_ranks(_cases_body, 3, timeout=240)
    for r in per_rank[1:]:
        for a, b in zip(per_rank[0]["mine"], r["mine"], strict=True):
            assert torch.equal(a, b)


def _job_body(rank: int, world_size: int, job: int) -> tuple[list[float], list[str]]:
    import torch.distributed as dist

    from lightrec.distributed.comm import shm_segments
    from lightrec.distributed.comm.shm_allreduce import shm_allreduce_
    from lightrec.distributed.comm.shm_transport import shm_transport

    transport = shm_transport(dist.group.WORLD)
    assert transport is not None
    sums = []
    for step in range(200):
        x = torch.full((1000,), float(1000 * job + 10 * rank + step))
        sums.append(float(shm_allreduce_(transport, x)[0]))
    return sums, [transport._tag, str(shm_segments.SHM_DIR)]


@pytest.mark.slow  # worker or rank processes started several times: ~10 s
def test_two_jobs_on_one_host_at_once_keep_their_segments_apart() -> None:
    out: dict[int, list[tuple[list[float], list[str]]]] = {}

    def job(j: int) -> None:
        out[j] = run_ranks(_job_body, 2, args=(j,), timeout=120)

    threads = [threading.Thread(target=job, args=(j,)) for j in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=200)
    assert sorted(out) == [1, 2]
    for j, per_rank in out.items():
        for sums, _ in per_rank:
            assert sums == [(2000.0 * j + 10 + 2 * step) / 2 for step in range(200)]


def _stuck_body(rank: int, world_size: int) -> tuple[str, float]:
    import torch.distributed as dist

    from lightrec.distributed.comm import ShmPeerError
    from lightrec.distributed.comm.shm_allreduce import shm_allreduce_
    from lightrec.distributed.comm.shm_transport import shm_transport

    transport = shm_transport(dist.group.WORLD)
    assert transport is not None
    if rank == 1:
        time.sleep(8)  # alive, but not in the collective
        return "slept", 0.0
    began = time.monotonic()
    try:
        shm_allreduce_(transport, torch.ones(10))
    except ShmPeerError as exc:
        return str(exc), time.monotonic() - began
    return "no error", time.monotonic() - began


@pytest.mark.slow  # waits out a 2 s timeout on purpose, after starting 2 ranks
def test_a_stuck_peer_is_reported_within_the_shm_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTREC_SHM_TIMEOUT", "2")
    message, waited = run_ranks(_stuck_body, 2, timeout=60)[0]
    assert "timed out" in message and "rank 1" in message and "LIGHTREC_SHM_TIMEOUT" in message, message
    assert waited < 6, waited


def _unwritable_body(rank: int, world_size: int) -> str:
    import torch.distributed as dist

    from lightrec.distributed.comm.shm_segments import ShmSpaceError
    from lightrec.distributed.comm.shm_transport import shm_transport

    try:
        shm_transport(dist.new_group(backend="gloo"))
    except ShmSpaceError as exc:
        return str(exc)
    return "no error"


def test_a_segment_folder_that_cannot_be_written_is_a_clear_error_on_every_rank(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "no" / "such" / "folder"
    monkeypatch.setenv("LIGHTREC_SHM_DIR", str(missing))
    for message in run_ranks(_unwritable_body, 2, timeout=60):
        assert str(missing) in message and "LIGHTREC_SHM=0" in message and "LIGHTREC_SHM_DIR" in message, message


def _to_rank_zero_body(rank: int, world_size: int) -> list[float]:
    """Every rank sends rank 0 more than its first arena holds (a new generation), and only rank 0
    reads: ranks 1 and 2 never map each other's new segments (the pattern of a gather to rank 0)."""
    import torch.distributed as dist

    from lightrec.distributed.comm.shm_transport import shm_transport

    transport = shm_transport(dist.group.WORLD)
    assert transport is not None
    n = 5_000_000  # 20 MB of float32
    got = []
    for step in range(2):
        ex = transport.start([n * 4 if d == 0 and rank != 0 else 0 for d in range(world_size)])
        if rank != 0:
            ex.send_view(0, torch.float32, n).fill_(float(rank + step))
        ex.publish()
        if rank == 0:
            got += [float(ex.recv_view(s, torch.float32, n)[-1]) for s in range(1, world_size)]
        ex.finish()
    dist.barrier()
    return got


def test_grown_segments_that_a_peer_never_maps_are_gone_after_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LIGHTREC_SHM_DIR", str(tmp_path))
    per_rank = run_ranks(_to_rank_zero_body, 3, timeout=120)
    assert per_rank[0] == [1.0, 2.0, 2.0, 3.0]
    time.sleep(0.5)  # the ranks have reported; give their exit a moment
    assert os.listdir(tmp_path) == []


def _two_hosts_body(rank: int, world_size: int) -> bool:
    """Rank 1 says it runs on another host (a segment folder shared across hosts would still open)."""
    import socket

    import torch.distributed as dist

    from lightrec.distributed.comm.shm_transport import shm_transport

    if rank == 1:
        socket.gethostname = lambda: "another-host"
    return shm_transport(dist.new_group(backend="gloo")) is None


def test_ranks_on_different_hosts_keep_gloo_even_where_the_segments_open() -> None:
    assert run_ranks(_two_hosts_body, 2, timeout=60) == [True, True]


def _failed_handshake_body(rank: int, world_size: int) -> list[str]:
    """The start-up exchange of segment names fails (a peer gone): this rank's new names must not stay."""
    from lightrec.distributed.comm import shm_segments, shm_transport

    def gone(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")

    shm_transport.dist.all_gather_object = gone
    with pytest.raises(RuntimeError, match="closed by peer"):
        shm_transport.shm_transport(shm_transport.dist.group.WORLD)
    prefix = f"lightrec-{os.getuid()}-{os.getpid()}-"
    return [n for n in os.listdir(shm_segments.SHM_DIR) if n.startswith(prefix)]


def test_a_failed_start_up_handshake_leaves_no_segment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LIGHTREC_SHM_DIR", str(tmp_path))
    assert run_ranks(_failed_handshake_body, 2, timeout=60) == [[], []]
