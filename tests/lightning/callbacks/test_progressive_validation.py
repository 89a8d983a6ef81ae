"""``ProgressiveValidation``: every batch is scored by the model as it was before training on it, and
the sliding-window AUC / NE reach TensorBoard at the steps Lightning logs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightrec.data import Batch, SyntheticStream
from lightrec.lightning import ProgressiveValidation
from tests.lightning.toy import ToyDLRM
from tests.metrics.test_window import plain_ne, rank_auc

BATCH, STEPS, WINDOW, EVERY = 64, 6, 100, 2


class _Scores(pl.Callback):
    """The model's probabilities of each batch just before its training step and just after its update."""

    def __init__(self) -> None:
        self.before: list[torch.Tensor] = []
        self.after: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []

    def _score(self, module: Any, batch: Batch) -> torch.Tensor:
        with torch.no_grad():
            return torch.sigmoid(module(batch.dense_features, batch.sparse_features)).reshape(-1)

    def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: Batch, batch_idx: int) -> None:
        self.before.append(self._score(module, batch))
        self.labels.append(batch.labels.clone())

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Batch, batch_idx: int) -> None:
        self.after.append(self._score(module, batch))


def _fit(root: Path, every_n_steps: int | None = None) -> tuple[ProgressiveValidation, _Scores]:
    progressive, scores = ProgressiveValidation(window=WINDOW, every_n_steps=every_n_steps), _Scores()
    data = SyntheticStream(batch_size=BATCH, seed=3, num_embeddings_cap=200, vocabulary="fixed")
    trainer = pl.Trainer(
        max_steps=STEPS, accelerator="cpu", devices=1, log_every_n_steps=EVERY, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, callbacks=[scores, progressive],
        logger=pl.loggers.TensorBoardLogger(str(root), name="pv"),
    )  # fmt: skip
    trainer.fit(ToyDLRM(embedding_lr=0.2, dense_lr=0.2), datamodule=data)
    return progressive, scores


def test_each_batch_is_scored_before_the_model_trains_on_it_and_logged_over_a_window(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    progressive, scores = _fit(tmp_path)
    before, after, labels = torch.cat(scores.before), torch.cat(scores.after), torch.cat(scores.labels)
    window = progressive.metrics["auc"]
    order = (torch.arange(STEPS * BATCH - WINDOW, STEPS * BATCH)) % WINDOW  # ring slots, oldest first
    torch.testing.assert_close(window.window_preds[order], before[-WINDOW:], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(window.window_preds[order], after[-WINDOW:], rtol=1e-3, atol=1e-4)  # it trained

    events = EventAccumulator(str(tmp_path / "pv" / "version_0"), size_guidance={"scalars": 0}).Reload()
    auc = {e.step: e.value for e in events.Scalars("online/auc")}
    ne = {e.step: e.value for e in events.Scalars("online/ne")}
    assert sorted(auc) == sorted(ne) == list(range(EVERY - 1, STEPS, EVERY))  # Lightning's logging steps
    for step in auc:
        seen = (step + 1) * BATCH
        p, y = before[:seen][-WINDOW:], labels[:seen][-WINDOW:]
        assert auc[step] == pytest.approx(rank_auc(p, y), abs=1e-5)
        assert ne[step] == pytest.approx(plain_ne(p, y), rel=1e-4)
    assert progressive.last_metrics["online/auc"] == pytest.approx(auc[STEPS - 1])


@pytest.mark.parametrize(("every", "steps"), [(3, [2, 5]), (4, [3, 5])])  # Lightning writes at 1, 3, 5
def test_its_own_cadence_and_the_last_step_reach_tensorboard(tmp_path: Path, every: int, steps: list[int]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    progressive, scores = _fit(tmp_path, every_n_steps=every)  # and the fit's last step (5)
    before, labels = torch.cat(scores.before), torch.cat(scores.labels)
    events = EventAccumulator(str(tmp_path / "pv" / "version_0"), size_guidance={"scalars": 0}).Reload()
    auc = {e.step: e.value for e in events.Scalars("online/auc")}
    assert sorted(auc) == steps
    for step in steps:
        seen = (step + 1) * BATCH
        assert auc[step] == pytest.approx(rank_auc(before[:seen][-WINDOW:], labels[:seen][-WINDOW:]), abs=1e-5)


def test_bad_settings_and_a_step_without_logits_are_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        ProgressiveValidation(window=0)
    with pytest.raises(ValueError, match="every_n_steps"):
        ProgressiveValidation(every_n_steps=0)
    with pytest.raises(ValueError, match="metrics"):
        ProgressiveValidation(metrics="auc")
    progressive = ProgressiveValidation()
    with pytest.raises(TypeError, match="return \\{'loss': loss, 'logits'"):
        progressive.on_train_batch_end(None, None, {"loss": torch.tensor(1.0)}, None, 0)  # type: ignore[arg-type]
