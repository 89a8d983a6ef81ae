"""Resume through ``lightrec run`` on 2 real ranks with Parquet data: a run stopped mid-epoch by
``max_steps`` and resumed with ``--ckpt_path`` logs, step for step, the losses of the uninterrupted run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.parquet.test_resume import write_rows

SMALL = ["--devices", "2", "--recipe.export=false", "--recipe.test_after_fit=false", "--trainer.log_every_n_steps=1",
         "--trainer.limit_val_batches=0", "--trainer.enable_model_summary=false", "--data", "parquet",
         "--data.label", "label", "--data.dense", "[int_*]", "--data.batch_size", "32", "--data.shuffle", "true"]  # fmt: skip


def _run(root: Path, *args: str) -> None:
    from tests.multiprocess import free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
    cmd = [sys.executable, "-m", "lightrec.cli", "run", "dlrm", *SMALL, "--data.path", str(root / "data"),
           f"--trainer.logger.init_args.save_dir={root}", *args]  # fmt: skip
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]


def _losses(version: Path) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(version), size_guidance={"scalars": 0}).Reload()
    return {e.step: e.value for e in events.Scalars("train/loss")}


@pytest.mark.slow
def test_lightrec_run_resumes_parquet_data_mid_epoch(tmp_path: Path) -> None:
    write_rows(tmp_path / "data")  # 270 rows: 4 steps of 2 x 32 per epoch
    logs = tmp_path / "dlrm"
    _run(tmp_path, "--trainer.max_epochs=2")  # version_0
    _run(tmp_path, "--trainer.max_steps=3")  # version_1: stops inside epoch 0
    last = logs / "version_1" / "checkpoints" / "last.ckpt"
    _run(tmp_path, "--trainer.max_epochs=2", f"--ckpt_path={last}")  # version_2
    reference, resumed = _losses(logs / "version_0"), _losses(logs / "version_2")
    assert sorted(reference) == list(range(8))  # step k's loss is logged at k - 1
    assert resumed == {s: reference[s] for s in range(3, 8)}
