"""``BackgroundPublisher`` on 2 gloo ranks: a disk that fills while a version is written in the
background fails that version on every rank (raised by the next ``publish``, not lost), the folder
keeps its complete versions, and the next version is a snapshot (the failed one's rows were taken
from the tracker); the publish thread runs at the priority asked; a closed publisher refuses work.
Exactness of what it writes is in ``test_publish_changes.py``; kills in ``test_publish_kill.py``.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.model_tracker.helpers import train_step
from tests.multiprocess import run_ranks


def _body(rank: int, world_size: int, tmp: str) -> dict[str, Any]:
    from lightrec.distributed.deltas import BackgroundPublisher, DeltaWriteError
    from lightrec.distributed.deltas import writer as writer_module
    from lightrec.distributed.model_tracker import DeltaTrackerConfig
    from tests.distributed.model_tracker.helpers import sharded

    model = sharded(f"{tmp}/ssd", world_size)
    tracker = model.init_torchrec_delta_tracker(DeltaTrackerConfig())
    folder = f"{tmp}/publish"
    out: dict[str, Any] = {}
    publisher = BackgroundPublisher(model, priority="idle" if rank else "low")
    thread = next(t for t in threading.enumerate() if t.name == "lightrec-delta-publisher")
    out["policy"] = os.sched_getscheduler(thread.native_id) if hasattr(os, "sched_getscheduler") else None
    out["nice"] = os.getpriority(os.PRIO_PROCESS, thread.native_id) if hasattr(os, "getpriority") else None
    out["main_nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if out["nice"] is not None else None
    out["v1"] = publisher.publish(folder, tracker).result()
    train_step(model, 1, rank)
    real = writer_module.write_synced
    if rank == 0:

        def full_disk(path: Path, parts: list[memoryview]) -> Any:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

        writer_module.write_synced = full_disk  # the disk is full while v2 is written, in the background
    pending = publisher.publish(folder, tracker, global_step=1)
    train_step(model, 2, rank)  # training goes on meanwhile
    try:
        publisher.publish(folder, tracker, global_step=2)
    except DeltaWriteError as exc:
        out["raised"] = (type(exc).__name__, exc.errno)
    out["pending_error"] = type(pending._error).__name__
    writer_module.write_synced = real
    after = publisher.publish(folder, tracker, global_step=2)  # snapshot=None, yet a snapshot
    out["after"] = after.result()
    publisher.close()
    try:
        publisher.publish(folder, tracker)
    except RuntimeError as exc:
        out["closed"] = str(exc)
    return out


@pytest.mark.slow  # 2 ranks, a disk that fills, then the snapshot after it: ~33 s on 2 shared cores
def test_a_full_disk_in_the_background_fails_the_version_on_every_rank_and_a_snapshot_follows(tmp_path: Path) -> None:
    from lightrec.distributed.deltas import DeltaReader

    results = run_ranks(_body, 2, args=(str(tmp_path),), timeout=300)
    for r in results:
        assert r["v1"] == 1 and r["after"] == 2, r
        assert r["raised"] == ("DeltaWriteError", errno.ENOSPC) and r["pending_error"] == "DeltaWriteError", r
        assert "closed" in r["closed"], r
    if results[0]["nice"] is not None:  # rank 0's thread "low" (nice 10), rank 1's "idle" (SCHED_IDLE)
        assert results[0]["nice"] == 10 and results[0]["policy"] == os.SCHED_OTHER, results[0]
        assert results[1]["policy"] == os.SCHED_IDLE, results[1]
        assert results[0]["main_nice"] == results[1]["main_nice"] == 0  # training's threads keep theirs
    reader = DeltaReader(tmp_path / "publish")
    assert reader.versions() == [1, 2]
    assert reader.manifest(2).kind == "snapshot" and reader.manifest(2).global_step == 2
    assert not [p for p in (tmp_path / "publish").iterdir() if p.name.startswith(".tmp-")]
    reader.state()


def test_a_model_without_sharded_tables_is_refused() -> None:
    from torch import nn

    from lightrec.distributed.deltas import BackgroundPublisher, DeltaFormatError

    with pytest.raises(DeltaFormatError, match="no sharded embedding collection"):
        BackgroundPublisher(nn.Linear(2, 2))
    with pytest.raises(DeltaFormatError, match="priority must be one of"):
        BackgroundPublisher(nn.Linear(2, 2), priority="lowest")
