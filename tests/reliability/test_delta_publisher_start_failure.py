"""DeltaPublisher: when rank 0 cannot open the publish folder at train start (a ``row_format`` naming no
table, a folder it may not write), every rank of a 2-rank fit raises at once, naming rank 0's error --
the other ranks used to wait in the publisher's first collective until a timeout, with no message of
what went wrong (review of the publish path)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.multiprocess import free_port, run_ranks, set_torchrun_env


def _fit(rank: int, world_size: int, port: int, tmp: str) -> tuple[str, float]:
    set_torchrun_env(rank, world_size, port)
    from datetime import timedelta

    import lightning.pytorch as pl

    from lightrec.lightning import DeltaPublisher, RecStrategy
    from tests.lightning.toy import ToyDLRM, mixed_toy_plan, toy_data

    strategy = RecStrategy(plan=mixed_toy_plan(world_size), timeout=timedelta(seconds=60),
                           fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1})  # fmt: skip
    publisher = DeltaPublisher(Path(tmp) / "publish", every_n_steps=2, row_format={"no_such_table": "int8"})
    module = ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, strategy=strategy, max_steps=3, num_sanity_val_steps=0,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[publisher], default_root_dir=tmp,
    )  # fmt: skip
    start = time.monotonic()
    try:
        trainer.fit(module, datamodule=toy_data(batch_size=32, num_train_batches=6))
    except Exception as exc:  # noqa: BLE001 - the outcome is the test's
        return f"{type(exc).__name__}: {exc}", time.monotonic() - start
    return "trained", time.monotonic() - start


def test_a_folder_rank_zero_cannot_open_fails_every_rank_at_once(tmp_path: Path) -> None:
    results = run_ranks(_fit, 2, args=(free_port(), str(tmp_path)), timeout=100)
    for rank, (outcome, seconds) in enumerate(results):
        assert outcome.startswith("DeltaFormatError") and "no_such_table" in outcome, (rank, outcome)
        assert seconds < 30, (rank, seconds, outcome)  # not the process group's 60 s timeout
    assert "rank 0" in results[1][0], results[1]
    assert not (tmp_path / "publish").exists() or not any((tmp_path / "publish").iterdir())
