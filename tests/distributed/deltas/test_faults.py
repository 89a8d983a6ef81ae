"""Crashes and full disks while publishing: only complete versions are ever visible.

* A writer SIGKILLed at every one of its file-system calls (a fork per kill point, ~60 of them;
  every fourth in the default run):
  every version left in the folder verifies and holds exactly what was written, LATEST names one of
  them, the newest rebuilds from its chain, and the next writer cleans up and carries on.
* ``slow``: real writer processes killed from outside at random instants, many times over.
* ENOSPC on a real 4 MiB tmpfs (``small_fs``, from the checkpoint tests; root only, else skipped): the write raises ``DeltaWriteError``
  naming the folder and the free space, nothing of it stays on disk, the previous version is still
  the newest -- for a disk that fills at every point of a write.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lightrec.distributed.deltas import DeltaReader, DeltaState, DeltaWriteError, DeltaWriter
from tests.distributed.deltas import kill_writer
from tests.distributed.deltas.helpers import SPECS, dense, full_rows, some_rows

ROOT = Path(__file__).resolve().parents[3]


def _same(a: DeltaState, b: DeltaState) -> bool:
    tables = a.rows.keys() == b.rows.keys() and all(
        torch.equal(a.rows[t].ids, b.rows[t].ids) and torch.equal(a.rows[t].values, b.rows[t].values)
        and (a.rows[t].raw_ids is None or torch.equal(a.rows[t].raw_ids, b.rows[t].raw_ids))
        for t in a.rows
    )  # fmt: skip
    return tables and a.dense.keys() == b.dense.keys() and all(torch.equal(a.dense[k], b.dense[k]) for k in a.dense)


def _check_folder(folder: Path, reference: DeltaReader) -> list[int]:
    """Every visible version verifies and equals the reference's; LATEST names one; the newest rebuilds."""
    reader = DeltaReader(folder)
    versions = reader.versions()
    assert versions, f"{folder}: no version left"
    for v in versions:
        reader.read(v)
    latest = reader.latest()
    assert latest is not None and _same(reader.state(latest), reference.state(latest)), folder
    hint = reader.latest_hint()
    assert hint in versions, f"{folder}: LATEST says {hint}, the versions are {versions}"
    return versions


def _has_o_direct(folder: Path) -> bool:
    from lightrec.distributed.deltas.synced_write import _open_direct

    fd = _open_direct(folder / "probe")
    if fd is not None:
        os.close(fd)
        (folder / "probe").unlink()
    return fd is not None


def _run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tests.distributed.deltas.kill_writer", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, **kwargs)  # type: ignore[call-overload]


@pytest.mark.parametrize("stride", [pytest.param(1, marks=pytest.mark.slow), 4])
@pytest.mark.parametrize("direct", [False, True], ids=["page-cache", "o-direct"])
def test_a_writer_killed_at_any_call_leaves_complete_versions_only(tmp_path: Path, stride: int, direct: bool) -> None:
    """stride 1: at every call (~60 kill points, slow); 4: every fourth (the default run).
    ``direct``: every file written as large versions are (``O_DIRECT`` blocks, then a truncation)."""
    if direct and not _has_o_direct(tmp_path):
        pytest.skip(f"{tmp_path}'s file system has no O_DIRECT")
    done = _run(["points", str(tmp_path), str(stride)] + (["direct"] if direct else []))
    assert done.returncode == 0, done.stderr
    results = {int(k): v for k, v in json.loads(done.stdout.splitlines()[-1]).items()}
    last = max(results)
    assert results[last] == 0 and all(v == "killed" for k, v in results.items() if k < last), results
    assert last > 40, f"only {last} kill points: the writer makes fewer calls than expected"
    reference_dir = tmp_path / "reference"
    shutil.copytree(tmp_path / "template", reference_dir)
    kill_writer.more_writes(reference_dir, retention=None)  # keeps every version to compare with
    reference = DeltaReader(reference_dir)
    seen = set()
    for k in results:
        folder = tmp_path / f"k{k:04d}"
        versions = _check_folder(folder, reference)
        seen.add(tuple(versions))
        writer = DeltaWriter(folder, SPECS, retention=1)  # the next writer: removes what the kill left
        assert not [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")]
        assert writer.write_delta(some_rows(20)) == versions[-1] + 1
        DeltaReader(folder).state()
    assert len(seen) >= 5, seen  # the kills landed in every phase: before/after each commit and retention


@pytest.mark.slow
def test_writers_killed_from_outside_at_random_instants(tmp_path: Path) -> None:
    rng = random.Random(0)
    folder = tmp_path / "deltas"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(15):
        proc = subprocess.Popen([sys.executable, "-m", "tests.distributed.deltas.kill_writer", "loop", str(folder)],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.0, 1.5))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        reader = DeltaReader(folder)
        for v in reader.versions():
            reader.read(v)
        if reader.versions():
            reader.state()
            assert reader.latest_hint() in reader.versions()
    assert DeltaReader(folder).latest() is not None


