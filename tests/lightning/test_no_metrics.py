"""``RecModule(metrics=())`` and ``RecModule(metrics=None)`` alike: no click metrics, the losses logged.

Both raised in ``__init__`` (``()`` a ValueError of ``rec_metrics``, None a TypeError); they now train,
validate and test, logging no metric and no ``hp_metric``.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
from torchmetrics import MetricCollection

from tests.lightning.toy import ToyDLRM, toy_data


@pytest.mark.parametrize("metrics", [(), None, []], ids=["empty tuple", "None", "empty list"])
def test_no_metrics_trains_validates_and_tests_logging_the_losses(tmp_path: Path, metrics: object) -> None:
    module = ToyDLRM(metrics=metrics, train_metrics=True)
    assert module.train_metrics is None
    for collection in (module.val_metrics, module.test_metrics):
        assert isinstance(collection, MetricCollection) and len(collection) == 0
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=pl.loggers.CSVLogger(tmp_path), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
    )  # fmt: skip
    trainer.fit(module, datamodule=toy_data())
    logged = set(trainer.callback_metrics)
    assert {"train/loss", "val/loss"} <= logged, logged
    assert not {k for k in logged if k.split("/")[-1] in ("auc", "ne", "calibration", "ctr", "accuracy")}, logged
    assert "hp_metric" not in logged
    (results,) = trainer.test(module, datamodule=toy_data())
    assert set(results) == {"test/loss"}, results
    trainer.validate(module, datamodule=toy_data())


def test_metrics_still_name_the_click_metrics() -> None:
    module = ToyDLRM(metrics=("auc",), train_metrics=True)
    assert list(module.val_metrics) == ["val/auc"] and list(module.test_metrics) == ["test/auc"]
    assert module.train_metrics is not None and list(module.train_metrics) == ["train/auc"]
    assert list(ToyDLRM(metrics="ne").val_metrics) == ["val/ne"]
    with pytest.raises(ValueError, match="repeats"):
        ToyDLRM(metrics=("auc", "auc"))
