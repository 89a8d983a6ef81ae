"""DeltaPublisher in a 2-rank RecStrategy fit (tables row-wise, data-parallel and table-wise): a
snapshot at train start, then a version every 2 steps (every 2nd a snapshot, every 3rd with the
dense weights), the last at train end, written in the background (the default); the newest version
rebuilds the trained tables bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.multiprocess import free_port, run_ranks, set_torchrun_env

STEPS = 5


def _fit(rank: int, world_size: int, port: int, tmp: str) -> dict:
    set_torchrun_env(rank, world_size, port)
    import lightning.pytorch as pl

    from lightrec.inference import unshard
    from lightrec.lightning import DeltaPublisher, RecStrategy
    from tests.lightning.toy import ToyDLRM, mixed_toy_plan, toy_data

    plan = mixed_toy_plan(world_size)
    strategy = RecStrategy(plan=plan, fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1})
    publisher = DeltaPublisher(Path(tmp) / "publish", every_n_steps=2, snapshot_every=2, dense_every=3, keep=None)
    module = ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, strategy=strategy, max_steps=STEPS, num_sanity_val_steps=0,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[publisher], default_root_dir=tmp,
    )  # fmt: skip
    trainer.fit(module, datamodule=toy_data(batch_size=32, num_train_batches=2 * STEPS))
    trained = unshard(module.model, dst=0)
    state = {k: v.cpu().clone() for k, v in trained.state_dict().items()} if trained is not None else None
    return {"versions": publisher.versions, "state": state}


def test_two_rank_fit_publishes_versions_that_rebuild_the_trained_tables(tmp_path: Path) -> None:
    from lightrec.distributed.deltas import DeltaReader

    results = run_ranks(_fit, 2, args=(free_port(), str(tmp_path)), timeout=300)
    # v1 snapshot at step 0; steps 2, 4 (v3 a snapshot: the 2nd publish after v1); v4 at train end (step 5)
    assert results[0]["versions"] == results[1]["versions"] == [(1, 0), (2, 2), (3, 4), (4, 5)]
    reader = DeltaReader(tmp_path / "publish")
    assert [reader.manifest(v).kind for v in (1, 2, 3, 4)] == ["snapshot", "delta", "snapshot", "delta"]
    assert [reader.manifest(v).dense for v in (1, 2, 3, 4)] == [True, False, True, True]
    state = reader.state(4)
    trained = results[0]["state"]
    for name, rows in state.rows.items():
        weight = trained[f"sparse_arch.embedding_bag_collection.embedding_bags.{name}.weight"]
        assert torch.equal(rows.values, weight), name
    for key, value in state.dense.items():
        assert torch.equal(value, trained[key]), key


def test_argument_errors_name_the_argument() -> None:
    from lightrec.lightning import DeltaPublisher

    with pytest.raises(ValueError, match="needs a cadence"):
        DeltaPublisher("x")
    with pytest.raises(ValueError, match="every_n_steps=0"):
        DeltaPublisher("x", every_n_steps=0)
    with pytest.raises(ValueError, match="keep=0"):
        DeltaPublisher("x", every_n_steps=1, keep=0)


@pytest.mark.parametrize("background", [True, False])
def test_every_seconds_publishes_on_rank_zeros_clock_in_a_single_process_fit(tmp_path: Path, background: bool) -> None:
    import lightning.pytorch as pl

    from lightrec.distributed.deltas import DeltaReader
    from lightrec.lightning import DeltaPublisher, RecStrategy
    from tests.lightning.toy import ToyDLRM, toy_data

    publisher = DeltaPublisher(tmp_path / "publish", every_seconds=1e-9, keep=None, background=background)  # every step
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, strategy=RecStrategy(), max_steps=3, num_sanity_val_steps=0,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[publisher], default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(ToyDLRM(dense_optimizer="sgd", dense_lr=0.1), datamodule=toy_data(batch_size=32, num_train_batches=3))
    assert publisher.versions == [(1, 0), (2, 1), (3, 2), (4, 3)]  # nothing left for train end
    assert DeltaReader(tmp_path / "publish").versions() == [1, 2, 3, 4]
    assert len(publisher.seconds) == 4 and len(publisher.background_seconds) == (4 if background else 0)
