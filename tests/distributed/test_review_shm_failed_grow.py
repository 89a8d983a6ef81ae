"""The shared-memory transport (review): a rank whose send buffer cannot grow in the middle of a run
(``/dev/shm`` full on that rank's ``posix_fallocate``, or the mapping refused) raises ShmSpaceError,
and so do its peers, at once -- not after the process group's timeout (30 minutes by default).

* a peer waiting to read the failed exchange wakes at once (the exchange is published as failed);
* a peer waiting for a later exchange of that rank notices the failure record within about a second;
* later exchanges raise on both ranks, and nothing stays in the segment folder.

The failing rank stays alive in a gloo barrier meanwhile (as a rank whose teardown waits at a
collective does): before the fix its peer waited out ``LIGHTREC_SHM_TIMEOUT`` and reported a stuck
peer instead of the space.
"""

from __future__ import annotations

import os
import sys
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


def _no_room(how: str) -> Any:
    """Make this process's next segment fail as ``how`` says; returns what puts it back."""
    import errno
    import mmap

    def refuse(*args: object) -> None:
        if how == "fallocate":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    name, owner = ("posix_fallocate", os) if how == "fallocate" else ("mmap", mmap)
    original = getattr(owner, name)
    setattr(owner, name, refuse)
    return lambda: setattr(owner, name, original)


def _failed_grow_body(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    from lightrec.distributed.comm.shm_segments import ShmSpaceError
    from lightrec.distributed.comm.shm_transport import _INITIAL_ARENA, shm_transport

    nbytes = _INITIAL_ARENA + 4096  # more than the first arena: rank 1 must grow its send buffer
    out: dict[str, Any] = {}
    for how, peer_reads_it in (("fallocate", True), ("mmap", False)):
        t = shm_transport(dist.new_group(backend="gloo"))
        assert t is not None
        for _ in range(3):  # a few exchanges that fit
            ex = t.start([0 if d == rank else 64 for d in range(world_size)])
            ex.publish()
            for s in range(world_size):
                if s != rank:
                    ex.recv_view(s, torch.uint8, 64)
            ex.finish()
        put_back = _no_room(how) if rank == 1 else None
        began = time.monotonic()
        try:
            ex = t.start([nbytes, 0] if rank == 1 else [0, 0])
            ex.publish()
            if rank == 0 and peer_reads_it:
                ex.recv_view(1, torch.uint8, nbytes)  # waits to read the exchange that failed
            ex.finish()
            if rank == 0 and not peer_reads_it:
                ex = t.start([0, 0])
                ex.publish()
                ex.recv_view(1, torch.uint8, 0)  # waits for rank 1's next exchange, which never comes
            error = "no error"
        except ShmSpaceError as exc:
            error = str(exc)
        waited = time.monotonic() - began
        if put_back is not None:
            put_back()
        try:
            t.start([0, 0])
            later = "no error"
        except ShmSpaceError as exc:
            later = str(exc)
        dist.barrier()  # the failing rank stays alive, in a gloo collective, until its peer has its error
        out[how] = {"error": error, "waited": waited, "later": later}
    return out


def test_a_failed_grow_on_one_rank_is_a_space_error_on_every_rank_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LIGHTREC_SHM_DIR", str(tmp_path))
    monkeypatch.setenv("LIGHTREC_SHM_TIMEOUT", "20")  # what the peer waited for before the fix
    peer, failing = run_ranks(_failed_grow_body, 2, timeout=60)
    for how, strerror, fix in (
        ("fallocate", "No space left on device", f"{tmp_path} has"),
        ("mmap", "Cannot allocate memory", "Free memory"),
    ):
        mine = failing[how]["error"]
        assert strerror in mine and "rank 1's send buffer" in mine and "LIGHTREC_SHM=0" in mine, mine
        theirs = peer[how]["error"]
        assert "rank 1 of the shared-memory transport could not grow its send buffer" in theirs, theirs
        assert "rank 0 cannot go on" in theirs and strerror in theirs and fix in theirs, theirs
        assert "LIGHTREC_SHM=0" in theirs, theirs
        for rank in (peer, failing):
            assert rank[how]["later"] == rank[how]["error"]  # the transport cannot go on
    assert "MiB free" in peer["fallocate"]["error"] and "--shm-size" in peer["fallocate"]["error"]
    # at once (the failed exchange wakes it), and after a second (its next wait reads the record):
    # bounds far below the timeout, as a loaded machine may start rank 1's exchange late
    assert peer["fallocate"]["waited"] < 5.0, peer["fallocate"]
    assert peer["mmap"]["waited"] < 6.0, peer["mmap"]
    assert os.listdir(tmp_path) == []
