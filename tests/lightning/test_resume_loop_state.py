"""Resuming from the checkpoints the recipes write: ``last.ckpt`` at the end of training (issue 23).

``ModelCheckpoint(save_last=True, save_top_k=0)`` -- the shipped configs' -- writes ``last.ckpt`` in
``on_train_end``, after Lightning has counted the last epoch as completed. Two such checkpoints
resumed into the wrong batches (``lightrec.lightning.loop_state``):

* run A stopped by ``max_epochs=1``: a step-based resume (``max_steps``) trained nothing ("Epoch 1:
  0/4", then "max_epochs reached");
* run B stopped by ``max_steps=3`` inside epoch 0: a resume started epoch 1 at batch 3, on the data
  of epoch 1's beginning, and never trained the rest of epoch 0.

Every resume below must continue exactly where the run stopped: per-step losses equal to an
uninterrupted run's, bit for bit (2 gloo ranks, same plan). Run for a ``RecModule`` and for a plain
``LightningModule`` whose data comes from a ``RankDataLoader``, both under ``RecStrategy``. All fits of
one kind run one after the other in the same two rank processes (one spawn).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.multiprocess import free_port, run_ranks, set_torchrun_env

STEPS_PER_EPOCH, GLOBAL_BATCH = 4, 64
FUSED = {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1}
#: (name, checkpoint to resume from or None, max_steps, max_epochs)
RUNS = [
    ("uninterrupted", None, -1, 2),
    ("A", None, -1, 1),  # stops at the end of epoch 0: last.ckpt at step 4
    ("B", None, 3, 1),  # stops inside epoch 0: last.ckpt at step 3
    ("A + max_steps", "A", 7, 2),
    ("A, epochs only", "A", -1, 2),
    ("B + max_steps", "B", 7, 2),
    ("B, epochs only", "B", -1, 2),
]


def _plain_module() -> Any:
    """A LightningModule that is not a RecModule: an EBC, a linear head, its own optimizer."""
    import lightning.pytorch as pl
    import torch

    from lightrec import EmbeddingBagCollection
    from tests.lightning.toy import toy_data

    class Plain(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(7)
            self.ebc = EmbeddingBagCollection(toy_data().table_configs(4), device=torch.device("meta"))
            self.head = torch.nn.Linear(26 * 4 + 13, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            pooled = self.ebc(batch.sparse_features).values()
            logits = self.head(torch.cat([pooled, batch.dense_features], dim=1)).reshape(-1)
            return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adagrad(self.head.parameters(), lr=0.05)

    return Plain()


def _fits(rank: int, world_size: int, root: str, kind: str, port: int) -> dict[str, Any]:
    # Without torchrun's environment Lightning would launch a rank-1 copy of the pytest command
    # line from rank 0 (left behind, asleep, when the test ends).
    set_torchrun_env(rank, world_size, port)
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightrec.lightning import RecStrategy
    from tests.lightning.toy import ToyDLRM, toy_data

    out: dict[str, Any] = {}
    for name, resume_from, max_steps, max_epochs in RUNS:
        losses: dict[int, float] = {}
        epochs: dict[int, int] = {}

        class Record(pl.Callback):
            def __init__(self, losses: dict[int, float], epochs: dict[int, int]) -> None:
                self.losses, self.epochs = losses, epochs

            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
                loss = (outputs["loss"] if isinstance(outputs, dict) else outputs).detach().clone()
                torch.distributed.all_reduce(loss)
                self.losses[trainer.global_step] = float(loss) / world_size
                self.epochs[trainer.global_step] = trainer.current_epoch

        trainer = pl.Trainer(
            accelerator="cpu", devices=world_size, max_steps=max_steps, max_epochs=max_epochs,
            num_sanity_val_steps=0, limit_val_batches=0, strategy=RecStrategy(fused_params=FUSED),
            logger=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[Record(losses, epochs), ModelCheckpoint(dirpath=os.path.join(root, name), save_last=True, save_top_k=0)],
        )  # fmt: skip
        module = _plain_module() if kind == "plain" else ToyDLRM(device="meta", dense_optimizer="adagrad")
        data = toy_data(batch_size=GLOBAL_BATCH // world_size, num_train_batches=STEPS_PER_EPOCH * world_size)
        ckpt = os.path.join(root, resume_from, "last.ckpt") if resume_from else None
        trainer.fit(module, datamodule=data, ckpt_path=ckpt)
        out[name] = {"losses": losses, "epochs": epochs, "global_step": trainer.global_step}
    return out


@pytest.mark.parametrize("kind", ["RecModule", "plain"])
def test_last_ckpt_resumes_exactly_where_training_stopped(kind: str, tmp_path: Any) -> None:
    runs = run_ranks(_fits, 2, args=(str(tmp_path), kind, free_port()), timeout=600)[0]
    reference = runs["uninterrupted"]["losses"]
    assert sorted(reference) == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert sorted(runs["A"]["losses"]) == [1, 2, 3, 4] and sorted(runs["B"]["losses"]) == [1, 2, 3]
    expected_steps = {
        "A + max_steps": [5, 6, 7],  # before: [] (nothing trained)
        "A, epochs only": [5, 6, 7, 8],
        "B + max_steps": [4, 5, 6, 7],  # before: [4], on the data of epoch 1's first batch
        "B, epochs only": [4, 5, 6, 7, 8],
    }
    for name, steps in expected_steps.items():
        resumed = runs[name]
        assert sorted(resumed["losses"]) == steps, name
        assert resumed["global_step"] == steps[-1], name
        assert resumed["losses"] == {s: reference[s] for s in steps}, name  # the same batches, the same numbers
        assert resumed["epochs"] == {s: (s - 1) // STEPS_PER_EPOCH for s in steps}, name


def _logged_losses(root: str, name: str, max_steps: int, max_epochs: int, ckpt: str | None) -> dict[int, float]:
    import csv

    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.lightning.toy import ToyDLRM, toy_data

    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, max_epochs=max_epochs, num_sanity_val_steps=0,
        limit_val_batches=1, log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
        logger=pl.loggers.CSVLogger(root, name=name, version=0),
        callbacks=[ModelCheckpoint(dirpath=os.path.join(root, name, "ckpt"), save_last=True, save_top_k=0)],
    )  # fmt: skip
    trainer.fit(ToyDLRM(dense_optimizer="adagrad"), datamodule=toy_data(batch_size=32, num_train_batches=4), ckpt_path=ckpt)
    with open(os.path.join(root, name, "version_0", "metrics.csv")) as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


def test_resumed_metrics_are_logged_at_the_steps_of_the_uninterrupted_run(tmp_path: Any) -> None:
    """With validation in the run, Lightning's restart found validation due at the first batch of the
    resumed epoch, skipped it and counted one more stepped batch: the resumed run's metrics were
    logged one step later than the uninterrupted run's (TensorBoard curves shifted by one)."""
    root = str(tmp_path)
    reference = _logged_losses(root, "uninterrupted", -1, 2, None)
    _logged_losses(root, "A", -1, 1, None)
    resumed = _logged_losses(root, "resumed", 6, 2, os.path.join(root, "A", "ckpt", "last.ckpt"))
    assert sorted(reference) == list(range(8))  # step k's loss is logged at k - 1
    assert resumed == {s: reference[s] for s in (4, 5)}
