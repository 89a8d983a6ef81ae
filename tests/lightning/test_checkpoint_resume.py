"""Sharded Lightning checkpoints: ModelCheckpoint writes them, Trainer.fit(ckpt_path=...) resumes.

Run A trains a toy DLRM for STEPS steps on 2 gloo ranks (mixed plan, fused row-wise Adagrad,
Adam for the dense part, warm-up LR schedule), ``ModelCheckpoint`` saving every SAVE_EVERY steps
-- in the middle of an epoch. Then fresh processes resume from the checkpoint at step SAVE_EVERY:

* 2 ranks, same plan: per-step losses bit-identical to run A;
* 1 rank (another plan, the global batch kept): equal within float tolerance;
  the data loader resumes mid-epoch from the samples the checkpoint recorded;
* a checkpoint written by a run with ``SparseDistPrefetch`` (which reads the next batch one step
  early) resumes bit-identically too: the held batch is not counted as consumed.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.multiprocess import free_port, run_nccl, run_ranks, set_torchrun_env

STEPS, SAVE_EVERY, STEPS_PER_EPOCH, GLOBAL_BATCH = 6, 2, 4, 64


def _fit(
    rank: int,
    world_size: int,
    port: int,
    root: str,
    ckpt_path: str | None,
    prefetch: bool = False,
    accelerator: str = "cpu",
) -> dict[str, Any]:
    set_torchrun_env(rank, world_size, port)
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightrec.lightning import RecStrategy
    from tests.lightning.test_rec_strategy import mixed_plan
    from tests.lightning.toy import ToyDLRM, toy_data

    losses: dict[int, float] = {}

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            loss = outputs["loss"].detach().clone()
            torch.distributed.all_reduce(loss)
            losses[trainer.global_step] = float(loss) / world_size

    callbacks: list[Any] = [Record()]
    if prefetch:
        from lightrec.lightning import SparseDistPrefetch

        callbacks.append(SparseDistPrefetch())
    if ckpt_path is None:
        callbacks.append(
            ModelCheckpoint(dirpath=os.path.join(root, "ckpts"), every_n_train_steps=SAVE_EVERY, save_top_k=-1)
        )
        # What the recipes' ModelCheckpoint writes: a checkpoint at the end of each epoch.
        callbacks.append(
            ModelCheckpoint(
                dirpath=os.path.join(root, "epoch_end"), filename="{epoch}", save_top_k=-1, save_on_train_epoch_end=True
            )
        )
    data = toy_data(batch_size=GLOBAL_BATCH // world_size, num_train_batches=STEPS_PER_EPOCH * world_size)
    trainer = pl.Trainer(
        accelerator=accelerator, devices=world_size, max_steps=STEPS, num_sanity_val_steps=0, limit_val_batches=0,
        strategy=RecStrategy(
            plan=mixed_plan(world_size) if world_size > 1 else None,
            fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1},
        ),
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=ckpt_path is None, callbacks=callbacks, default_root_dir=root,
    )  # fmt: skip
    module = ToyDLRM(device="meta", dense_optimizer="adam", dense_lr=0.01, warmup_steps=3)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    out: dict[str, Any] = {"losses": losses}
    if ckpt_path is None and rank == 0:
        out["files"] = sorted(os.listdir(os.path.join(root, "ckpts")))
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: Any) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("run_a"))
    ranks = run_ranks(_fit, 2, args=(free_port(), root, None), timeout=300)
    return {"root": root, "ranks": ranks}


def test_model_checkpoint_writes_sharded_directories(uninterrupted: dict[str, Any]) -> None:
    files = uninterrupted["ranks"][0]["files"]
    assert files == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "epoch=1-step=6.ckpt"]
    ckpt = os.path.join(uninterrupted["root"], "ckpts", files[0])
    assert sorted(os.listdir(ckpt)) == ["manifest.json", "meta.pt", "shards-rank00000.pt", "shards-rank00001.pt"]


def test_resume_mid_epoch_on_two_ranks_is_bit_identical(uninterrupted: dict[str, Any], tmp_path: Any) -> None:
    ckpt = os.path.join(uninterrupted["root"], "ckpts", "epoch=0-step=2.ckpt")
    resumed = run_ranks(_fit, 2, args=(free_port(), str(tmp_path), ckpt), timeout=300)
    expected = {s: v for s, v in uninterrupted["ranks"][0]["losses"].items() if s > SAVE_EVERY}
    assert resumed[0]["losses"] == expected


def test_resume_on_one_rank_reshards(uninterrupted: dict[str, Any], tmp_path: Any) -> None:
    ckpt = os.path.join(uninterrupted["root"], "ckpts", "epoch=0-step=2.ckpt")
    resumed = run_ranks(_fit, 1, args=(free_port(), str(tmp_path), ckpt), timeout=300)
    expected = {s: v for s, v in uninterrupted["ranks"][0]["losses"].items() if s > SAVE_EVERY}
    assert resumed[0]["losses"] == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_checkpoint_of_a_prefetching_run_resumes_bit_identically(uninterrupted: dict[str, Any], tmp_path: Any) -> None:
    root = str(tmp_path / "prefetching")
    written = run_ranks(_fit, 2, args=(free_port(), root, None, True), timeout=300)
    assert written[0]["losses"] == uninterrupted["ranks"][0]["losses"]  # prefetch changes nothing
    ckpt = os.path.join(root, "ckpts", "epoch=0-step=2.ckpt")
    resumed = run_ranks(_fit, 2, args=(free_port(), str(tmp_path / "resumed"), ckpt, True), timeout=300)
    expected = {s: v for s, v in uninterrupted["ranks"][0]["losses"].items() if s > SAVE_EVERY}
    assert resumed[0]["losses"] == expected


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", [False, True])
def test_gpu_run_resumed_mid_epoch_gives_the_same_losses(tmp_path: Any, prefetch: bool) -> None:
    """On CUDA (NCCL group of size 1): a run resumed from its step-2 checkpoint (mid-epoch) gives the
    per-step losses of the uninterrupted run (equal up to the nondeterministic order of CUDA's
    atomic adds in embedding backward), with and without SparseDistPrefetch."""
    root = str(tmp_path / "a")
    written = run_nccl(_fit, args=(free_port(), root, None, prefetch, "gpu"), timeout=300)
    ckpt = os.path.join(root, "ckpts", "epoch=0-step=2.ckpt")
    resumed = run_nccl(_fit, args=(free_port(), str(tmp_path / "b"), ckpt, prefetch, "gpu"), timeout=300)
    expected = {s: v for s, v in written["losses"].items() if s > SAVE_EVERY}
    assert sorted(resumed["losses"]) == sorted(expected) == list(range(SAVE_EVERY + 1, STEPS + 1))
    assert resumed["losses"] == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("checkpoint", ["epoch_end/epoch=0.ckpt", f"ckpts/epoch=0-step={STEPS_PER_EPOCH}.ckpt"])
def test_resume_after_a_finished_epoch_trains_the_next_epoch(
    uninterrupted: dict[str, Any], tmp_path: Any, checkpoint: str
) -> None:
    """Issue 16, item 1: a checkpoint written when epoch 0 was read to its end (``last.ckpt`` at the
    epoch's end, or the step checkpoint of its last step) resumes into epoch 1 from its beginning;
    the position saved for epoch 0 used to skip all of epoch 1 (nothing trained, exit 0)."""
    ckpt = os.path.join(uninterrupted["root"], checkpoint)
    resumed = run_ranks(_fit, 2, args=(free_port(), str(tmp_path), ckpt), timeout=300)
    expected = {s: v for s, v in uninterrupted["ranks"][0]["losses"].items() if s > STEPS_PER_EPOCH}
    assert sorted(resumed[0]["losses"]) == list(range(STEPS_PER_EPOCH + 1, STEPS + 1))
    assert resumed[0]["losses"] == expected
