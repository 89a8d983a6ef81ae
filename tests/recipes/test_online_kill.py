"""Issue 34, Faults: a rank that dies while ``lightrec run dlrm_online`` trains resumes from the last checkpoint
with the stream position restored.

Two gloo ranks train the drifting stream through the real command line. ``KillRankAt`` (added with
``--trainer.callbacks+=``, the way the reliability tests kill a rank: SIGKILL from inside the rank, so the
step is deterministic) kills rank 1 -- the process Lightning's launcher started -- at the start of step 5,
after a ModelCheckpoint every 3 steps wrote ``last.ckpt`` at step 3 and both ranks trained step 4 past it.
Rank 0 must fail (not hang: the whole run is bounded) and the checkpoint must load; a restart from it must
train steps 3..5 with the losses of an uninterrupted 6-step run (no batch twice, none skipped).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from tests.recipes.test_online import BATCH, SMALL, _run_ranks, _scalars

CKPT_EVERY, KILL_AT_STEP, MAX_STEPS = 3, 5, 6
STEPS = (f"--trainer.max_steps={MAX_STEPS}",)
BOUND_S = 600  # the killed run: two ranks' start-up on a loaded machine + the survivor's failure


class KillRankAt(pl.Callback):
    """SIGKILLs rank ``rank`` (no Python clean-up, like an OOM kill) at the start of step ``step``."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(
        self, trainer: pl.Trainer, module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            print(f"KillRankAt: killing rank {self.rank} at step {self.step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def _killed_run(root: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    from tests.multiprocess import free_port

    repo = str(Path(__file__).resolve().parents[2])  # the ranks import this module's KillRankAt by class path
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port()), "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "lightrec.cli", "run", "dlrm_online", "--devices", "2", *SMALL[4:],
           f"--trainer.logger.init_args.save_dir={root}", *STEPS,
           "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
           "--trainer.callbacks.save_last=true", "--trainer.callbacks.save_top_k=0",
           f"--trainer.callbacks.every_n_train_steps={CKPT_EVERY}",
           f"--trainer.callbacks+={__name__}.KillRankAt", "--trainer.callbacks.rank=1",
           f"--trainer.callbacks.step={KILL_AT_STEP}"]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=BOUND_S)
    return done, time.monotonic() - start


@pytest.mark.slow
def test_a_rank_killed_while_training_online_resumes_from_the_last_checkpoint_at_the_next_batch(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "dlrm_online"
    _run_ranks(tmp_path, *STEPS)  # version_0: the uninterrupted run
    killed, seconds = _killed_run(tmp_path)  # version_1
    assert f"KillRankAt: killing rank 1 at step {KILL_AT_STEP}" in killed.stderr, killed.stderr[-4000:]
    assert killed.returncode != 0, killed.stderr[-4000:]  # rank 0 failed instead of finishing or hanging
    # whichever notices first says the dead rank: rank 0's exchange (ShmPeerError / CollectiveError naming its
    # peer) or Lightning's launcher, whose watchdog ends rank 0 when the child it started is gone
    said = ("its peer, rank 1,", "terminated with code -9")
    assert any(s in killed.stderr for s in said), killed.stderr[-4000:]
    print(
        f"rank 0 exited {killed.returncode} {seconds:.0f} s after the start; last lines:\n{killed.stderr[-1500:]}"
    )

    last = logs / "version_1" / "checkpoints" / "last.ckpt"  # RecStrategy's checkpoint is a folder
    from lightrec.distributed.checkpoint.files import read_meta, read_shards

    state = read_meta(last)  # meta.pt and every rank's shard file, verified against the manifest's checksums
    assert len(read_shards(last, 2)) == 2
    assert state["global_step"] == CKPT_EVERY
    assert (
        state["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["samples"] == CKPT_EVERY * BATCH * 2
    )  # both ranks' batches

    _run_ranks(tmp_path, *STEPS, f"--ckpt_path={last}")  # version_2
    reference, resumed = (
        _scalars(logs / "version_0", "train/loss"),
        _scalars(logs / "version_2", "train/loss"),
    )
    assert sorted(resumed) == list(range(CKPT_EVERY, MAX_STEPS))
    for step in resumed:  # the same batches on the same restored weights, id maps and optimizer state
        assert resumed[step] == pytest.approx(reference[step], rel=1e-5, abs=1e-6), step
