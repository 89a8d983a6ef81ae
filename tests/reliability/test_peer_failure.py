"""Deliver 4: a dead or stuck peer makes the others raise ``CollectiveError`` naming the collective and the rank.

Real processes launched like ``torchrun`` (``tests/lightning/test_rank_failure._launch``): two
ranks train the toy DLRM under ``RecStrategy(timeout=15 s)`` with every table data-parallel (their
gradients are all-reduced on the side process group ``data_parallel.side_group`` creates, which
used to wait torch's default 30 minutes whatever the user set). Rank 1 is SIGKILLed, or SIGSTOPped
right before that all-reduce; rank 0 must raise within the timeout plus a few seconds.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from tests.lightning.test_rank_failure import KILL_AT_BATCH, SLACK_S, _check_survivor_failed, _launch
from tests.reliability.torchrun_rank import run_as_torchrun_rank

PG_TIMEOUT_S = 15


def _rank_main(rank: int, world_size: int, port: int, victim: int, how: str, tmp: str, reports: Any) -> None:
    run_as_torchrun_rank(
        rank, world_size, port, reports, lambda: _train(rank, world_size, victim, how, tmp, reports)
    )


def _train(rank: int, world_size: int, victim: int, how: str, tmp: str, reports: Any) -> str:
    from datetime import timedelta

    import lightning.pytorch as pl
    import torch.distributed as dist

    from lightrec.distributed.planner import ParameterConstraints
    from lightrec.distributed.sharding import data_parallel
    from lightrec.lightning import RecStrategy
    from tests.lightning.toy import DIM, ToyDLRM, toy_data

    armed = {"on": False}

    class FailHere(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:  # noqa: ANN001
            if batch_idx != KILL_AT_BATCH or trainer.global_rank != victim:
                return
            if how == "kill":
                reports.put((rank, "killing", "", time.monotonic()))
                time.sleep(0.5)  # let the queue's feeder thread flush before dying
                os.kill(os.getpid(), signal.SIGKILL)
            armed["on"] = True  # "stop_in_dp_all_reduce": stop at the next table-gradient all-reduce

    all_reduce = dist.all_reduce

    class _Dist:  # what data_parallel sees as `dist`: stops the victim right before its all-reduce
        def __getattr__(self, name: str) -> Any:
            return getattr(dist, name)

        def all_reduce(self, *args: Any, **kwargs: Any) -> Any:
            if armed["on"]:
                armed["on"] = False
                reports.put((rank, "killing", "", time.monotonic()))
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGSTOP)
            return all_reduce(*args, **kwargs)

    data_parallel.dist = _Dist()  # type: ignore[assignment]
    tables = [t.name for t in toy_data().table_configs(DIM)]
    strategy = RecStrategy(
        timeout=timedelta(seconds=PG_TIMEOUT_S),
        constraints={t: ParameterConstraints(sharding_types=["data_parallel"]) for t in tables},
        fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1},
    )
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, max_steps=8, num_sanity_val_steps=0, limit_val_batches=0,
        strategy=strategy, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[FailHere()], default_root_dir=tmp,
    )  # fmt: skip
    module = ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1)
    trainer.fit(module, datamodule=toy_data(batch_size=32, num_train_batches=16 * world_size))
    return ""


def test_killed_peer_raises_collective_error_naming_the_rank(tmp_path) -> None:  # noqa: ANN001
    run = _launch(2, 1, "kill", str(tmp_path), target=_rank_main)
    _check_survivor_failed(run, 1, within_s=PG_TIMEOUT_S, messages=("its peer, rank 1,",))
    first = run["reports"][0][1].splitlines()[0]
    assert first.startswith("CollectiveError: ") and "died or closed its connection" in first, first


@pytest.mark.slow  # 20 s, 15 of them waiting for the timeout; the killed-peer test above stays in the default run
def test_stuck_peer_in_the_data_parallel_all_reduce_times_out_with_the_users_timeout(tmp_path) -> None:  # noqa: ANN001
    run = _launch(2, 1, "stop_in_dp_all_reduce", str(tmp_path), target=_rank_main)
    _check_survivor_failed(run, 1, within_s=PG_TIMEOUT_S + SLACK_S, messages=("its peer, rank 1,",))
    first = run["reports"][0][1].splitlines()[0]
    assert first.startswith("CollectiveError: all_reduce of data-parallel table gradients on rank 0"), first
    assert "got no answer within the process group's timeout (0:00:15)" in first, first
