"""The shared-memory transport (review follow-up): a grown data segment whose name is gone before a
peer maps it (the writer left and a later start-up swept the name, or its exit grace ran out) is a
ShmPeerError naming the peer rank, the segment and the fix, not a bare FileNotFoundError."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from lightrec._native import native_ops
from tests.multiprocess import run_ranks

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or native_ops() is None or not native_ops().shm,  # type: ignore[union-attr]
    reason="the shared-memory transport needs Linux and lightrec's native ops",
)


def _vanished_segment_body(rank: int, world_size: int) -> str:
    """Rank 0 sends rank 1 more than its first arena holds (a new generation), publishes, and the
    new segment's name is removed before rank 1 maps it; rank 1 reads."""
    import torch.distributed as dist

    from lightrec.distributed.comm.shm_transport import _INITIAL_ARENA, ShmPeerError, shm_transport

    t = shm_transport(dist.group.WORLD)
    assert t is not None
    nbytes = _INITIAL_ARENA + 4096
    ex = t.start([0, nbytes] if rank == 0 else [0, 0])
    name = ""
    if rank == 0:
        ex.send_view(1, torch.uint8, nbytes).fill_(7)
        ex.publish()
        grown = t._arenas[-1].segment
        assert grown.name.endswith("-data1"), grown.name
        name = grown.name
        grown.unlink()  # what the sweep of a later start-up does to a name its dead creator left
    else:
        ex.publish()
    dist.barrier()
    message = ""
    if rank == 1:
        with pytest.raises(ShmPeerError) as e:
            ex.recv_view(0, torch.uint8, nbytes)
        message = str(e.value)
    ex.finish()
    dist.barrier()
    names: list[str] = ["", ""]
    dist.all_gather_object(names, name)
    return message + "\n" + names[0]


def test_a_vanished_grown_segment_is_a_peer_error_naming_rank_segment_and_fix() -> None:
    before = set(os.listdir("/dev/shm"))
    _, second = run_ranks(_vanished_segment_body, 2, timeout=120)
    message, name = second.rsplit("\n", 1)
    assert name and name in message, message
    assert "rank 0" in message and "LIGHTREC_SHM=0" in message, message
    assert [n for n in set(os.listdir("/dev/shm")) - before if n.startswith("lightrec-")] == []
