"""The shared-memory transport (review): what a SIGTERM'd rank leaves in the segment folder.

A rank killed by a plain SIGTERM (Python's default: the process ends at once, no exit hook runs)
leaves the name of a grown send buffer that a peer acked without mapping (what a gather to rank 0
does to the other ranks' buffers): only the creator's exit hook would have unlinked it. The next
transport's start-up sweep removes it (its creator is gone), so nothing stays for good. A SIGTERM
turned into an exception and a normal exit (what Lightning's SIGTERM handling does) runs the hook,
and the name is gone at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightrec._native import native_ops

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or native_ops() is None or not native_ops().shm,  # type: ignore[union-attr]
    reason="the shared-memory transport needs Linux and lightrec's native ops",
)
ROOT = Path(__file__).resolve().parents[2]

_RANK_SCRIPT = textwrap.dedent(
    """
    import signal, sys, time, torch, torch.distributed as dist
    from lightrec.distributed.comm.shm_transport import _INITIAL_ARENA, shm_transport
    rank, world, init, on_sigterm = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if on_sigterm == "exit":  # an exception, then a normal exit (Lightning's SIGTERMException)
        signal.signal(signal.SIGTERM, lambda *args: sys.exit(143))
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    t = shm_transport(dist.group.WORLD)
    assert t is not None
    ex = t.start([0, _INITIAL_ARENA + 4096] if rank == 0 else [0, 0])  # rank 0 grows its send buffer
    ex.publish()
    ex.finish()  # rank 1 acks without mapping it: only rank 0's exit hook unlinks the name
    dist.barrier()
    print("grown", flush=True)
    if rank == 0:
        time.sleep(600)
    ex = t.start([0, 0])
    ex.publish()
    ex.recv_view(0, torch.uint8, 0)  # waits for rank 0, which is killed
    """
)


@pytest.mark.parametrize(
    "on_sigterm",
    ["default", pytest.param("exit", marks=pytest.mark.slow)],  # the control case: slow suite
)
def test_a_sigtermed_ranks_grown_segment_is_swept_by_the_next_start(tmp_path: Path, on_sigterm: str) -> None:
    from lightrec.distributed.comm.shm_segments import sweep_stale_segments

    folder = tmp_path / "shm"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LIGHTREC_SHM": "1", "LIGHTREC_SHM_DIR": str(folder)}
    init = f"file://{tmp_path / 'init'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK_SCRIPT, str(r), "2", init, on_sigterm],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "grown", p.communicate(timeout=30)
        grown = f"lightrec-{os.getuid()}-{procs[0].pid}-"
        named = os.listdir(folder)  # rank 0's grown buffer is linked while it runs
        assert [n for n in named if n.startswith(grown) and n.endswith("-data1")], named
        procs[0].send_signal(signal.SIGTERM)
        procs[0].wait(timeout=30)
        _, err = procs[1].communicate(timeout=60)
        assert "ShmPeerError" in err and "died" in err, err  # its peer names the killed rank
        if on_sigterm == "default":
            assert procs[0].returncode == -signal.SIGTERM
            left = os.listdir(folder)
            assert len(left) == 1 and left[0].startswith(grown), left  # no exit hook ran
            assert sweep_stale_segments(folder) == left  # what the next transport's start-up runs
        else:
            assert procs[0].returncode == 143
        assert os.listdir(folder) == []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
