"""A publish folder removed and published again from scratch (a trainer restarted into an emptied
folder numbers its versions from 1 again): a worker must not apply the new history's deltas on top
of the old history's rows, nor keep serving the old history while the new one is behind it in
numbers. A folder that only disappears for a while (an unmounted share) keeps the served version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from lightrec.inference import export, load
from lightrec.serving.deltas import DeltaFollower
from tests.inference.helpers import dlrm
from tests.serving.deltas.models import Trainer, corrupt, probe_scores


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(dlrm(), tmp_path_factory.mktemp("artifact") / "m.pt")


def _old_history(folder: Path) -> Trainer:
    trainer = Trainer(folder)
    trainer.snapshot()
    for seed in (2, 3):
        trainer.step(seed)
    return trainer


def test_a_folder_that_disappears_and_reappears_unchanged_keeps_the_served_version(tmp_path: Path,
                                                                                   artifact: Path) -> None:
    folder = tmp_path / "publish"
    trainer = _old_history(folder)
    predictor, follower = load(artifact), DeltaFollower(folder)
    assert follower.sync(predictor, force=True) == 3
    moved = shutil.move(folder, tmp_path / "elsewhere")
    assert follower.sync(predictor, force=True) == 3 and follower.refused_versions == frozenset()
    shutil.move(moved, folder)
    trainer.step(4)
    update = follower.poll(force=True)
    assert update is not None and update.from_version == 3 and list(update.versions) == [4]  # only the delta
    update.apply(predictor)
    assert torch.equal(probe_scores(predictor), trainer.scores(4))


def test_a_new_history_past_the_served_version_is_rebuilt_from_its_snapshot(tmp_path: Path, artifact: Path) -> None:
    """Used to apply the new history's delta 4 alone on the old history's version 3: the worker said
    version 4 but scored neither history's version 4 (a worker started then scored the real one)."""
    folder = tmp_path / "publish"
    _old_history(folder)
    predictor, follower = load(artifact), DeltaFollower(folder)
    assert follower.sync(predictor, force=True) == 3
    shutil.rmtree(folder)
    assert follower.sync(predictor, force=True) == 3  # gone: nothing to follow, the served version stays
    new = Trainer(folder)
    new.snapshot()
    for seed in (12, 13, 14):
        new.step(seed)
    assert follower.sync(predictor, force=True) == 4
    fresh = load(artifact)
    assert DeltaFollower(folder).sync(fresh, force=True) == 4
    assert torch.equal(probe_scores(fresh), new.scores(4))
    assert torch.equal(probe_scores(predictor), new.scores(4))


def test_a_new_history_behind_the_served_version_replaces_it(tmp_path: Path, artifact: Path) -> None:
    """Used to keep serving the old history's version 3 until the new one passed version 3."""
    folder = tmp_path / "publish"
    _old_history(folder)
    predictor, follower = load(artifact), DeltaFollower(folder)
    assert follower.sync(predictor, force=True) == 3
    shutil.rmtree(folder)
    new = Trainer(folder)
    new.snapshot()
    new.step(12)
    assert follower.sync(predictor, force=True) == 2
    assert torch.equal(probe_scores(predictor), new.scores(2))
    assert follower.poll(force=True) is None  # now following the new history: nothing newer
    new.step(13)
    update = follower.poll(force=True)
    assert update is not None and update.from_version == 2 and list(update.versions) == [3]
    update.apply(predictor)
    assert torch.equal(probe_scores(predictor), new.scores(3))


def test_a_version_refused_in_the_old_history_is_read_again_in_the_new_one(tmp_path: Path, artifact: Path) -> None:
    """Refusals are kept by version number: the new history's version 2 used to be ignored forever."""
    folder = tmp_path / "publish"
    old = _old_history(folder)
    corrupt(folder, 3)
    predictor, follower = load(artifact), DeltaFollower(folder)
    assert follower.sync(predictor, force=True) == 2 and follower.refused_versions == {3}
    assert torch.equal(probe_scores(predictor), old.scores(2))
    shutil.rmtree(folder)
    new = Trainer(folder)
    new.snapshot()
    new.step(12)
    new.step(13)
    assert follower.sync(predictor, force=True) == 3 and follower.refused_versions == frozenset()
    assert torch.equal(probe_scores(predictor), new.scores(3))
