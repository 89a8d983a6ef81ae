"""RecStrategy destroys the default process group at interpreter exit on gloo too
(``lightrec.lightning.process_group_exit``): a gloo group left to the interpreter's teardown can abort
a rank that finished training ("terminate called without an active exception", status 134)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

from lightrec.lightning import process_group_exit
from tests.multiprocess import free_port

REPO = Path(__file__).resolve().parents[2]

# Registered before the fit, so it runs after RecStrategy's handler (atexit: last in, first out) and
# sees what that handler left.
_SCRIPT = textwrap.dedent(
    """
    import atexit, os
    import torch.distributed as dist

    # Each rank writes to its own file: both ranks' prints share the pipe and can interleave mid-line.
    LOG = os.path.join(os.environ["FIT_ROOT"], f"rank{os.environ.get('LOCAL_RANK', '0')}.log")

    def _note(line):
        with open(LOG, "a") as f:
            f.write(line + "\\n")

    atexit.register(lambda: _note(f"group alive at exit: {dist.is_initialized()}"))

    import lightning.pytorch as pl
    from lightrec.lightning import RecStrategy
    from tests.lightning.toy import ToyDLRM, toy_data

    trainer = pl.Trainer(
        accelerator="cpu", devices=2, max_steps=2, num_sanity_val_steps=0, limit_val_batches=0,
        strategy=RecStrategy(), logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=os.environ["FIT_ROOT"],
    )
    trainer.fit(ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1), datamodule=toy_data(batch_size=32))
    _note(f"fitted as rank {trainer.global_rank}, backend {dist.get_backend()}")
    """
)


def test_two_gloo_ranks_leave_no_process_group_to_the_interpreters_teardown(tmp_path: Path) -> None:
    script = tmp_path / "fit.py"
    script.write_text(_SCRIPT)
    env = {
        **os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "FIT_ROOT": str(tmp_path),
    }  # fmt: skip
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):  # the launcher sets them for the ranks
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        log = tmp_path / f"rank{rank}.log"
        assert log.exists(), f"rank {rank} wrote nothing:\n{done.stdout}{done.stderr}"
        assert log.read_text().splitlines() == [
            f"fitted as rank {rank}, backend gloo",
            "group alive at exit: False",
        ], done.stdout + done.stderr


def test_the_exit_handler_is_registered_once_per_process(monkeypatch) -> None:  # noqa: ANN001
    registered: list[object] = []
    monkeypatch.setattr(process_group_exit.atexit, "register", registered.append)
    monkeypatch.setattr(process_group_exit, "_registered", False)
    process_group_exit.destroy_process_groups_at_exit()
    process_group_exit.destroy_process_groups_at_exit()  # a second fit in the same process
    assert registered == [process_group_exit._destroy_process_groups]


def test_the_exit_handler_destroys_a_live_group_and_then_has_nothing_to_do(tmp_path: Path) -> None:
    if dist.is_initialized():
        pytest.skip("an earlier test in this process left its default group alive")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        process_group_exit._destroy_process_groups()
        assert not dist.is_initialized()
        process_group_exit._destroy_process_groups()  # the user destroyed it first: no error
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
