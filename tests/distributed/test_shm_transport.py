"""The intra-host shared-memory transport: the same bytes as gloo, and nothing left in /dev/shm.

* Every sharding type, pooled and sequence collections, 2 and 3 ranks: the same training run
  through gloo (``LIGHTREC_SHM=0`` for that process group) and through shared memory gives bit
  for bit the same outputs and tables.
* The transport itself: uneven and empty chunks, an exchange larger than the arena (a new
  generation), exchanges waited for out of order.
* A rank killed with SIGKILL leaves no segment behind, its peer gets a ShmPeerError naming it,
  and a file left by a dead process (the start-up window) is swept by the next run.
* A /dev/shm too small gives ShmSpaceError on every rank, naming the free space and the fix.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from lightrec._native import native_ops
from tests.distributed.test_sharded_embeddings import (
    KINDS,
    fused_params,
    global_batch,
    plan_generators,
    table_configs,
)
from tests.multiprocess import run_ranks

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or native_ops() is None or not native_ops().shm,  # type: ignore[union-attr]
    reason="the shared-memory transport needs Linux and lightrec's native ops",
)
ROOT = Path(__file__).resolve().parents[2]


def _groups() -> tuple[Any, Any]:
    """Two process groups over every rank: the first exchanges through gloo, the second through
    shared memory (the transport decides per group, at its first exchange)."""
    import torch.distributed as dist

    from lightrec.distributed.comm.shm_transport import shm_transport

    os.environ["LIGHTREC_SHM"] = "0"
    gloo = dist.new_group(backend="gloo")
    assert shm_transport(gloo) is None
    os.environ["LIGHTREC_SHM"] = "1"
    shm = dist.new_group(backend="gloo")
    assert shm_transport(shm) is not None
    return gloo, shm


def _train(
    rank: int, world_size: int, group: Any, kind: str, pooled: bool, weighted: bool
) -> list[torch.Tensor]:
    """Three fused steps of one sharded collection on ``group``: outputs, then the full tables."""
    from lightrec.distributed import (
        EmbeddingBagCollectionSharder,
        EmbeddingCollectionSharder,
        ShardingEnv,
        gather_full_state_dict,
    )
    from lightrec.distributed.planner import construct_module_sharding_plan
    from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    torch.manual_seed(6)
    configs = table_configs(pooled, world_size)
    ref = EmbeddingBagCollection(configs, is_weighted=weighted) if pooled else EmbeddingCollection(configs)
    plan = construct_module_sharding_plan(
        ref, plan_generators(kind, world_size, pooled), world_size=world_size
    )
    sharder_cls = EmbeddingBagCollectionSharder if pooled else EmbeddingCollectionSharder
    sharded = sharder_cls(fused_params=fused_params("rowwise_adagrad")).shard(
        ref, plan, ShardingEnv.from_process_group(group), torch.device("cpu")
    )
    seen = []
    for step in range(3):
        kjt = global_batch(step, world_size, step != 1 or "zero", weighted and pooled, seed=2)[rank]
        out = sharded(kjt).wait()
        if pooled:
            values = out.values()
            loss = (values * torch.linspace(-1, 1, values.numel()).view_as(values)).sum()
        else:
            values = torch.cat([out[k].values().flatten() for k in sorted(out)])
            loss = (values**2).sum()
        loss.backward()
        seen.append(values.detach().clone())
        if kind == "dense_kernels":
            with torch.no_grad():
                for p in sharded.parameters():
                    if p.grad is not None:
                        p -= 0.1 * p.grad
                        p.grad = None
    full = gather_full_state_dict(sharded.state_dict())
    return seen + [full[k].detach().clone() for k in sorted(full)]


def _equality_body(rank: int, world_size: int) -> dict[str, bool]:
    gloo, shm = _groups()
    results = {}
    for kind in KINDS:
        for pooled, weighted in ((True, False), (True, True), (False, False)):
            if kind == "dense_kernels" and not pooled:
                continue
            a = _train(rank, world_size, gloo, kind, pooled, weighted)
            b = _train(rank, world_size, shm, kind, pooled, weighted)
            results[f"{kind}/pooled={pooled}/weighted={weighted}"] = len(a) == len(b) and all(
                torch.equal(x, y) for x, y in zip(a, b)
            )
    return results


@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3 ranks: slow suite (CI budget)
def test_shared_memory_equals_gloo_bit_for_bit_for_every_sharding_type(world_size: int) -> None:
    per_rank = run_ranks(_equality_body, world_size, timeout=400)
    differing = [f"rank {r}: {case}" for r, res in enumerate(per_rank) for case, ok in res.items() if not ok]
    assert not differing, "shared memory and gloo differ:\n" + "\n".join(differing)
    assert len(per_rank[0]) == len(KINDS) * 3 - 1


def _transport_body(rank: int, world_size: int) -> list[list[torch.Tensor]]:
    """Raw exchanges: rank r sends (r + 1) * (d + 1) * k floats to rank d; one exchange bigger than
    the 16 MiB arena; the receives of two in-flight exchanges are taken in reverse order."""
    import torch.distributed as dist

    from lightrec.distributed.comm.shm_transport import shm_transport

    t = shm_transport(dist.group.WORLD)
    assert t is not None

    def start(k: int) -> Any:
        sizes = [(rank + 1) * (d + 1) * k for d in range(world_size)]
        ex = t.start([0 if d == rank else 4 * n for d, n in enumerate(sizes)])
        for d, n in enumerate(sizes):
            if d != rank and n:
                ex.send_view(d, torch.float32, n).copy_(
                    torch.arange(n, dtype=torch.float32) + 1000 * rank + d
                )
        ex.publish()
        return ex

    def receive(ex: Any, k: int) -> list[torch.Tensor]:
        got = []
        for s in range(world_size):
            n = (s + 1) * (rank + 1) * k
            got.append(ex.recv_view(s, torch.float32, n).clone() if s != rank and n else torch.zeros(0))
        ex.finish()
        return got

    out = []
    for k in (0, 3, 5):
        out.append(receive(start(k), k))
    big = 2_000_000  # 8 MB per destination and rank: more than the first arena
    first, second = start(7), start(big)
    out.append(receive(second, big)[:1] if rank else receive(second, big)[1:2])
    out.append(receive(first, 7))
    for _ in range(80):  # more exchanges than slots: slots and arena ranges are reused
        out[-1] = receive(start(7), 7)
    return out


@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3 ranks: slow suite (CI budget)
def test_raw_exchanges_deliver_every_chunk(world_size: int) -> None:
    per_rank = run_ranks(_transport_body, world_size, timeout=240)
    for rank, out in enumerate(per_rank):
        for k, got in zip((0, 3, 5), out[:3]):
            for s, t in enumerate(got):
                n = (s + 1) * (rank + 1) * k if s != rank else 0
                assert torch.equal(t, torch.arange(n, dtype=torch.float32) + 1000 * s + rank)
        src = 1 if rank == 0 else 0
        n = (src + 1) * (rank + 1) * 2_000_000
        assert torch.equal(out[3][0], torch.arange(n, dtype=torch.float32) + 1000 * src + rank)
        for s, t in enumerate(out[4]):
            n = (s + 1) * (rank + 1) * 7 if s != rank else 0
            assert torch.equal(t, torch.arange(n, dtype=torch.float32) + 1000 * s + rank)


_KILL_SCRIPT = textwrap.dedent(
    """
    import os, sys, time, torch, torch.distributed as dist
    from lightrec.distributed.comm.shm_transport import shm_transport
    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    t = shm_transport(dist.group.WORLD)
    assert t is not None
    for step in range(10**9):
        ex = t.start([0 if d == rank else 4096 for d in range(world)])
        ex.publish()
        for s in range(world):
            if s != rank:
                ex.recv_view(s, torch.uint8, 4096)
        ex.finish()
        if step == 50:
            print("running", flush=True)
    """
)


def _abandoned_body(rank: int, world_size: int) -> list[float]:
    """Exchanges started and published, then dropped unread (work started ahead and abandoned, as a
    pipeline does when the model rebuilds its features): more of them than the transport has slots,
    then exchanges that are read. Without the release of a dropped exchange, the writers block
    once the slots come round (the peer never read the first ones)."""
    import torch.distributed as dist

    from lightrec.distributed.comm.shm_transport import _SLOTS, shm_transport

    t = shm_transport(dist.group.WORLD)
    assert t is not None
    for _ in range(_SLOTS + 8):
        ex = t.start([0 if d == rank else 64 for d in range(world_size)])
        ex.publish()
        del ex  # the last reference: dropped unread
    got = []
    for k in range(3):
        ex = t.start([0 if d == rank else 4 for d in range(world_size)])
        for d in range(world_size):
            if d != rank:
                ex.send_view(d, torch.float32, 1).fill_(100.0 * rank + k)
        ex.publish()
        got += [float(ex.recv_view(s, torch.float32, 1)) for s in range(world_size) if s != rank]
        ex.finish()
    return got


def test_exchanges_dropped_unread_release_their_slots() -> None:
    per_rank = run_ranks(_abandoned_body, 2, timeout=120)
    assert per_rank == [[100.0, 101.0, 102.0], [0.0, 1.0, 2.0]]


def _lightrec_files(pids: list[int]) -> list[str]:
    uid = os.getuid()
    return [n for n in os.listdir("/dev/shm") for p in pids if n.startswith(f"lightrec-{uid}-{p}-")]


def test_a_sigkilled_rank_leaves_no_segment_and_its_peer_names_it(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LIGHTREC_SHM": "1"}
    init = f"file://{tmp_path / 'init'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _KILL_SCRIPT, str(r), "2", init],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(2)
    ]
    try:
        assert procs[1].stdout is not None
        assert procs[1].stdout.readline().strip() == "running"
        pids = [p.pid for p in procs]
        os.kill(pids[1], signal.SIGKILL)
        _, err = procs[0].communicate(timeout=60)
        assert procs[0].returncode != 0
        assert "ShmPeerError" in err and f"rank 1 (pid {pids[1]})" in err and "died" in err, err
        procs[1].wait(timeout=10)
        assert _lightrec_files(pids) == []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_a_file_left_by_a_dead_process_is_swept(tmp_path: Path) -> None:
    from lightrec.distributed.comm.shm_segments import ShmSegment, sweep_stale_segments

    # A process that creates a segment and dies before anyone unlinks it (the start-up window).
    code = (
        "from pathlib import Path; from lightrec.distributed.comm.shm_segments import ShmSegment; "
        f"s = ShmSegment.create('test-window', 4096, 'a test', Path({str(tmp_path)!r})); print(s.name)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    name = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert (tmp_path / name).exists()
    assert oct((tmp_path / name).stat().st_mode & 0o777) == oct(0o600)  # private to the user
    alive = ShmSegment.create("test-alive", 4096, "a test", tmp_path)  # this process's own: kept
    assert sweep_stale_segments(tmp_path) == [name]
    assert sorted(os.listdir(tmp_path)) == [alive.name]
    alive.unlink(tmp_path)


def _space_body(rank: int, world_size: int) -> str:
    import errno

    import torch.distributed as dist

    from lightrec.distributed.comm.shm_segments import ShmSpaceError
    from lightrec.distributed.comm.shm_transport import shm_transport

    if rank == 1:  # this rank's /dev/shm is full

        def full(fd: int, offset: int, length: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        os.posix_fallocate = full  # type: ignore[assignment]
    with pytest.raises(ShmSpaceError) as e:
        shm_transport(dist.new_group(backend="gloo"))
    return str(e.value)


def test_a_too_small_dev_shm_is_a_clear_error_on_every_rank() -> None:
    for message in run_ranks(_space_body, 2, timeout=120):
        assert "/dev/shm has" in message and "MiB free" in message, message
        assert "--shm-size" in message and "LIGHTREC_SHM=0" in message, message


def test_segments_are_gone_after_a_run(tmp_path: Path) -> None:
    """A whole training run leaves nothing: the names are unlinked once every peer mapped them."""
    before = set(os.listdir("/dev/shm"))
    run_ranks(_transport_body, 2, timeout=240)
    assert [n for n in set(os.listdir("/dev/shm")) - before if n.startswith("lightrec-")] == []
