"""A run stopped mid-epoch and resumed from its checkpoint trains on exactly the batches of the uninterrupted
run: per-step losses equal bit for bit, on 2 gloo ranks, with shuffled Parquet data.

The runs share the two rank processes (one spawn): the uninterrupted run (2 epochs of 4 steps,
also checkpointing at step 6), run B stopped by ``max_steps=3`` inside epoch 0 while
``SparseDistPrefetch`` holds batch 4 read ahead (its ``last.ckpt`` must leave that batch out), B
resumed, and a resume from the step-6 checkpoint written inside epoch 1. (The test's rank processes
are daemons, which cannot start loader workers; ``test_batches.py`` shows the batches do not depend
on them.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.multiprocess import free_port, run_ranks, set_torchrun_env

STEPS_PER_EPOCH, BATCH = 4, 32  # per rank; 2 ranks: 256 of the 270 rows per epoch
#: (name, checkpoint to resume from, max_steps, max_epochs, SparseDistPrefetch)
RUNS = [
    ("uninterrupted", None, -1, 2, False),
    ("B", None, 3, 1, True),
    ("B resumed", "B/last.ckpt", -1, 2, False),
    ("step 6 resumed", "uninterrupted/step=6.ckpt", -1, 2, False),
]


def write_rows(folder: Path) -> None:
    """270 rows of the toy model's features (from the synthetic Criteo data) in 3 files, row groups of 50."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.lightning.toy import toy_data

    dataset = toy_data(batch_size=90, num_train_batches=3, block_size=None).datasets["train"]
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(3):
        batch = dataset[k]
        columns: dict[str, Any] = {"label": pa.array(batch.labels.numpy())}
        columns.update({f"int_{i}": pa.array(batch.dense_features[:, i].numpy()) for i in range(13)})
        kjt = batch.sparse_features
        columns.update({key: pa.array(kjt[key].values().numpy()) for key in kjt.keys()})
        pq.write_table(pa.table(columns), folder / f"part-{k}.parquet", row_group_size=50)


def _fits(rank: int, world_size: int, root: str, port: int) -> dict[str, Any]:
    set_torchrun_env(rank, world_size, port)
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightrec.data import ParquetDataModule
    from lightrec.lightning import RecStrategy, SparseDistPrefetch
    from tests.lightning.toy import ToyDLRM

    out: dict[str, Any] = {}
    for name, resume_from, max_steps, max_epochs, prefetch in RUNS:
        losses: dict[int, float] = {}

        class Record(pl.Callback):
            def __init__(self, losses: dict[int, float]) -> None:
                self.losses = losses

            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
                loss = (outputs["loss"] if isinstance(outputs, dict) else outputs).detach().clone()
                torch.distributed.all_reduce(loss)
                self.losses[trainer.global_step] = float(loss) / world_size

        folder = os.path.join(root, name.split()[0])
        callbacks: list[pl.Callback] = [Record(losses), ModelCheckpoint(dirpath=folder, save_last=True, save_top_k=0)]
        if name == "uninterrupted":
            callbacks.append(ModelCheckpoint(dirpath=folder, every_n_train_steps=6, save_top_k=-1, filename="{step}"))
        if prefetch:
            callbacks.append(SparseDistPrefetch())
        trainer = pl.Trainer(
            accelerator="cpu", devices=world_size, max_steps=max_steps, max_epochs=max_epochs, num_sanity_val_steps=0,
            limit_val_batches=0, strategy=RecStrategy(fused_params={"optimizer": "exact_row_wise_adagrad",
            "learning_rate": 0.1}), logger=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=callbacks,
        )  # fmt: skip
        data = ParquetDataModule(
            os.path.join(root, "data"), label="label", dense=["int_*"], sparse=["cat_*"], batch_size=BATCH,
            shuffle=True, seed=5,
        )  # fmt: skip
        ckpt = os.path.join(root, resume_from) if resume_from else None
        trainer.fit(ToyDLRM(device="meta", dense_optimizer="adagrad"), datamodule=data, ckpt_path=ckpt)
        out[name] = {"losses": losses, "global_step": trainer.global_step}
    return out


def test_a_resumed_run_trains_on_the_batches_of_the_uninterrupted_run(tmp_path: Path) -> None:
    write_rows(tmp_path / "data")
    runs = run_ranks(_fits, 2, args=(str(tmp_path), free_port()), timeout=900)[0]
    reference = runs["uninterrupted"]["losses"]
    assert sorted(reference) == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert len(set(reference.values())) == len(reference)  # the steps saw different batches
    assert sorted(runs["B"]["losses"]) == [1, 2, 3]
    expected = {"B resumed": [4, 5, 6, 7, 8], "step 6 resumed": [7, 8]}
    for name, steps in expected.items():
        assert runs[name]["losses"] == {s: reference[s] for s in steps}, name
    assert {s: reference[s] for s in (1, 2, 3)} == runs["B"]["losses"]


@pytest.mark.parametrize("world", [2])
def test_a_position_from_other_ranks_is_refused(world: int, tmp_path: Path) -> None:
    from lightrec.data.parquet import ParquetLoader, ParquetSource, ResumeMismatchError, build_spec, slices_of

    write_rows(tmp_path)
    source = ParquetSource(str(tmp_path))
    spec = build_spec(source.schema, str(tmp_path), "label", ["int_*"], ["cat_*"])
    loader = ParquetLoader(source, spec, slices_of(source.files), 16, 0, world)
    state = loader.state_dict()
    assert state == {"epoch": 0, "batch": 0, "world_size": world, "batch_size": 16, "fingerprint": loader.fingerprint}
    with pytest.raises(ResumeMismatchError, match=r"on 2 rank\(s\) x batch_size 16, this run on 1 x 16.*resume with 2"):
        ParquetLoader(source, spec, slices_of(source.files), 16, 0, 1).load_state_dict(state)
    other = ParquetLoader(source, spec, slices_of(source.files)[1:], 16, 0, world)
    with pytest.raises(ResumeMismatchError, match=r"differs from the data the checkpoint was trained on"):
        other.load_state_dict(state)
