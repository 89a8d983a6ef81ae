"""A rank killed mid-training makes the job fail with a clear error, within the process-group timeout.

``tests/multiprocess.run_ranks`` initialises the process group itself (with its own timeout) and
reports the first rank's failure, so it cannot show what *RecStrategy* does when a peer dies: here
a small launcher starts the ranks with only the torchrun environment variables, so
``RecStrategy(timeout=...)`` creates the process group, and then watches each process separately.
One rank SIGKILLs itself at the start of a training step (no Python cleanup, like an OOM kill);
the survivor must raise out of ``Trainer.fit`` -- not hang -- within the process-group timeout of
the kill, and its process must then exit by itself.

With gloo a killed peer closes its sockets, so the survivor's next collective fails at once
("Connection closed by peer"). A peer that is alive but stuck (here: SIGSTOP) closes nothing;
then the survivor's collective must time out after ``RecStrategy(timeout=...)`` (slow tests): at
the start of a step (the survivor waits in an embedding all-to-all), and inside the dense
backward (the survivor waits for DDP's gradient all-reduce, on the group DistributedModelParallel
creates for DDP, which inherits the strategy's timeout).
"""

from __future__ import annotations

import os
import queue as queue_module
import signal
import time
import traceback
from typing import Any

import pytest
import torch.multiprocessing as mp

from tests.multiprocess import free_port, set_torchrun_env

PG_TIMEOUT_S = 15  # RecStrategy(timeout=...)
KILL_AT_BATCH = 2
SLACK_S = 10  # teardown after the failing collective, on a loaded machine
# whole run: spawn + imports + set-up (~10 s quiet) + timeout + teardown. Generous: on a loaded 2-core
# machine a 2-rank fit outran 75 s and its reports were dropped unread (the ranks then exited 0), which
# the tests took for a hang; a real hang never reports, so a longer bound loses nothing
BOUND_S = 180 + PG_TIMEOUT_S


def _rank_main(rank: int, world_size: int, port: int, victim: int, how: str, tmp: str, reports: Any) -> None:
    set_torchrun_env(rank, world_size, port)
    try:
        from datetime import timedelta

        import lightning.pytorch as pl
        import torch

        from lightrec.lightning import RecStrategy
        from tests.lightning.toy import ToyDLRM, toy_data

        torch.set_num_threads(1)

        class FailHere(pl.Callback):  # kill or stop this rank at batch KILL_AT_BATCH
            def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:  # noqa: ANN001
                if batch_idx == KILL_AT_BATCH and trainer.global_rank == victim:
                    # CLOCK_MONOTONIC is one clock for every process of the host
                    reports.put((rank, "killing", "", time.monotonic()))
                    time.sleep(0.5)  # let the queue's feeder thread flush before dying
                    if how == "stop_in_backward":
                        # stop while the dense backward runs: WORLD collectives of the step may be
                        # done, so the survivor waits for the dense gradients' all-reduce (DDP's group)
                        dense = dict(module.named_parameters())["model.dense_arch.model._mlp.0._linear.weight"]
                        dense.register_hook(lambda grad: os.kill(os.getpid(), signal.SIGSTOP))
                        return
                    os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)

        trainer = pl.Trainer(
            accelerator="cpu", devices=world_size, max_steps=8, num_sanity_val_steps=0, limit_val_batches=0,
            strategy=RecStrategy(timeout=timedelta(seconds=PG_TIMEOUT_S),
                                 fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1}),
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[FailHere()], default_root_dir=tmp,
        )  # fmt: skip
        module = ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1)
        trainer.fit(module, datamodule=toy_data(batch_size=32, num_train_batches=16 * world_size))
        reports.put((rank, "finished", "", time.monotonic()))
    except BaseException as exc:  # noqa: BLE001 - the parent checks what the survivor raised
        text = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        reports.put((rank, "raised", text, time.monotonic()))


