"""RecModule checkpoints and loop state on one device (no RecStrategy), each checked with a real Trainer fit.

* a ``configure_optimizers`` override that returns a dense optimizer only leaves the fused tables'
  optimizers out of Lightning's ``optimizer_states``: their state (Adam moments, row-wise Adagrad
  accumulators) was lost on resume, so a resumed run's table updates differed from an uninterrupted
  run's. ``RecModule`` now carries it in its own checkpoint entry (not under ``RecStrategy``, which
  saves it itself, sharded: not twice);
* a mid-epoch ``ModelCheckpoint(every_n_train_steps=...)`` checkpoint with ``accumulate_grad_batches > 1``
  resumes to the uninterrupted run's weights, bit for bit (a guard of ``loop_state``, which leaves it alone);
* ``nonfinite_loss="skip"`` under manual optimization: Lightning's ``on_before_zero_grad`` never runs
  there, so the "earlier micro-batches left gradients" flag stayed set after the first good batch and a
  skipped batch kept the zeroed gradients of ``zero_grad(set_to_none=False)``: Adam stepped on them and
  the skipped batch changed the weights. Now the gradients themselves decide; a user's own accumulation
  across batches still keeps the good batches' gradients.

Exact comparisons run with ``Trainer(deterministic=True)`` (CPU kernels, one thread of work per op order).
"""

from __future__ import annotations

import copy
import glob
import os
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.lightning.test_review_loop_edges import _batches, _Dense, _FusedTables, _loader
from tests.lightning.toy import toy_data

ENTRY = "lightrec_unlisted_fused_optimizer_states"


def _trainer(root: str, **kwargs: Any) -> pl.Trainer:
    kwargs.setdefault("enable_checkpointing", False)
    return pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, deterministic=True, default_root_dir=root, **kwargs,
    )  # fmt: skip


def _assert_same_weights(got: torch.nn.Module, want: torch.nn.Module) -> None:
    expected = want.state_dict()
    for key, value in got.state_dict().items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=0, msg=key)


def _resume_matches_uninterrupted(make: Any, tmp: str, steps: int, every: int, batches: int, **trainer: Any) -> list[str]:
    """Fit ``steps`` steps uninterrupted; fit again writing a checkpoint every ``every`` steps, and resume a
    fresh module from each checkpoint to ``steps``: every resume must end at the uninterrupted weights."""
    full = make()
    _trainer(tmp, max_steps=steps, **trainer).fit(full, datamodule=toy_data(batch_size=32, num_train_batches=batches))
    saver = ModelCheckpoint(dirpath=os.path.join(tmp, "ck"), every_n_train_steps=every, save_top_k=-1)
    _trainer(tmp, max_steps=steps - 1, callbacks=[saver], enable_checkpointing=True, **trainer).fit(
        make(), datamodule=toy_data(batch_size=32, num_train_batches=batches)
    )
    paths = sorted(glob.glob(os.path.join(tmp, "ck", "*.ckpt")))
    assert paths
    for path in paths:
        resumed = make()
        _trainer(tmp, max_steps=steps, **trainer).fit(
            resumed, datamodule=toy_data(batch_size=32, num_train_batches=batches), ckpt_path=path
        )
        assert resumed.trainer.global_step == steps
        _assert_same_weights(resumed, full)
    return paths


# ------------------------------------------------------------------ 1. fused optimizers left out of configure_optimizers
class _DenseAdamOnly(_FusedTables):
    """Returns a dense optimizer only: the table's fused optimizer still trains it inside backward."""

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.dense_parameters().values(), lr=0.01)


@pytest.mark.parametrize("embedding_optimizer", ["adam", "rowwise_adagrad"])
def test_resume_restores_the_state_of_fused_optimizers_left_out_of_configure_optimizers(
    tmp_path: Any, embedding_optimizer: str
) -> None:
    """Before: the tables' Adam moments / Adagrad accumulators restarted from zero on resume (weights differed)."""
    paths = _resume_matches_uninterrupted(
        lambda: _DenseAdamOnly(embedding_optimizer=embedding_optimizer, embedding_lr=0.05, metrics=None),
        str(tmp_path), steps=4, every=2, batches=4,
    )  # fmt: skip
    saved = torch.load(paths[0], weights_only=True)
    assert len(saved["optimizer_states"]) == 1  # Lightning's: the dense Adam only
    assert set(saved[ENTRY]) == {"model.sparse"}  # the table's optimizer, by module path


def test_listed_fused_optimizers_are_not_saved_twice(tmp_path: Any) -> None:
    """RecModule's own CombinedOptimizer lists the tables' optimizer: Lightning saves it, RecModule does not."""
    module = _FusedTables(embedding_optimizer="adam", metrics=None)
    trainer = _trainer(str(tmp_path), max_steps=1)
    trainer.fit(module, datamodule=toy_data(batch_size=32, num_train_batches=2))
    trainer.save_checkpoint(tmp_path / "x.ckpt")
    assert ENTRY not in torch.load(tmp_path / "x.ckpt", weights_only=True)


