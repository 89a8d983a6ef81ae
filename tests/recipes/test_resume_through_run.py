"""Resume through ``lightrec run`` on 2 real ranks: LightningCLI, the recipe's RecModule and DataModule,
``RankDataLoader`` and the shipped config's ``ModelCheckpoint`` (issue 23).

The issue's commands, made small (8 steps per epoch instead of 40):
``lightrec run dlrm --devices 2 ...`` ends epoch 0 and writes ``last.ckpt``; ``lightrec run dlrm
--devices 2 ... --trainer.max_epochs 2 --trainer.max_steps 14 --ckpt_path .../last.ckpt`` printed
"Restored all states", showed ``Epoch 1: 0/8`` and stopped ("max_epochs=2 reached") with a
checkpoint at step 8. Now it trains steps 9..14 (``Epoch 1: 6/8``); so do the resumes without
``max_steps`` and those of a run stopped mid-epoch by ``max_steps``, and every resumed step's loss
(TensorBoard, ``log_every_n_steps=1``) equals the uninterrupted run's. The resumed console holds no
"dirpath has changed" warning, and says where the run writes instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

STEPS_PER_EPOCH = 8
SMALL = ["--devices", "2", "--recipe.export=false", "--recipe.test_after_fit=false", "--trainer.log_every_n_steps=1",
         "--trainer.limit_val_batches=1", "--trainer.enable_model_summary=false",
         "--data.init_args.num_embeddings_cap=200", "--data.init_args.batch_size=32",
         f"--data.init_args.num_train_batches={2 * STEPS_PER_EPOCH}"]  # fmt: skip


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    from tests.multiprocess import free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
    cmd = [sys.executable, "-m", "lightrec.cli", "run", "dlrm", *SMALL, f"--trainer.logger.init_args.save_dir={root}",
           *args]  # fmt: skip
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _losses(version: Path) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(version), size_guidance={"scalars": 0}).Reload()
    return {e.step: e.value for e in events.Scalars("train/loss")}


def _global_step(version: Path) -> int:
    from lightrec.distributed.checkpoint import load_file

    return int(load_file(version / "checkpoints" / "last.ckpt" / "meta.pt")["global_step"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("resume")
    logs = root / "dlrm"
    out: dict[str, Any] = {"uninterrupted": _run(root, "--trainer.max_epochs=2")}  # version_0
    out["A"] = _run(root)  # version_1: the config's max_epochs 1, last.ckpt at the end of epoch 0
    out["B"] = _run(root, "--trainer.max_steps=5")  # version_2: stopped inside epoch 0
    resumes = {
        "A + max_steps": ("version_1", ["--trainer.max_epochs=2", "--trainer.max_steps=14"]),
        "A, epochs only": ("version_1", ["--trainer.max_epochs=2"]),
        "B + max_steps": ("version_2", ["--trainer.max_epochs=2", "--trainer.max_steps=14"]),
        "B, epochs only": ("version_2", ["--trainer.max_epochs=2"]),
    }
    for k, (name, (source, args)) in enumerate(resumes.items()):
        ckpt = logs / source / "checkpoints" / "last.ckpt"
        out[name] = _run(root, *args, f"--ckpt_path={ckpt}")
        out[name + " version"] = logs / f"version_{3 + k}"
    out["reference"] = _losses(logs / "version_0")
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "steps"),
    [("A + max_steps", range(9, 15)), ("A, epochs only", range(9, 17)), ("B + max_steps", range(6, 15)),
     ("B, epochs only", range(6, 17))],  # fmt: skip
)
def test_resumed_run_trains_the_remaining_steps_like_an_uninterrupted_one(runs: dict, name: str, steps: range) -> None:
    reference = runs["reference"]
    assert len(reference) == 2 * STEPS_PER_EPOCH
    version = runs[name + " version"]
    losses = _losses(version)
    first_logged = min(reference)  # Lightning logs step k's loss at k - 1
    assert sorted(losses) == [s + first_logged - 1 for s in steps], name
    assert losses == {s: reference[s] for s in losses}, name  # bit for bit: the same batches and state
    assert _global_step(version) == steps[-1]
    console = runs[name].stdout + runs[name].stderr
    assert "The dirpath has changed" not in console
    assert f"Resuming from {version.parent / ('version_1' if name.startswith('A') else 'version_2')}" in console
    assert f"this run writes to {version}" in console


@pytest.mark.slow
def test_the_issue_command_shows_epoch_1_at_6_of_8_and_stops_at_max_steps(runs: dict) -> None:
    console = runs["A + max_steps"].stdout + runs["A + max_steps"].stderr
    bars = re.findall(r"Epoch 1:\s+\d+%\|[^|]*\|\s*(\d+)/(\d+)", console.replace("\r", "\n"))
    assert bars and bars[-1] == ("6", str(STEPS_PER_EPOCH)), bars[-3:]
    assert "`Trainer.fit` stopped: `max_steps=14` reached." in console
    assert "max_epochs=2` reached" not in console