def _launch(world_size: int, victim: int, how: str, tmp: str, target: Any = _rank_main) -> dict[str, Any]:
    """Start the ranks and wait (at most ``BOUND_S``) for the victim's kill and every survivor's report.

    Returns ``{"reports": {rank: (status, text, monotonic time)}, "killed_at": time | None,
    "exitcodes": [...], "had_to_kill": [ranks the launcher killed because they were still alive]}``.
    """
    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=target, args=(r, world_size, port, victim, how, tmp, reports), daemon=True)
        for r in range(world_size)
    ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    final: dict[int, tuple[str, str, float]] = {}
    killed_at: float | None = None
    survivors = set(range(world_size)) - {victim}
    had_to_kill: list[int] = []
    try:
        while not survivors <= set(final) and time.monotonic() - t0 < BOUND_S:
            try:
                rank, status, text, at = reports.get(timeout=1.0)
            except queue_module.Empty:
                continue
            if status == "killing":
                killed_at = at
            else:
                final[rank] = (status, text, at)
        for r in sorted(survivors):
            procs[r].join(timeout=SLACK_S)  # a survivor that raised must also exit by itself
    finally:
        for r, p in enumerate(procs):
            if p.is_alive():
                if r != victim:
                    had_to_kill.append(r)
                p.kill()  # SIGKILL also ends a stopped process
                p.join(timeout=5)
    return {
        "reports": final,
        "killed_at": killed_at,
        "exitcodes": [p.exitcode for p in procs],
        "had_to_kill": had_to_kill,
    }


def _check_survivor_failed(
    run: dict[str, Any], victim: int, within_s: float, messages: tuple[str, ...]
) -> None:
    survivor = 1 - victim
    assert run["killed_at"] is not None, (
        f"rank {victim} never reached batch {KILL_AT_BATCH}: {run['reports']}"
    )
    assert survivor in run["reports"], (
        f"rank {survivor} neither finished nor raised within {BOUND_S} s (hang)"
    )
    status, text, at = run["reports"][survivor]
    assert status == "raised", f"rank {survivor} finished training although rank {victim} was stopped"
    first_line = text.splitlines()[0]
    seconds = at - run["killed_at"]
    print(f"rank {survivor} raised {seconds:.1f} s after rank {victim} was stopped: {first_line}")
    assert seconds < within_s, (seconds, first_line)
    assert any(m in text for m in messages), text  # the error says what happened to the peer
    assert run["had_to_kill"] == [], f"rank {survivor} raised but its process did not exit (hung in teardown)"
    assert run["exitcodes"][survivor] == 0


# ~11 s each: the default suite keeps rank 0's death (the launcher's own rank); a worker's is the slow suite's
@pytest.mark.parametrize(
    "victim", [pytest.param(1, marks=pytest.mark.slow), 0], ids=["worker-rank-killed", "rank0-killed"]
)
def test_killed_rank_fails_the_job_instead_of_hanging(tmp_path, victim: int) -> None:  # noqa: ANN001
    run = _launch(2, victim, "kill", str(tmp_path))
    assert run["exitcodes"][victim] == -signal.SIGKILL, run["exitcodes"]
    # gloo notices the closed sockets, the shared-memory transport the dead process: far quicker than the timeout
    _check_survivor_failed(
        run,
        victim,
        within_s=PG_TIMEOUT_S,
        messages=("Connection closed by peer", "of the shared-memory transport died"),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "where",
    [
        "stop",  # at the start of a step: the survivor waits in the next all-to-all (WORLD group)
        "stop_in_backward",  # the survivor waits in DDP's gradient all-reduce (DMP's DDP group)
    ],
)
def test_stuck_rank_fails_the_job_after_the_process_group_timeout(tmp_path, where: str) -> None:  # noqa: ANN001
    run = _launch(2, 1, where, str(tmp_path))
    _check_survivor_failed(run, 1, within_s=PG_TIMEOUT_S + SLACK_S, messages=("Timed out", "timed out"))
