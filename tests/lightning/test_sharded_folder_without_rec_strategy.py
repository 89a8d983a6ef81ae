"""A sharded checkpoint folder (written by RecStrategy) given to a Trainer with another strategy.

``Trainer(strategy="auto").fit/validate/test(ckpt_path=folder)`` raised ``torch.load``'s bare
``IsADirectoryError``; a RecModule now makes it a ``ShardedCheckpointFolderError`` naming the two ways
out (``strategy=RecStrategy(...)``, ``lightrec consolidate``), and otherwise leaves the strategy's
checkpoint reading and writing as they were.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric.plugins import TorchCheckpointIO

from lightrec.distributed.checkpoint import CheckpointError, consolidate_checkpoint
from lightrec.lightning import RecStrategy
from lightrec.lightning.rec_module import ShardedCheckpointFolderError
from tests.lightning.toy import ToyDLRM, toy_data


def _trainer(root: Path, **kwargs: Any) -> pl.Trainer:
    settings: dict[str, Any] = dict(
        accelerator="cpu", devices=1, max_steps=2, num_sanity_val_steps=0, limit_val_batches=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, default_root_dir=root,
    )  # fmt: skip
    settings.update(kwargs)
    return pl.Trainer(**settings)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sharded checkpoint folder written by RecStrategy on one CPU rank."""
    root = tmp_path_factory.mktemp("sharded")
    trainer = _trainer(root, strategy=RecStrategy())
    try:
        trainer.fit(ToyDLRM(device="meta"), datamodule=toy_data())
        trainer.save_checkpoint(root / "last.ckpt")
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert (root / "last.ckpt").is_dir() and (root / "last.ckpt" / "meta.pt").is_file()
    return root / "last.ckpt"


@pytest.mark.parametrize("stage", ["fit", "validate", "test"])
def test_a_folder_under_the_auto_strategy_is_a_typed_error_naming_the_fixes(
    folder: Path, tmp_path: Path, stage: str
) -> None:
    trainer = _trainer(tmp_path, strategy="auto", max_steps=4)
    with pytest.raises(ShardedCheckpointFolderError) as raised:
        getattr(trainer, stage)(ToyDLRM(), datamodule=toy_data(), ckpt_path=str(folder))
    message = str(raised.value)
    assert str(folder) in message and "sharded checkpoint folder written by RecStrategy" in message
    assert "strategy=RecStrategy(" in message and "lightrec consolidate" in message
    assert isinstance(raised.value, CheckpointError)
    # The strategy has its own CheckpointIO back.
    assert type(trainer.strategy.checkpoint_io) is TorchCheckpointIO


def test_the_consolidated_file_tests_under_the_auto_strategy(folder: Path, tmp_path: Path) -> None:
    """The message's second way out works: `lightrec consolidate` then ckpt_path=full.ckpt."""
    full = tmp_path / "full.ckpt"
    consolidate_checkpoint(folder, full)
    results = _trainer(tmp_path, strategy="auto").test(ToyDLRM(), datamodule=toy_data(), ckpt_path=str(full))
    assert results and torch.isfinite(torch.tensor(results[0]["test/loss"]))


def test_single_file_checkpoints_still_save_and_resume(tmp_path: Path) -> None:
    """While a RecModule runs, the strategy's CheckpointIO is wrapped: files are written, removed and read
    through it as before, and it is given back at the end."""
    trainer = _trainer(tmp_path, strategy="auto", enable_checkpointing=True)
    own_io = trainer.strategy.checkpoint_io
    trainer.fit(ToyDLRM(), datamodule=toy_data())
    assert trainer.strategy.checkpoint_io is own_io
    saved = sorted((tmp_path / "checkpoints").glob("*.ckpt")) or sorted(tmp_path.rglob("*.ckpt"))
    assert len(saved) == 1 and saved[0].is_file()
    resumed = _trainer(tmp_path / "again", strategy="auto", max_steps=4)
    resumed.fit(ToyDLRM(), datamodule=toy_data(), ckpt_path=str(saved[0]))
    assert resumed.global_step == 4
    assert resumed.strategy.checkpoint_io is not None and type(resumed.strategy.checkpoint_io) is TorchCheckpointIO


def test_a_missing_file_is_still_lightnings_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        _trainer(tmp_path, strategy="auto").test(ToyDLRM(), datamodule=toy_data(), ckpt_path=str(tmp_path / "no.ckpt"))
