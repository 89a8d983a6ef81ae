"""``ProgressiveValidation`` keeps its windows in a checkpoint: a fit resumed from one logs exactly the
figures of the uninterrupted fit, and the saved state loads with ``weights_only=True``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightrec.lightning import ProgressiveValidation
from lightrec.metrics import SlidingWindow
from tests.lightning.callbacks.test_review_callbacks import _Recorder
from tests.lightning.toy import ToyDLRM, toy_data

WINDOW = 100  # batches of 64: the window spans the checkpoint (epoch 1's last samples are still in it)


def _fit(epochs: int, ckpt: Path | None = None, save: Path | None = None) -> tuple[dict[int, dict[str, float]], Any]:
    recorder = _Recorder()
    progressive = ProgressiveValidation(window=WINDOW, metrics=("auc", "ne", "ctr"), every_n_steps=1)
    trainer = pl.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, callbacks=[progressive], logger=recorder, log_every_n_steps=1,
    )  # fmt: skip
    trainer.fit(ToyDLRM(embedding_lr=0.2, dense_lr=0.2), datamodule=toy_data(num_train_batches=3),
                ckpt_path=None if ckpt is None else str(ckpt))  # fmt: skip
    if save is not None:
        trainer.save_checkpoint(str(save))
    logged: dict[int, dict[str, float]] = {}  # step -> the online/ values logged at it
    for step, metrics in recorder.rows:
        assert step is not None
        logged.setdefault(step, {}).update({k: v for k, v in metrics.items() if k.startswith("online/")})
    return {step: values for step, values in logged.items() if values}, progressive


def test_a_resumed_fit_logs_the_uninterrupted_fits_figures(tmp_path: Path) -> None:
    whole, _ = _fit(epochs=2)
    first, _ = _fit(epochs=1, save=tmp_path / "epoch1.ckpt")
    resumed, progressive = _fit(epochs=2, ckpt=tmp_path / "epoch1.ckpt")
    assert sorted(whole) == [0, 1, 2, 3, 4, 5] and sorted(first) == [0, 1, 2] and sorted(resumed) == [3, 4, 5]
    assert {**first, **resumed} == whole  # exactly: the same windows, the same values
    assert progressive.last_metrics == whole[5]


def test_the_saved_windows_load_weights_only_and_round_trip(tmp_path: Path) -> None:
    _, progressive = _fit(epochs=1, save=tmp_path / "epoch1.ckpt")
    checkpoint = torch.load(tmp_path / "epoch1.ckpt", weights_only=True)
    state = checkpoint["callbacks"][progressive.state_key]
    auc = progressive.metrics["auc"]
    torch.testing.assert_close(state["windows"]["auc"]["window_preds"], auc.window_preds.unsqueeze(0), rtol=0, atol=0)
    assert int(state["windows"]["auc"]["window_seen"][0]) == 3 * 64
    assert state["last_metrics"] == progressive.last_metrics


def test_a_window_of_another_size_starts_empty_with_a_warning(tmp_path: Path) -> None:
    _, progressive = _fit(epochs=1, save=tmp_path / "epoch1.ckpt")
    state = progressive.state_dict()
    other = ProgressiveValidation(window=WINDOW + 1, metrics=("auc", "ne", "ctr"))
    other.metrics = {"auc": SlidingWindow("auc", WINDOW + 1, validate_args=False)}
    other.load_state_dict(state)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    with pytest.warns(UserWarning, match="starts empty"):
        other._restore(trainer)
    assert int(other.metrics["auc"].window_seen) == 0
    with pytest.raises(TypeError, match="state_dict=.*windows"):
        other.load_state_dict({"something": 1})


def _two_rank_round_trip(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """Each rank fills its own window, saves (a collective), and restores into a fresh callback."""
    from types import SimpleNamespace

    progressive = ProgressiveValidation(window=2 * 8, metrics=("auc",))
    progressive.metrics = {"auc": SlidingWindow("auc", 8, validate_args=False)}
    gen = torch.Generator().manual_seed(rank)
    progressive.metrics["auc"].update(torch.rand(5 + rank, generator=gen), torch.tensor([0.0, 1.0] * 3)[: 5 + rank])
    state = progressive.state_dict()  # every rank calls it, as Lightning's dump_checkpoint does
    fresh = ProgressiveValidation(window=2 * 8, metrics=("auc",))
    fresh.metrics = {"auc": SlidingWindow("auc", 8, validate_args=False)}
    fresh.load_state_dict(state)
    fresh._restore(SimpleNamespace(world_size=world_size, global_rank=rank))  # type: ignore[arg-type]
    mine, back = progressive.metrics["auc"], fresh.metrics["auc"]
    return {
        "saved_preds": state["windows"]["auc"]["window_preds"],
        "mine": torch.stack([mine.window_preds, mine.window_labels]),
        "back": torch.stack([back.window_preds, back.window_labels]),
        "seen": torch.stack([mine.window_seen.reshape(()), back.window_seen.reshape(())]),
    }


def test_two_ranks_save_every_window_and_each_restores_its_own() -> None:
    from tests.multiprocess import run_ranks

    results = run_ranks(_two_rank_round_trip, 2)
    for rank, result in enumerate(results):
        assert result["saved_preds"].shape == (2, 8)  # [world_size, per-rank window]
        torch.testing.assert_close(result["back"], result["mine"], rtol=0, atol=0)
        assert result["seen"].tolist() == [5 + rank, 5 + rank]
        torch.testing.assert_close(result["saved_preds"][rank], result["mine"][0], rtol=0, atol=0)
    # the two ranks' windows differ, so restoring rank 0's row on rank 1 would have failed the check above
    assert not torch.equal(results[0]["mine"][0], results[1]["mine"][0])
