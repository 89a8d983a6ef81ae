"""``DeltaPublisher``'s odd settings give a ``ValueError`` naming the argument at construction, and a
``dirpath`` that is a file fails the fit at train start with a typed error naming ``dirpath``.

A step count given as a string (``every_n_steps="100"``, as a config file may give it) used to raise
a bare ``TypeError`` from a comparison; ``keep=1.5`` passed construction and failed at train start
naming the writer's ``retention``; ``every_n_steps=True`` was taken as a cadence of 1; a ``dirpath``
that is a file raised ``FileExistsError`` from ``mkdir`` (review of the publish path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


@pytest.mark.parametrize(("name", "value"), [("every_n_steps", "100"), ("every_n_steps", 2.5), ("every_n_steps", True),
                                             ("snapshot_every", 1.5), ("dense_every", "3"), ("keep", 1.5),
                                             ("every_seconds", "60"), ("every_seconds", True)])  # fmt: skip
def test_a_setting_of_the_wrong_type_is_refused_by_name(name: str, value: object) -> None:
    from lightrec.lightning import DeltaPublisher

    kwargs = {"every_n_steps": 10, name: value}
    with pytest.raises(ValueError, match=rf"DeltaPublisher\({name}={value!r}\): must be an? (int|number) > 0"):
        DeltaPublisher("x", **kwargs)  # type: ignore[arg-type]


def test_numpy_numbers_are_taken_as_plain_ones() -> None:
    from lightrec.lightning import DeltaPublisher

    publisher = DeltaPublisher("x", every_n_steps=np.int64(5), every_seconds=np.float64(1.5), keep=np.int64(2))
    assert (publisher.every_n_steps, publisher.keep) == (5, 2)
    assert type(publisher.keep) is int  # what DeltaWriter's retention takes


def test_a_dirpath_that_is_a_file_fails_the_fit_naming_dirpath(tmp_path: Path) -> None:
    import lightning.pytorch as pl

    from lightrec.distributed.deltas import DeltaFormatError
    from lightrec.lightning import DeltaPublisher, RecStrategy
    from tests.lightning.toy import ToyDLRM, toy_data

    path = tmp_path / "publish"
    path.write_text("not a folder")
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, strategy=RecStrategy(), max_steps=2, num_sanity_val_steps=0,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[DeltaPublisher(path, every_n_steps=1)], default_root_dir=str(tmp_path),
    )  # fmt: skip
    with pytest.raises(DeltaFormatError, match=r"dirpath .*publish.* is a file, not a folder"):
        trainer.fit(ToyDLRM(dense_optimizer="sgd", dense_lr=0.1), datamodule=toy_data(batch_size=32, num_train_batches=2))
    assert path.read_text() == "not a folder"