# ------------------------------------------------------------------------------------- disk full
def _fill(fs: Path, leave: int) -> Path:
    filler = fs / "filler"
    filler.unlink(missing_ok=True)
    free = shutil.disk_usage(fs).free
    filler.write_bytes(b"\0" * max(free - leave, 0))
    return filler


BIG = [kill_writer.SPECS[0].__class__("big", 3000, 64)]  # 768 KB of fp32 rows per snapshot


def _big_rows(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    from lightrec.distributed.deltas import TableRows

    return {"big": TableRows(torch.arange(3000), torch.randn(3000, 64, generator=g))}


def test_a_full_disk_keeps_the_previous_version(small_fs: Path) -> None:
    folder = small_fs / "deltas"
    writer = DeltaWriter(folder, BIG, retention=None)
    writer.write_snapshot(_big_rows(0), {})
    _fill(small_fs, 100_000)
    with pytest.raises(DeltaWriteError, match=rf"not enough disk space to write {folder}/v000000002 \(No space left "
                       r"on device; \d+ bytes free\); the newest version is still v000000001") as info:  # fmt: skip
        writer.write_snapshot(_big_rows(1), {})
    assert info.value.errno == errno.ENOSPC
    assert sorted(p.name for p in folder.iterdir()) == ["LATEST", "v000000001"]  # nothing of v2 is left
    assert DeltaReader(folder).latest() == 1 and DeltaReader(folder).latest_hint() == 1
    (small_fs / "filler").unlink()
    assert writer.write_snapshot(_big_rows(1), {}) == 2  # space again: the next write works


def test_a_disk_that_fills_at_any_point_of_a_write(small_fs: Path) -> None:
    """Free space from none to more than a version needs, in small steps: the disk runs out before,
    during and after each file, the manifest and LATEST. Each write either succeeds or raises
    ``DeltaWriteError``; the folder always holds complete versions only."""
    folder = small_fs / "deltas"
    writer = DeltaWriter(folder, SPECS, retention=2)
    writer.write_snapshot(full_rows(0), dense(0))
    outcomes = set()
    for i, leave in enumerate(range(0, 24_576, 1_024)):
        _fill(small_fs, leave)
        before = DeltaReader(folder).latest()
        try:
            version = writer.write_delta(some_rows(i), dense(i)) if i % 3 else writer.write_snapshot(full_rows(i), dense(i))
            outcomes.add("written")
            assert version == (before or 0) + 1
        except DeltaWriteError as exc:
            outcomes.add("refused")
            assert exc.errno == errno.ENOSPC and DeltaReader(folder).latest() == before
        assert not [p for p in folder.iterdir() if p.name.startswith(".tmp-")]
        reader = DeltaReader(folder)
        for v in reader.versions():
            reader.read(v)
        reader.state()
    assert outcomes == {"written", "refused"}


def test_retention_never_removes_the_version_latest_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write whose LATEST update fails (the disk full for that small file alone) leaves LATEST naming an older
    version: retention waits for the next write that updates LATEST (it used to remove that version at once)."""
    from lightrec.distributed.deltas import TableRows
    from lightrec.distributed.deltas import writer as writer_module

    real, full = writer_module.write_synced, [False]

    def latest_fails(path: Path, parts: list[memoryview]) -> object:
        if full[0] and "LATEST" in Path(path).name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, parts)

    monkeypatch.setattr(writer_module, "write_synced", latest_fails)
    writer = DeltaWriter(tmp_path, SPECS[:1], retention=1)
    name, rows = SPECS[0].name, SPECS[0].num_embeddings
    snapshot = {name: TableRows(torch.arange(rows), torch.zeros(rows, SPECS[0].dim))}
    writer.write_snapshot(snapshot, {})
    writer.write_delta({name: TableRows(torch.tensor([1]), torch.ones(1, SPECS[0].dim))})
    full[0] = True
    assert writer.write_snapshot(snapshot, {}) == 3
    reader = DeltaReader(tmp_path)
    assert reader.latest_hint() == 2 and reader.versions() == [1, 2, 3]  # v1, v2 kept: LATEST still names v2
    full[0] = False
    writer.write_delta({name: TableRows(torch.tensor([2]), torch.ones(1, SPECS[0].dim))})
    assert reader.latest_hint() == 4 and reader.versions() == [3, 4]  # retention caught up
