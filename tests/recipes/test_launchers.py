"""A recipe file runs under the launchers a Lightning user reaches for: ``torchrun`` and Lightning's
``fabric run`` (``lightrec run`` and ``python recipes/X.py`` are tested in tests/test_cli.py and
tests/test_packaging.py). Two CPU ranks each, a few steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.multiprocess import free_port

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "dlrm.py"
TINY = [
    "fit",
    "--config", str(RECIPE.parent / "configs" / "dlrm.yaml"),
    "--trainer.max_steps=2",
    "--trainer.limit_val_batches=1",
    "--trainer.limit_test_batches=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--data.init_args.num_embeddings_cap=300",
    "--data.init_args.batch_size=64",
    "--recipe.export=false",
]  # fmt: skip


def _launch(command: list[str], cwd: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout + done.stderr


@pytest.mark.slow
def test_recipe_file_under_torchrun(tmp_path: Path) -> None:
    out = _launch(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         str(RECIPE), *TINY, f"--trainer.logger.init_args.save_dir={tmp_path}"],
        tmp_path,
    )  # fmt: skip
    assert out.count("lightrec recipe finished") == 1
    assert sorted(p.name for p in (tmp_path / "dlrm" / "version_0" / "checkpoints" / "last.ckpt").iterdir())[-2:] == [
        "shards-rank00000.pt", "shards-rank00001.pt",
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("devices", [2, 1])
def test_recipe_file_under_fabric_run(tmp_path: Path, devices: int) -> None:
    """``fabric run --devices N``: N processes, and the recipe's Trainer takes N (its config says 2)."""
    pytest.importorskip("click", reason="`fabric run` needs click: pip install 'lightrec[fabric]'")
    fabric = Path(sys.executable).parent / "fabric"  # Lightning's console script
    if not fabric.is_file():
        pytest.skip(f"no `fabric` command next to {sys.executable}")
    out = _launch(
        [str(fabric), "run", "--accelerator", "cpu", "--devices", str(devices), "--main-port", str(free_port()), str(RECIPE), *TINY,
         f"--trainer.logger.init_args.save_dir={tmp_path}"],
        tmp_path,
    )  # fmt: skip
    assert out.count("lightrec recipe finished") == 1
    saved = (tmp_path / "dlrm" / "version_0" / "config.yaml").read_text()
    assert f"devices: '{devices}'" in saved or f"devices: {devices}\n" in saved
    shards = sorted(p.name for p in (tmp_path / "dlrm" / "version_0" / "checkpoints" / "last.ckpt").iterdir())
    assert [s for s in shards if s.startswith("shards-")] == [f"shards-rank{r:05d}.pt" for r in range(devices)]
