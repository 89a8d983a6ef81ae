"""A rank SIGKILLed in the middle of ``publish_changes`` on 2 gloo ranks: the survivor raises instead
of hanging, and the folder keeps the complete versions only (every one verifies, the newest is the
last one published whole). The writer's own crash points are tested in
``tests/distributed/deltas/test_faults.py``; here the kill lands inside a sharded publish: rank 0
in the middle of writing the version (at its third file-system call), or rank 1 while the rows
travel to rank 0 -- through ``publish_changes``, and through ``BackgroundPublisher`` (the kill then
lands in the publisher's thread, and the survivor learns it from ``wait``).
"""

from __future__ import annotations

import io
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from tests.distributed.model_tracker.helpers import train_step
from tests.multiprocess import _worker


def _body(rank: int, world_size: int, tmp: str, victim: int, background: bool) -> dict[str, Any]:
    import os

    from lightrec.distributed.deltas import BackgroundPublisher, publish_changes, sharded_rows
    from lightrec.distributed.model_tracker import DeltaTrackerConfig
    from tests.distributed.deltas.kill_writer import _arm
    from tests.distributed.model_tracker.helpers import sharded

    model = sharded(f"{tmp}/ssd-{rank}", world_size)
    tracker = model.init_torchrec_delta_tracker(DeltaTrackerConfig())
    folder = f"{tmp}/publish"
    for step in (1, 2):
        publish_changes(model, folder, tracker, global_step=step - 1)
        train_step(model, step, rank)
    if rank == victim == 0:
        _arm(3)  # SIGKILL at rank 0's third file-system call: inside the write of v3
    elif rank == victim:

        def die(*args: Any, **kwargs: Any) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        sharded_rows._gather_to_root = die  # the rows' gather to rank 0 (shared memory or gloo)
    try:
        if background:
            publisher = BackgroundPublisher(model)
            publisher.publish(folder, tracker, global_step=2)
            publisher.close()  # the survivor learns of the death from the publisher's thread
        else:
            publish_changes(model, folder, tracker, global_step=2)
    except Exception as exc:  # noqa: BLE001 - what the survivor saw is the result
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None}


@pytest.mark.parametrize(("victim", "background"), [(0, False), pytest.param(1, False, marks=pytest.mark.slow),
                                                    (1, True), pytest.param(0, True, marks=pytest.mark.slow)])  # fmt: skip
def test_a_rank_killed_mid_publish_leaves_complete_versions_only(tmp_path: Path, victim: int, background: bool) -> None:
    from lightrec.distributed.deltas import DeltaReader

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as rendezvous:
        procs = [
            ctx.Process(target=_worker, args=(r, 2, f"{rendezvous}/pg", _body, (str(tmp_path), victim, background), queue, 60.0),
                        daemon=True)
            for r in range(2)
        ]  # fmt: skip
        for p in procs:
            p.start()
        try:
            rank, status, payload = queue.get(timeout=240)
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
    assert procs[victim].exitcode == -signal.SIGKILL
    assert rank == 1 - victim and status == "ok", payload
    seen = torch.load(io.BytesIO(payload), weights_only=True)["error"]
    assert seen is not None and any(e in seen for e in ("CollectiveError", "DeltaPublishError", "ShmPeerError")), seen
    reader = DeltaReader(tmp_path / "publish")
    assert reader.versions() == [1, 2]
    for v in reader.versions():
        reader.read(v)  # every visible version verifies
    assert reader.latest() == 2 and reader.latest_hint() == 2
    reader.state()