def test_a_checkpoint_for_other_tables_is_refused_by_name(tmp_path: Any) -> None:
    module = _DenseAdamOnly(embedding_optimizer="adam", metrics=None)
    trainer = _trainer(str(tmp_path), max_steps=1)
    trainer.fit(module, datamodule=toy_data(batch_size=32, num_train_batches=2))
    trainer.save_checkpoint(tmp_path / "x.ckpt")
    checkpoint = torch.load(tmp_path / "x.ckpt", weights_only=True)
    checkpoint[ENTRY]["model.other"] = checkpoint[ENTRY].pop("model.sparse")
    torch.save(checkpoint, tmp_path / "renamed.ckpt")
    with pytest.raises(KeyError, match=r"model\.other.*model\.sparse"):
        _trainer(str(tmp_path), max_steps=2).fit(
            _DenseAdamOnly(embedding_optimizer="adam", metrics=None),
            datamodule=toy_data(batch_size=32, num_train_batches=2), ckpt_path=str(tmp_path / "renamed.ckpt"),
        )  # fmt: skip


def _rec_strategy_entries(rank: int, world_size: int, port: int, tmp: str) -> tuple[list[str], int | None]:
    from tests.multiprocess import set_torchrun_env

    set_torchrun_env(rank, world_size, port)
    from lightrec.distributed.checkpoint.files import read_meta
    from lightrec.lightning import RecStrategy

    module = _DenseAdamOnly(embedding_optimizer="adam", metrics=None)
    saver = ModelCheckpoint(dirpath=tmp, filename="sharded", every_n_train_steps=1, save_top_k=-1)
    trainer = _trainer(tmp, max_steps=1, strategy=RecStrategy(), callbacks=[saver], enable_checkpointing=True)
    trainer.fit(module, datamodule=toy_data(batch_size=32, num_train_batches=2))
    meta = read_meta(os.path.join(tmp, "sharded.ckpt"))
    return [k for k in meta if k == ENTRY], meta.get("lightrec_unlisted_fused_optimizers")


def test_rec_strategy_saves_the_unlisted_fused_optimizers_once(tmp_path: Any) -> None:
    from tests.multiprocess import free_port, run_ranks

    entries, counted = run_ranks(_rec_strategy_entries, 1, args=(free_port(), str(tmp_path)), timeout=240)[0]
    assert entries == []  # RecModule leaves it to RecStrategy's sharded save
    assert counted == 1


# ------------------------------------------------------------------ 2. mid-epoch checkpoints with accumulation
@pytest.mark.parametrize("batches", [6, 5])  # 3 windows per epoch; the last window of an odd epoch is short
def test_mid_epoch_resume_with_gradient_accumulation_matches_uninterrupted(tmp_path: Any, batches: int) -> None:
    paths = _resume_matches_uninterrupted(
        lambda: _FusedTables(embedding_optimizer="adam", dense_optimizer="adam", metrics=None),
        str(tmp_path), steps=5, every=1, batches=batches, accumulate_grad_batches=2, max_epochs=3,
    )  # fmt: skip
    assert len(paths) == 4  # steps 1..4: inside epoch 0, at its end, inside epoch 1


# ------------------------------------------------------------------ 3. skip under manual optimization
class _Manual(_Dense):
    """Manual optimization: one Adam step per ``every`` batches, gradients zeroed in place (not to None)."""

    def __init__(self, every: int = 1, **kwargs: Any) -> None:
        super().__init__(dense_optimizer="adam", dense_lr=0.05, nonfinite_loss="skip", **kwargs)
        self.automatic_optimization = False
        self.every = every

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.05)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        assert isinstance(optimizer, pl.core.optimizer.LightningOptimizer)
        if batch_idx % self.every == 0:
            optimizer.zero_grad(set_to_none=False)
        _, loss = self._logits_and_loss(batch)
        self.manual_backward(loss)
        if (batch_idx + 1) % self.every == 0:
            optimizer.step()
        return loss


def _manual_reference(batches: list[Any], initial: torch.nn.Module, every: int) -> torch.nn.Module:
    """Plain PyTorch: the same loop, a non-finite batch contributes nothing (a window without any good
    batch does not step)."""
    model = copy.deepcopy(initial)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for start in range(0, len(batches), every):
        optimizer.zero_grad(set_to_none=False)
        good = 0
        for batch in batches[start : start + every]:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(batch.dense_features).reshape(-1), batch.labels.float()
            )
            if torch.isfinite(loss):
                loss.backward()
                good += 1
        if good:
            optimizer.step()
    return model


@pytest.mark.parametrize(("every", "nan_at"), [(1, (2,)), (1, (0, 3)), (2, (3,)), (2, (4,)), (2, (2, 3))])
def test_skip_under_manual_optimization_changes_no_weight(tmp_path: Any, every: int, nan_at: tuple[int, ...]) -> None:
    """Before: after the first good batch, a skipped one kept the in-place zeroed gradients and Adam stepped."""
    batches = _batches(nan_at)
    module = _Manual(every=every)
    assert module.model is not None
    initial = copy.deepcopy(module.model)
    _trainer(str(tmp_path), max_epochs=1).fit(module, train_dataloaders=_loader(batches))
    assert module.skipped_nonfinite_batches == len(nan_at)
    want = _manual_reference(batches, initial, every)
    for key, value in want.state_dict().items():
        torch.testing.assert_close(module.model.state_dict()[key], value, rtol=1e-6, atol=1e-7, msg=key)


def test_a_skipped_batch_under_manual_optimization_leaves_the_weights_as_they_were(tmp_path: Any) -> None:
    """The last batch is bad: the weights after the fit are those after the batch before it."""
    batches = _batches((3,), count=4)
    module, before = _Manual(), _Manual()
    _trainer(str(tmp_path), max_epochs=1).fit(module, train_dataloaders=_loader(batches))
    _trainer(str(tmp_path), max_epochs=1).fit(before, train_dataloaders=_loader(batches[:3]))
    assert module.skipped_nonfinite_batches == 1
    _assert_same_weights(module, before)
