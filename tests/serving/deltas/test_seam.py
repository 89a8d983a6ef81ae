"""The delta updater behind the server's seam, in one process: the server's own ``ServedModel``,
``UpdateFollower`` and metrics around ``open_updater`` over a publish folder. A version that fails
its checks, or fails to apply and is put back, is a refusal -- the version stays, the refusal is
counted per version, the next good version is applied; only an apply that cannot put back what it
wrote marks the worker damaged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightrec.inference import export, load
from lightrec.serving import ServedModel, UpdateFailed, UpdateFollower
from lightrec.serving.deltas import apply as apply_module
from lightrec.serving.deltas import open_updater
from lightrec.serving.metrics import ServingMetrics, WorkerState
from tests.inference.helpers import dlrm
from tests.serving.deltas.models import Trainer, corrupt, probe_scores


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(dlrm(), tmp_path_factory.mktemp("artifact") / "m.pt")


def _serve(folder: Path, artifact: Path) -> tuple[ServedModel, UpdateFollower, ServingMetrics]:
    model = ServedModel(load(artifact))
    metrics = ServingMetrics(api_servers=1, workers=1)
    return model, UpdateFollower(model, open_updater(folder, model), 1.0, metrics.worker(0)), metrics


def _counts(metrics: ServingMetrics) -> dict[str, float]:
    out = {}
    for line in metrics.render(0, 1).splitlines():
        if line.startswith("lightrec_serving_updates_total"):
            out[line.split('outcome="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_corrupt_version_beside_a_good_one_is_counted_and_the_good_one_applied_at_once(
        tmp_path: Path, artifact: Path) -> None:
    folder = tmp_path / "publish"
    trainer = Trainer(folder)
    trainer.snapshot()
    model, follower, metrics = _serve(folder, artifact)
    assert follower.catch_up() == 1 and model.version == 1
    trainer.step(2)
    trainer.step(3)
    corrupt(folder, 3)
    assert follower.catch_up() == 1  # one catch-up: 3 refused (counted), 2 applied
    assert model.version == 2 and torch.equal(probe_scores(model.predictor), trainer.scores(2))
    assert _counts(metrics) == {"applied": 2, "refused": 1}
    assert follower.catch_up() == 0 and _counts(metrics)["refused"] == 1  # a refused version is not read again


def test_a_failed_apply_that_puts_back_what_it_wrote_is_a_refusal(tmp_path: Path, artifact: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "publish"
    trainer = Trainer(folder)
    trainer.snapshot()
    trainer.step(2)
    model, follower, metrics = _serve(folder, artifact)
    assert follower.catch_up() == 1 and model.version == 2
    trainer.step(3, dense=True)
    state = {k: v.clone() for k, v in model.predictor.module.state_dict().items()}
    original = apply_module._Replace.write

    def dense_copies_fail(self: apply_module._Replace, rows: torch.Tensor | None = None) -> None:
        if rows is None:  # the update's copy fails after the rows were written; putting back works
            raise RuntimeError("device lost")
        original(self, rows)

    monkeypatch.setattr(apply_module._Replace, "write", dense_copies_fail)
    assert follower.catch_up() == 0
    assert model.version == 2 and all(torch.equal(v, state[k]) for k, v in model.predictor.module.state_dict().items())
    assert _counts(metrics) == {"applied": 1, "refused": 1}
    assert metrics.worker_states()[0][0] != WorkerState.DAMAGED
    monkeypatch.undo()
    trainer.snapshot()  # 3 is refused for good; the next snapshot brings the model on
    assert follower.catch_up() == 1 and model.version == 4
    assert torch.equal(probe_scores(model.predictor), trainer.scores(4))


def test_an_apply_that_cannot_put_back_marks_the_worker_damaged(tmp_path: Path, artifact: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "publish"
    trainer = Trainer(folder)
    trainer.snapshot()
    model, follower, metrics = _serve(folder, artifact)
    follower.catch_up()
    trainer.step(2, dense=True)

    def broken(self: apply_module._Replace, rows: torch.Tensor | None = None) -> None:
        raise RuntimeError("device lost")  # the update's copy and the putting back both fail

    monkeypatch.setattr(apply_module._Replace, "write", broken)
    with pytest.raises(UpdateFailed, match="applying version 2 failed part way"):
        follower.catch_up()
    assert model.version == 1 and metrics.worker_states()[0][0] == WorkerState.DAMAGED
