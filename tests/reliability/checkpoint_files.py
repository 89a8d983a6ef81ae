"""Helpers of the checkpoint reliability tests: files that would run code, damaged files, re-signed manifests."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]


class WritesMarker:
    """Unpickling this object opens (creates) ``marker`` -- what a malicious checkpoint could do instead."""

    def __init__(self, marker: str | os.PathLike) -> None:
        self.marker = os.fspath(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def poison(path: str | os.PathLike, marker: str | os.PathLike) -> None:
    """Rewrite the ``torch.save`` file ``path`` with an object that writes ``marker`` when unpickled."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    state["payload"] = WritesMarker(marker)
    torch.save(state, path)


def resign(folder: str | os.PathLike, name: str) -> None:
    """Update ``manifest.json`` for a changed file, as an attacker who rewrites a checkpoint would."""
    manifest_path = Path(folder) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    data = (Path(folder) / name).read_bytes()
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest_path.write_text(json.dumps(manifest))


def save_folder(path: str | os.PathLike, step: int, extra: dict[str, Any] | None = None) -> None:
    """A small sharded checkpoint (one rank, a linear layer) whose ``meta.pt`` records ``step``."""
    from lightrec.distributed.checkpoint import save_sharded_checkpoint

    torch.manual_seed(step)
    layer = torch.nn.Linear(64, 64)
    # a scheduler state goes to the rank's shard file, so shards of different saves differ too
    checkpoint = {"state_dict": layer.state_dict(), "step": step, "lr_schedulers": [{"last_epoch": step}]}
    save_sharded_checkpoint(path, {**checkpoint, **(extra or {})}, layer)


def saved_step(path: str | os.PathLike) -> int:
    from lightrec.distributed.checkpoint import open_checkpoint

    return int(open_checkpoint(path).meta["step"])


def run_python(code: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter at the repository root (imports ``tests`` and ``lightrec``).

    A fit in ``code`` binds the port ``STANDALONE_PORT`` names, one below the ephemeral range picked
    here (a port the OS picks -- Lightning's ``bind(0)`` -- was taken before its store bound it twice
    in full-suite runs: EADDRINUSE), and never inherits a launch's ``MASTER_PORT`` or rank."""
    from tests.multiprocess import free_port

    env = dict(os.environ, PYTHONPATH=str(REPO), STANDALONE_PORT=str(free_port()))
    for launched in ("MASTER_PORT", "MASTER_ADDR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        env.pop(launched, None)  # a one-process fit of its own, never a rank of someone else's group
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


TOY_SAVE = """
import sys, lightning.pytorch as pl
from lightrec.lightning import RecStrategy
from lightrec.distributed.checkpoint import consolidate_checkpoint
from tests.lightning.toy import ToyDLRM, toy_data
out = sys.argv[1] if len(sys.argv) > 1 else {out!r}
trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2, strategy=RecStrategy(), logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=out)
trainer.fit(ToyDLRM(device="meta", dense_optimizer="sgd"), datamodule=toy_data())
trainer.save_checkpoint(out + "/sharded.ckpt")
consolidate_checkpoint(out + "/sharded.ckpt", out + "/full.ckpt")
plain = pl.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, default_root_dir=out)
plain.fit(ToyDLRM(dense_optimizer="sgd"), datamodule=toy_data())
plain.save_checkpoint(out + "/lightning.ckpt")
"""
