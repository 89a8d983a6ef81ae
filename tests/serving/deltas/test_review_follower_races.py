"""Review of the follower side of live deltas under races and odd folders.

A version folder that is copied in (rsync, ``cp -r``: the folder appears under its final name and its
files one after the other) is refused while incomplete and read again once its files have changed and
settled; odd names that only look like versions are not versions; a file that is no regular file is
refused without being waited on; retention racing a poll is not taken for a folder published anew.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch

from lightrec.distributed.deltas import DeltaReader, DeltaVerificationError, Version, parse_version_name
from lightrec.distributed.deltas.manifest import MANIFEST_FILE, ROWS_FILE
from lightrec.inference import export, load
from lightrec.serving.deltas import DeltaFollower, DeltaRefused, open_updater
from tests.distributed.deltas.helpers import snapshot_and_delta
from tests.inference.helpers import dlrm
from tests.serving.deltas.models import Trainer, corrupt, probe_scores


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An fp32 TorchScript export of ``dlrm()`` (it scores exactly as the eager model does)."""
    return export(dlrm(), tmp_path_factory.mktemp("artifact") / "m.pt")


def _copy_partly(src: Path, dst: Path, how: str) -> None:
    """Copy version folder ``src`` to ``dst`` as a copy still running would have it (``how``)."""
    dst.mkdir()
    if how == "no manifest":  # the data files first, the manifest not yet
        shutil.copy2(src / ROWS_FILE, dst / ROWS_FILE)
    elif how == "half a manifest":
        shutil.copy2(src / ROWS_FILE, dst / ROWS_FILE)
        text = (src / MANIFEST_FILE).read_bytes()
        (dst / MANIFEST_FILE).write_bytes(text[: len(text) // 2])
    elif how == "no rows":  # sorted order: manifest.json before rows.safetensors
        shutil.copy2(src / MANIFEST_FILE, dst / MANIFEST_FILE)
    else:  # "half the rows"
        shutil.copy2(src / MANIFEST_FILE, dst / MANIFEST_FILE)
        data = (src / ROWS_FILE).read_bytes()
        (dst / ROWS_FILE).write_bytes(data[: len(data) // 2])


def _copying(tmp_path: Path, deltas: int, how: str) -> tuple[Trainer, Path]:
    """Snapshot 1 and ``deltas`` deltas published into ``tmp_path / "src"``; the publish folder
    returned holds version 1 and version 2 copied in part (``how``)."""
    trainer = Trainer(tmp_path / "src")
    trainer.snapshot()
    for seed in range(2, 2 + deltas):
        trainer.step(seed)
    folder = tmp_path / "publish"
    folder.mkdir()
    shutil.copytree(tmp_path / "src" / "v000000001", folder / "v000000001")
    _copy_partly(tmp_path / "src" / "v000000002", folder / "v000000002", how)
    return trainer, folder


@pytest.mark.parametrize("how", ["no manifest", "half a manifest", "no rows", "half the rows"])
def test_a_version_copied_in_is_refused_while_incomplete_and_applied_once_complete(
    tmp_path: Path, artifact: Path, how: str
) -> None:
    trainer, folder = _copying(tmp_path, 2, how)
    predictor, follower = load(artifact), DeltaFollower(folder)
    assert follower.sync(predictor, force=True) == 1 and follower.refused_versions == {2}
    assert follower.sync(predictor, force=True) == 1  # unchanged: not read again
    shutil.rmtree(folder / "v000000002")  # the copy finishes (and the next version arrives)
    shutil.copytree(tmp_path / "src" / "v000000002", folder / "v000000002")
    shutil.copytree(tmp_path / "src" / "v000000003", folder / "v000000003")
    # Read again once the files have stayed unchanged for a poll (no busy loop on a copy still running).
    assert follower.sync(predictor, force=True) == 1
    assert follower.sync(predictor, force=True) == 3
    assert follower.refused_versions == set()
    assert torch.equal(probe_scores(predictor), trainer.scores(3))


def test_a_version_still_being_copied_is_not_read_at_every_poll(tmp_path: Path, artifact: Path) -> None:
    """The server polls again at once after a refusal: while the copy runs, the changed version waits
    for its files to settle instead of being read, refused and counted at every poll."""
    trainer, folder = _copying(tmp_path, 1, "no rows")
    predictor, follower = load(artifact), DeltaFollower(folder)
    assert follower.sync(predictor, force=True) == 1 and follower.refused_versions == {2}
    rows = folder / "v000000002" / ROWS_FILE
    data = (tmp_path / "src" / "v000000002" / ROWS_FILE).read_bytes()
    reads: list[int] = []
    read = follower.reader.read
    follower.reader.read = lambda v: reads.append(v) or read(v)  # type: ignore[method-assign]
    for end in (len(data) // 3, 2 * len(data) // 3):  # the copy grows the file between two polls
        rows.write_bytes(data[:end])
        assert follower.poll(force=True) is None
    assert reads == []
    rows.write_bytes(data)
    assert follower.poll(force=True) is None  # changed since the last poll: settling
    assert follower.sync(predictor, force=True) == 2 and reads == [2]
    assert torch.equal(probe_scores(predictor), trainer.scores(2))


def test_the_updater_reports_an_incomplete_version_once_then_applies_it(
    tmp_path: Path, artifact: Path
) -> None:
    trainer, folder = _copying(tmp_path, 1, "no manifest")

    class Served:
        def __init__(self) -> None:
            self.predictor, self.version = load(artifact), 0

    served = Served()
    updater = open_updater(folder, served)
    with pytest.raises(DeltaRefused) as refused:
        updater.poll()
    assert refused.value.versions == (2,)
    update = updater.poll()  # the snapshot found besides
    assert update is not None and update.version == 1
    update.apply(served)
    served.version = 1
    assert updater.poll() is None
    shutil.copy2(tmp_path / "src" / "v000000002" / MANIFEST_FILE, folder / "v000000002" / MANIFEST_FILE)
    assert updater.poll() is None  # settling
    update = updater.poll()
    assert update is not None and update.version == 2
    update.apply(served)
    assert torch.equal(probe_scores(served.predictor), trainer.scores(2))


def test_a_corrupt_version_left_as_it_is_stays_refused(tmp_path: Path, artifact: Path) -> None:
    folder = tmp_path / "publish"
    trainer = Trainer(folder)
    trainer.snapshot()
    trainer.step(2)
    corrupt(folder, 2)
    predictor, follower = load(artifact), DeltaFollower(folder)
    for _ in range(3):
        assert follower.sync(predictor, force=True) == 1 and follower.refused_versions == {2}


@pytest.mark.parametrize(
    "name", ["v000000007\n", "v" + "\u0660" * 8 + "\u0667", "v" + "\uff10" * 8 + "\uff17"]
)
def test_a_name_that_only_looks_like_a_version_is_not_one(tmp_path: Path, name: str) -> None:
    """A trailing newline or non-ASCII digits: ``int`` reads them as 7, but the folder of version 7 is
    ``v000000007``. Listed, they made ``latest()`` a version that is not there and ``state()`` fail."""
    folder = snapshot_and_delta(tmp_path / "publish")
    (folder / name).mkdir()
    assert parse_version_name(name) is None
    reader = DeltaReader(folder)
    assert reader.versions() == [1, 2] and reader.latest() == 2
    assert reader.state().version == 2


def test_a_file_that_is_no_regular_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO under a version file's name: opening it to read would wait for a writer forever (and a
    device like ``/dev/zero`` be read forever); the reader refuses it at once."""
    folder = snapshot_and_delta(tmp_path / "publish")
    rows = folder / "v000000002" / ROWS_FILE
    rows.unlink()
    os.mkfifo(rows)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            DeltaReader(folder).read(2)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 -- handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(5.0)
    if thread.is_alive():  # release the reader (a writer opens the FIFO and closes it: end of file)
        os.close(os.open(rows, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5.0)
        pytest.fail("reading a version whose rows file is a FIFO blocked")
    assert isinstance(outcome[0], DeltaVerificationError) and "regular file" in str(outcome[0])


def test_retention_racing_a_poll_is_not_taken_for_a_folder_published_anew(
    tmp_path: Path, artifact: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The poll lists 1..4 (serving 2, 3 refused); the writer then publishes snapshot 5 and retention
    removes 1..4 before the poll reads the served version's manifest. Version 2 went with every version
    before it: retention, not a new history (no warning, refusals kept), and the next poll serves 5."""
    folder = tmp_path / "publish"
    trainer = Trainer(folder, retention=1)
    trainer.snapshot()
    trainer.step(2)
    predictor, follower = load(artifact), DeltaFollower(folder)
    assert follower.sync(predictor, force=True) == 2
    trainer.step(3)
    corrupt(folder, 3)
    assert follower.sync(predictor, force=True) == 2 and follower.refused_versions == {3}
    versions = follower.reader.versions

    def listing_then_retention() -> list[int]:
        listed = versions()
        if 5 not in trainer.states:
            trainer.reopen()  # the corrupt 3 is the newest: a snapshot follows
            trainer.snapshot()  # 4... and retention removes the versions before it
            trainer.step(5)
        return listed

    follower.reader.versions = listing_then_retention  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="lightrec.serving.deltas.follower"):
        follower.sync(predictor, force=True)
    assert "published anew" not in caplog.text
    assert follower.sync(predictor, force=True) == 5
    assert torch.equal(probe_scores(predictor), trainer.scores(5))


def test_retention_removing_the_chain_while_a_late_worker_reads_it_refuses_nothing(
    tmp_path: Path, artifact: Path
) -> None:
    """A worker starting late reads snapshot 1 and deltas 2, 3; retention removes them as it reads
    delta 2. It serves what it read in full (snapshot 1: an exact version), refuses nothing, and
    takes the new snapshot at the next poll."""
    folder = tmp_path / "publish"
    trainer = Trainer(folder, retention=1)
    trainer.snapshot()
    trainer.step(2)
    trainer.step(3)
    predictor, follower = load(artifact), DeltaFollower(folder)
    read = follower.reader.read

    def read_racing_retention(version: int) -> Version:
        if version == 2 and 4 not in trainer.states:
            trainer.snapshot()  # 4; retention removes 1..3
        return read(version)

    follower.reader.read = read_racing_retention  # type: ignore[method-assign]
    assert follower.sync(predictor, force=True) == 1 and follower.refused_versions == set()
    assert torch.equal(probe_scores(predictor), trainer.scores(1))
    assert follower.sync(predictor, force=True) == 4 and follower.refused_versions == set()
    assert torch.equal(probe_scores(predictor), trainer.scores(4))
