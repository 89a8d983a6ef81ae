"""``DeltaFollower``: picks the newest version it can rebuild, refuses corrupt ones (and, by default,
everything built on them until the next snapshot), catches up from a snapshot when it starts late or
falls behind retention, and every follower of a folder converges to the same version and scores."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from lightrec.inference import Predictor, export, load
from lightrec.serving.deltas import DeltaApplyError, DeltaFollower, DeltaRefused, open_updater
from tests.inference.helpers import dlrm
from tests.serving.deltas.models import Trainer, corrupt, probe_scores


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An fp32 TorchScript export of ``dlrm()`` (it scores exactly as the eager model does)."""
    return export(dlrm(), tmp_path_factory.mktemp("artifact") / "m.pt")


def test_a_late_worker_catches_up_and_every_worker_converges(tmp_path: Path, artifact: Path) -> None:
    trainer = Trainer(tmp_path / "publish")
    trainer.snapshot()
    for seed in range(2, 6):
        trainer.step(seed, dense=seed == 3)
    early, late = DeltaFollower(tmp_path / "publish"), DeltaFollower(tmp_path / "publish")
    served = [load(artifact), load(artifact)]
    assert early.sync(served[0], force=True) == 5  # snapshot 1 + deltas 2..5 at once
    trainer.step(6)
    assert early.poll() is None  # not due: poll_interval_s has not passed
    update = early.poll(force=True)
    assert update is not None and update.from_version == 5 and list(update.versions) == [6]
    update.apply(served[0])
    assert late.sync(served[1], force=True) == 6  # starts later: snapshot + every delta
    for predictor in served:
        assert torch.equal(probe_scores(predictor), trainer.scores(6))


def _third_of_fourcorrupt(folder: Path) -> Trainer:
    """Versions 1 (snapshot) to 4 (deltas), version 3's rows corrupt."""
    trainer = Trainer(folder)
    trainer.snapshot()
    for seed in (2, 3, 4):
        trainer.step(seed)
    corrupt(folder, 3)
    return trainer


def test_a_corrupt_version_is_refused_and_the_next_snapshot_applied(tmp_path: Path, artifact: Path) -> None:
    folder = tmp_path / "publish"
    trainer = _third_of_fourcorrupt(folder)
    predictor, follower = load(artifact), DeltaFollower(folder)
    assert follower.sync(predictor, force=True) == 2  # the newest exact version: 3 is bad, 4 builds on it
    assert follower.refused_versions == {3}
    assert torch.equal(probe_scores(predictor), trainer.scores(2))
    assert follower.lag_seconds > 0  # version 4 is waiting
    trainer.step(5)
    assert follower.poll(force=True) is None  # still built on 3
    trainer.snapshot()
    assert follower.sync(predictor, force=True) == 6 and follower.lag_seconds == 0.0
    assert torch.equal(probe_scores(predictor), trainer.scores(6))


def test_a_delta_whose_tables_differ_from_its_snapshots_is_refused_once_and_the_snapshot_served(
    tmp_path: Path, artifact: Path
) -> None:
    """Two writers of other row formats on one folder (a trainer restarted with another format): every file
    verifies, but version 2's tables cannot join version 1's. The follower serves version 1, refuses 2 and
    3 (built on 2) once -- they are not read again at later polls -- and takes the next snapshot."""
    folder = tmp_path / "publish"
    trainer = Trainer(folder)
    trainer.snapshot()
    other = Trainer(folder, row_format="fp16")
    other.model.load_state_dict(trainer.model.state_dict())
    other.step(2)
    other.step(3)
    predictor, follower = load(artifact), DeltaFollower(folder)
    assert follower.sync(predictor, force=True) == 1
    assert follower.refused_versions == {2, 3}
    assert torch.equal(probe_scores(predictor), trainer.scores(1))
    reads: list[int] = []
    read = follower.reader.read
    follower.reader.read = lambda v: reads.append(v) or read(v)  # type: ignore[method-assign]
    assert follower.poll(force=True) is None and reads == []  # refused: not read (nor counted) again
    trainer.reopen()
    trainer.model.load_state_dict(other.model.state_dict())
    assert trainer.snapshot() == 4
    assert follower.sync(predictor, force=True) == 4
    assert torch.equal(probe_scores(predictor), trainer.scores(4))


def test_gaps_skip_applies_the_versions_around_a_refused_one(tmp_path: Path, artifact: Path) -> None:
    folder = tmp_path / "publish"
    trainer = _third_of_fourcorrupt(folder)
    predictor, follower = load(artifact), DeltaFollower(folder, gaps="skip")
    assert follower.sync(predictor, force=True) == 4
    assert follower.refused_versions == {3}
    expected = {k: v.clone() for k, v in trainer.states[4].items()}  # rows only version 3 changed: as in 2
    for name, ids in trainer.ids[3].items():
        key = f"sparse_arch.embedding_bag_collection.embedding_bags.{name}.weight"
        only_3 = ids[~torch.isin(ids, trainer.ids[4][name])]
        expected[key][only_3] = trainer.states[2][key][only_3]
    assert torch.equal(probe_scores(predictor), trainer.scores(4, expected))
    assert not torch.equal(probe_scores(predictor), trainer.scores(4))


