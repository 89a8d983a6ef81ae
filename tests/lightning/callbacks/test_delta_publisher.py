"""DeltaPublisher in a 2-rank RecStrategy fit (tables row-wise, data-parallel and table-wise): a
snapshot at train start, then a version every 2 steps (every 2nd a snapshot, every 3rd with the
dense weights), the last at train end, written in the background (the default); the newest version
rebuilds the trained tables bit for bit. ``every_seconds`` publishes once per global step (gradient
accumulation too). A fit that fails -- an exception in a single-process fit, a peer SIGKILLed in a
2-rank one -- leaves no publish thread and no tracker of the callback's recording (Lightning calls
``on_exception``, not ``on_train_end``)."""

from __future__ import annotations

import threading
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.multiprocess import free_port, run_ranks, set_torchrun_env

THREAD = "lightrec-delta-publisher"

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


def test_every_seconds_publishes_once_per_global_step_under_gradient_accumulation(tmp_path: Path) -> None:
    import lightning.pytorch as pl

    from lightrec.lightning import DeltaPublisher, RecStrategy
    from tests.lightning.toy import ToyDLRM, toy_data

    publisher = DeltaPublisher(tmp_path / "publish", every_seconds=1e-9, keep=None, background=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, strategy=RecStrategy(), max_steps=2, accumulate_grad_batches=2,
        num_sanity_val_steps=0, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[publisher], default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(ToyDLRM(dense_optimizer="sgd", dense_lr=0.1), datamodule=toy_data(batch_size=32, num_train_batches=4))
    assert trainer.global_step == 2
    assert publisher.versions == [(1, 0), (2, 1), (3, 2)]  # 4 batches, 2 steps: no second version of a step


def test_the_last_version_carries_the_final_dense_weights_when_the_cadence_ends_on_the_last_step(tmp_path: Path) -> None:
    """The cadence publishes at the last step (4) without dense weights (not a dense_every-th publish): train end
    adds a version of that step with them. It used to skip it (a version of that step existed), and a server kept
    the dense layers of the snapshot at step 0."""
    import lightning.pytorch as pl

    from lightrec.distributed.deltas import DeltaReader
    from lightrec.lightning import DeltaPublisher, RecStrategy
    from tests.lightning.toy import ToyDLRM, toy_data

    publisher = DeltaPublisher(tmp_path / "publish", every_n_steps=2, every_seconds=None, dense_every=3, keep=None,
                               background=False)  # fmt: skip
    module = ToyDLRM(dense_optimizer="sgd", dense_lr=0.1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, strategy=RecStrategy(), max_steps=4, num_sanity_val_steps=0,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[publisher], default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(module, datamodule=toy_data(batch_size=32, num_train_batches=4))
    assert publisher.versions == [(1, 0), (2, 2), (3, 4), (4, 4)]
    reader = DeltaReader(tmp_path / "publish")
    assert [reader.manifest(v).dense for v in (1, 2, 3, 4)] == [True, False, False, True]
    trained = module.model.state_dict()
    state = reader.state(4)
    assert state.dense and all(torch.equal(value, trained[key].float()) for key, value in state.dense.items())


class _Seen(dict):  # what the fit's tracker was, for after the fit
    pass


def _failing_module(seen: _Seen, fail_at: int) -> Any:
    from tests.lightning.toy import ToyDLRM

    class Failing(ToyDLRM):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            seen["tracker"] = self.trainer.strategy.dmp.get_delta_tracker()
            seen["dmp"] = self.trainer.strategy.dmp
            if batch_idx == fail_at:
                raise RuntimeError(f"boom at batch {fail_at}")
            return super().training_step(batch, batch_idx)

    return Failing(dense_optimizer="sgd", dense_lr=0.1)


@pytest.mark.parametrize("background", [True, False])
def test_an_exception_stops_the_publish_thread_and_the_tracker_the_callback_built(tmp_path: Path,
                                                                                  background: bool) -> None:  # fmt: skip
    import lightning.pytorch as pl

    from lightrec.lightning import DeltaPublisher, RecStrategy
    from lightrec.lightning.callbacks.delta_publisher import CONSUMER
    from tests.lightning.toy import toy_data

    publisher = DeltaPublisher(tmp_path / "publish", every_n_steps=1, keep=None, background=background)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, strategy=RecStrategy(), max_steps=5, num_sanity_val_steps=0,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[publisher], default_root_dir=str(tmp_path),
    )  # fmt: skip
    seen = _Seen()
    module = _failing_module(seen, fail_at=2)
    data = toy_data(batch_size=32, num_train_batches=5)
    with pytest.raises(RuntimeError, match="boom at batch 2"):
        trainer.fit(module, datamodule=data)
    assert [t.name for t in threading.enumerate() if t.name == THREAD] == []
    tracker = seen["tracker"]
    assert tracker.closed and seen["dmp"].get_delta_tracker() is None  # a later fit builds a live one
    tracker.get_unique_ids(CONSUMER)  # what was recorded before the exception
    module.train()
    for batch in list(data.train_dataloader())[:3]:  # the model trains on elsewhere: nothing is kept
        module.model(batch.dense_features, batch.sparse_features).sum().backward()
    assert all(ids.numel() == 0 for ids in tracker.get_unique_ids(CONSUMER).values())


def _rank_with_publisher(rank: int, world_size: int, port: int, victim: int, how: str, tmp: str, reports: Any) -> None:
    """tests/lightning/test_rank_failure.py's rank, with a DeltaPublisher writing every step: the
    victim SIGKILLs itself at a batch start; the survivor reports its publish threads and tracker."""
    set_torchrun_env(rank, world_size, port)
    try:
        import os
        import signal
        from datetime import timedelta

        import lightning.pytorch as pl

        from lightrec.lightning import DeltaPublisher, RecStrategy
        from tests.lightning.toy import ToyDLRM, toy_data

        torch.set_num_threads(1)
        seen: dict[str, Any] = {}

        class KillHere(pl.Callback):
            def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
                seen["tracker"] = trainer.strategy.dmp.get_delta_tracker()
                if batch_idx == 2 and trainer.global_rank == victim:
                    reports.put((rank, "killing", "", time.monotonic()))
                    time.sleep(0.5)  # let the queue's feeder thread flush before dying
                    os.kill(os.getpid(), signal.SIGKILL)

        trainer = pl.Trainer(
            accelerator="cpu", devices=world_size, max_steps=8, num_sanity_val_steps=0, limit_val_batches=0,
            strategy=RecStrategy(timeout=timedelta(seconds=15),
                                 fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1}),
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[KillHere(), DeltaPublisher(Path(tmp) / "publish", every_n_steps=1, keep=None)],
            default_root_dir=tmp,
        )  # fmt: skip
        module = ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1)
        try:
            trainer.fit(module, datamodule=toy_data(batch_size=32, num_train_batches=16 * world_size))
            status = "finished"
        except Exception as exc:  # noqa: BLE001 - the survivor's state after its failed fit is the result
            status = f"raised {type(exc).__name__}"
        threads = [t.name for t in threading.enumerate() if t.name == THREAD]
        reports.put((rank, status, repr({"threads": threads, "tracker_closed": seen["tracker"].closed}),
                     time.monotonic()))  # fmt: skip
    except BaseException as exc:  # noqa: BLE001 - reported, not lost in the child
        reports.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", time.monotonic()))


@pytest.mark.slow  # a 2-rank fit and a SIGKILL (~7 s); the single-process case above stays in the default run
def test_a_killed_peer_leaves_the_survivor_no_publish_thread_and_no_recording_tracker(tmp_path: Path) -> None:
    import ast

    from tests.lightning.test_rank_failure import _launch

    run = _launch(2, 1, "kill", str(tmp_path), target=_rank_with_publisher)
    assert run["killed_at"] is not None, run
    status, text, _ = run["reports"][0]
    assert status.startswith("raised"), (status, text)
    assert ast.literal_eval(text) == {"threads": [], "tracker_closed": True}, text
    assert run["had_to_kill"] == [] and run["exitcodes"][0] == 0, run  # the survivor exited by itself
