"""Metrics logged by a 2-rank RecStrategy fit equal references computed on the gathered predictions.

Every rank records the probabilities and labels its own training and validation steps saw; the
test concatenates both ranks' records and computes AUC, NE, calibration, CTR and accuracy from the
formulas in plain numpy (AUC by counting every positive/negative pair), and with sklearn too when
it is installed. The logged values are synced over ranks by torchmetrics, so they must equal the
reference on the union of both ranks' predictions (not on either rank's half).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.multiprocess import free_port, run_ranks, set_torchrun_env

BATCH = 32  # per rank
TRAIN_BATCHES = 4  # per rank
VAL_BATCHES = 4  # per rank
NAMES = ("auc", "ne", "calibration", "ctr", "accuracy")


def _fit(rank: int, world_size: int, port: int, tmp: str) -> dict:
    set_torchrun_env(rank, world_size, port)
    import lightning.pytorch as pl
    import torch

    from lightrec.data import SyntheticCriteo
    from lightrec.lightning import RecStrategy
    from tests.lightning.toy import ToyDLRM, mixed_toy_plan

    class Recorded(ToyDLRM):
        """Keeps the logits and labels of every step, split by training / validation."""

        def __init__(self, **kwargs) -> None:  # noqa: ANN003
            super().__init__(**kwargs)
            self.record: dict[str, dict[str, list]] = {
                s: {"logits": [], "labels": []} for s in ("train", "val")
            }

        def forward(self, dense, sparse):  # noqa: ANN001, ANN201
            logits = super().forward(dense, sparse)
            self.record["train" if self.training else "val"]["logits"].append(
                logits.detach().reshape(-1).clone()
            )
            return logits

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            self.record["train"]["labels"].append(batch.labels.clone())
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            self.record["val"]["labels"].append(batch.labels.clone())
            return super().validation_step(batch, batch_idx)

    data = SyntheticCriteo(
        batch_size=BATCH, num_train_batches=TRAIN_BATCHES * world_size, num_val_batches=VAL_BATCHES * world_size,
        num_test_batches=2, num_embeddings_cap=200, seed=3, block_size=32,
    )  # fmt: skip
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, max_epochs=1, num_sanity_val_steps=0,
        strategy=RecStrategy(plan=mixed_toy_plan(world_size),
                             fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1}),
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp,
    )  # fmt: skip
    module = Recorded(device="meta", dense_optimizer="sgd", dense_lr=0.1, train_metrics=True)
    trainer.fit(module, datamodule=data)
    out = {
        split: {
            "probs": torch.sigmoid(torch.cat(rec["logits"])).numpy(),
            "labels": torch.cat(rec["labels"]).numpy(),
        }
        for split, rec in module.record.items()
    }
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return {"records": out, "logged": logged}


# ---------------------------------------------------------------- independent references
def _auc(p: np.ndarray, y: np.ndarray) -> float:
    """P(random positive scored above random negative), ties 1/2: every pair counted."""
    pos, neg = p[y == 1].astype(np.float64), p[y == 0].astype(np.float64)
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))


def _ne(p: np.ndarray, y: np.ndarray) -> float:
    p, y = p.astype(np.float64), y.astype(np.float64)
    logloss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    ctr = y.mean()
    return float(logloss / -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr)))


def _references(p: np.ndarray, y: np.ndarray) -> dict[str, float]:
    return {
        "auc": _auc(p, y),
        "ne": _ne(p, y),
        "calibration": float(p.astype(np.float64).sum() / y.sum()),
        "ctr": float(y.mean()),
        "accuracy": float(((p > 0.5) == (y == 1)).mean()),
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):  # noqa: ANN001, ANN201
    return run_ranks(_fit, 2, args=(free_port(), str(tmp_path_factory.mktemp("metrics"))), timeout=240)


@pytest.mark.parametrize("split", ["train", "val"])
def test_logged_metrics_equal_references_on_gathered_predictions(run, split: str) -> None:  # noqa: ANN001
    batches = TRAIN_BATCHES if split == "train" else VAL_BATCHES
    p = np.concatenate([r["records"][split]["probs"] for r in run])
    y = np.concatenate([r["records"][split]["labels"] for r in run])
    assert p.shape == y.shape == (2 * batches * BATCH,)
    assert 0 < y.sum() < len(y)  # both classes, so every metric is defined
    expected = _references(p, y)
    for rank, result in enumerate(run):
        for name in NAMES:
            got = result["logged"][f"{split}/{name}"]
            assert got == pytest.approx(expected[name], rel=2e-6, abs=1e-7), (rank, split, name)
    # the ranks' halves differ from the whole: the logged value is really the synced one
    halves = [_references(r["records"][split]["probs"], r["records"][split]["labels"]) for r in run]
    assert any(h["auc"] != pytest.approx(expected["auc"], rel=1e-6) for h in halves)


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="sklearn is not installed")
def test_references_agree_with_sklearn(run) -> None:  # noqa: ANN001
    from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

    p = np.concatenate([r["records"]["val"]["probs"] for r in run]).astype(np.float64)
    y = np.concatenate([r["records"]["val"]["labels"] for r in run]).astype(np.float64)
    ctr = y.mean()
    baseline = log_loss(y, np.full_like(p, ctr))
    logged = run[0]["logged"]
    assert logged["val/auc"] == pytest.approx(roc_auc_score(y, p), rel=2e-6)
    assert logged["val/ne"] == pytest.approx(log_loss(y, p) / baseline, rel=2e-6)
    assert logged["val/accuracy"] == pytest.approx(accuracy_score(y, p > 0.5), rel=2e-6)