def test_a_worker_behind_retention_catches_up_from_the_newest_snapshot(tmp_path: Path, artifact: Path) -> None:
    folder = tmp_path / "publish"
    trainer = Trainer(folder, retention=1)
    trainer.snapshot()
    predictor, follower = load(artifact), DeltaFollower(folder)
    assert follower.sync(predictor, force=True) == 1
    trainer.step(2)
    trainer.snapshot()  # v3; retention removes v1, v2
    trainer.step(4)
    update = follower.poll(force=True)
    assert update is not None and update.from_version is None and list(update.versions) == [3, 4]
    assert update.apply(predictor) == 4
    assert torch.equal(probe_scores(predictor), trainer.scores(4))


def test_a_stale_update_is_refused_without_blaming_its_versions(tmp_path: Path, artifact: Path) -> None:
    folder = tmp_path / "publish"
    trainer = Trainer(folder)
    trainer.snapshot()
    predictor, follower = load(artifact), DeltaFollower(folder, start_version=1)
    trainer.step(2)
    first = follower.poll(force=True)
    trainer.step(3)
    second = follower.poll(force=True)
    assert first is not None and second is not None and second.from_version == 1
    second.apply(predictor)
    with pytest.raises(DeltaApplyError, match="update to version 2 was planned on version 1, but version 3 is served"):
        first.apply(predictor)
    assert follower.version == 3 and follower.refused_versions == frozenset()
    assert torch.equal(probe_scores(predictor), trainer.scores(3))


def test_follower_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gaps must be one of"):
        DeltaFollower(tmp_path, gaps="ignore")
    with pytest.raises(ValueError, match="poll_interval_s must be a number >= 0"):
        DeltaFollower(tmp_path, poll_interval_s=-1)
    follower = DeltaFollower(tmp_path / "nothing-yet")
    assert follower.poll() is None and follower.version is None and follower.lag_seconds == 0.0


class _Served:
    """The server's ``ServedModel`` as the updater sees it: a predictor, its version, a lock."""

    def __init__(self, predictor: Predictor) -> None:
        self.predictor, self.version, self.published_at = predictor, 0, 0.0
        self._lock = threading.Lock()

    def apply(self, update) -> None:  # noqa: ANN001 - a DeltaModelUpdate
        with self._lock:
            update.apply(self)
            self.version, self.published_at = update.version, update.published_at


def test_open_updater_is_the_servers_seam(tmp_path: Path, artifact: Path) -> None:
    folder = tmp_path / "publish"
    trainer = _third_of_fourcorrupt(folder)
    served = _Served(load(artifact))
    updater = open_updater(folder, served)
    with pytest.raises(DeltaRefused, match=r"refused version\(s\) \[3\] .* still serving version 0") as refused:
        updater.poll()  # 3 is refused (the server counts it) ...
    assert refused.value.versions == (3,)
    update = updater.poll()  # ... and the update to 2, read, verified and prepared by that poll, comes next
    assert update is not None and update.version == 2 and update.published_at > 0
    served.apply(update)
    assert served.version == 2 and torch.equal(probe_scores(served.predictor), trainer.scores(2))
    assert updater.poll() is None  # 4 builds on the refused 3: nothing to apply, nothing new refused
    trainer.snapshot()
    corrupt(folder, 5)
    with pytest.raises(DeltaRefused, match=r"refused version\(s\) \[5\] .* still serving version 2"):
        updater.poll()
    trainer.step(6)  # a delta on the refused snapshot: still nothing; a good snapshot then catches up
    assert updater.poll() is None
    trainer.snapshot()
    update = updater.poll()
    assert update is not None and update.version == 7
    served.apply(update)
    assert torch.equal(probe_scores(served.predictor), trainer.scores(7))


def test_a_manifest_python_cannot_parse_is_refused_and_a_later_snapshot_applied(tmp_path: Path, artifact: Path) -> None:
    """Valid JSON with a 400-digit number (``float()`` overflows) used to escape the reader as OverflowError:
    every poll stopped at that version, later snapshots included, and the worker served the bare artifact."""
    import json

    folder = tmp_path / "publish"
    trainer = Trainer(folder)
    trainer.snapshot()
    bad = trainer.step(2)
    manifest = folder / f"v{bad:09d}" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "wall_time": 10**400}))
    trainer.snapshot()
    trainer.step(4)
    predictor, follower = load(artifact), DeltaFollower(folder)
    assert follower.sync(predictor, force=True) == 4 and follower.refused_versions == {bad}
    assert torch.equal(probe_scores(predictor), trainer.scores(4))
