"""A publish that fails after reading its tracker, on 2 gloo ranks: the next publish is a snapshot.

The tracker's window moves at the read, so the rows of a failed version are in no version; a delta
after it would miss them and the published chain would no longer equal the model. Whatever fails --
rank 0's disk while ``publish_changes`` writes (``ENOSPC``), or every rank's read of its rows right
after the tracker read (through ``publish_changes`` and through ``BackgroundPublisher.publish``) --
the next publish is a snapshot even when asked for a delta (rank 0 decides; every rank agrees), the
deltas after it are deltas again, and the newest version rebuilds the trained model bit for bit.
``BackgroundPublisher.abort``: it stops the thread within its bound while the thread is inside a
collective whose peer never comes, and the thread ends (freeing its group) once that peer's leaves.
A full disk in the background thread is in ``test_background_publish.py``.
"""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed.model_tracker.helpers import train_step
from tests.multiprocess import run_ranks


def _body(rank: int, world_size: int, tmp: str, background: bool, fault: str) -> dict[str, Any]:
    from lightrec.distributed.deltas import BackgroundPublisher, publish_changes, sharded_rows
    from lightrec.distributed.deltas import writer as writer_module
    from lightrec.distributed.model_tracker import DeltaTrackerConfig
    from tests.distributed.model_tracker.helpers import sharded

    model = sharded(f"{tmp}/ssd", world_size)
    tracker = model.init_torchrec_delta_tracker(DeltaTrackerConfig(consumers=["publish"]))
    folder = f"{tmp}/publish"
    publisher = BackgroundPublisher(model) if background else None

    def publish(step: int) -> int:  # every publish after the first asks for a delta
        options: dict[str, Any] = {"consumer": "publish", "global_step": step, "snapshot": step == 0}
        if publisher is None:
            return publish_changes(model, folder, tracker, **options)
        return publisher.publish(folder, tracker, **options).result()

    versions = [publish(0)]
    train_step(model, 1, rank)  # rows of step 1 change: the failed version's rows
    real_write, real_chunks = writer_module.write_synced, sharded_rows._chunks

    def full_disk(path: Path, parts: list[memoryview]) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    def no_memory(*args: Any) -> Any:  # the read of the rows, after the tracker's read and the union
        raise MemoryError("the chunks of the rows to read")

    if fault == "write" and rank == 0:
        writer_module.write_synced = full_disk
    elif fault == "read":
        sharded_rows._chunks = no_memory
    try:
        publish(1)
        error = None
    except Exception as exc:  # noqa: BLE001 - what each rank saw is the result
        error = type(exc).__name__
    writer_module.write_synced, sharded_rows._chunks = real_write, real_chunks
    for step in (2, 3):
        train_step(model, step, rank)
        versions.append(publish(step))
    if publisher is not None:
        publisher.close()
    full = model.gather_full_state_dict(dst=0)
    tables = {t.name: full[f"{fqn}.weight"].float() for fqn, t in tracker.tables.items()} if full else {}
    return {"error": error, "versions": versions, "tables": tables}


@pytest.mark.parametrize(("background", "fault", "error"),
                         [(False, "write", "DeltaWriteError"),
                          pytest.param(False, "read", "MemoryError", marks=pytest.mark.slow),  # 2 gloo ranks, ~4 s each
                          pytest.param(True, "read", "MemoryError", marks=pytest.mark.slow)],
                         ids=["publish_changes-full-disk", "publish_changes-read", "BackgroundPublisher-read"])  # fmt: skip
def test_the_publish_after_a_failed_one_is_a_snapshot_and_the_chain_equals_the_model(
    tmp_path: Path, background: bool, fault: str, error: str
) -> None:
    from lightrec.distributed.deltas import DeltaReader

    results = run_ranks(_body, 2, args=(str(tmp_path), background, fault), timeout=300)
    for r in results:
        assert r["error"] == error and r["versions"] == [1, 2, 3], r
    reader = DeltaReader(tmp_path / "publish")
    assert [reader.manifest(v).kind for v in (1, 2, 3)] == ["snapshot", "snapshot", "delta"]
    assert [reader.manifest(v).global_step for v in (1, 2, 3)] == [0, 2, 3]
    state = reader.state(3)
    for name, weight in results[0]["tables"].items():
        assert torch.equal(state.rows[name].values, weight), name


def _abort_body(rank: int, world_size: int, tmp: str) -> dict[str, Any]:
    import threading

    from lightrec.distributed.deltas import BackgroundPublisher
    from lightrec.distributed.deltas.sharded_publish import prepare_publish
    from lightrec.distributed.model_tracker import DeltaTrackerConfig
    from tests.distributed.model_tracker.helpers import sharded

    model = sharded(f"{tmp}/ssd", world_size)
    tracker = model.init_torchrec_delta_tracker(DeltaTrackerConfig())
    folder = f"{tmp}/publish"
    publisher = BackgroundPublisher(model)
    thread = next(t for t in threading.enumerate() if t.name == "lightrec-delta-publisher")
    out: dict[str, Any] = {}
    if rank == 0:  # its thread waits for rank 1's rows, which rank 1's publisher never sends
        pending = publisher.publish(folder, tracker)
        while not publisher._jobs.empty():  # the thread has taken the version (not dropped by abort)
            time.sleep(0.01)
        time.sleep(0.5)  # and is inside its first collective, waiting for rank 1
        start = time.monotonic()
        out["ended"] = publisher.abort(timeout=1.0)
        out["abort_seconds"] = time.monotonic() - start
    else:  # the same version's read (its collectives), outside the publisher
        prepare_publish(model, folder, tracker)
    torch.distributed.barrier()  # over the default group: rank 0 has aborted
    if rank == 1:  # its thread, idle, stops and destroys its group: rank 0's gather fails
        out["ended"] = publisher.abort(timeout=30.0)
    thread.join(timeout=60.0)
    out["thread_alive"] = thread.is_alive()
    if rank == 0:
        try:
            pending.result(timeout=0)
        except Exception as exc:  # noqa: BLE001 - what the given-up version became
            out["pending"] = type(exc).__name__
        try:
            publisher.publish(folder, tracker)
        except RuntimeError as exc:
            out["closed"] = str(exc)
    return out


@pytest.mark.slow  # waits out a gloo timeout (~5 s)
def test_abort_waits_for_no_peer_and_the_thread_ends_once_the_collective_fails(tmp_path: Path) -> None:
    r0, r1 = run_ranks(_abort_body, 2, args=(str(tmp_path),), timeout=120)
    assert r0["ended"] is False and r0["abort_seconds"] < 5, r0  # bounded: it did not wait for rank 1
    assert r1["ended"] is True, r1
    assert not r0["thread_alive"] and not r1["thread_alive"], (r0, r1)
    assert r0["pending"] == "CollectiveError" and "closed" in r0["closed"], r0
