"""Deliver 2: a save SIGKILLed at any point leaves a complete checkpoint that ``load`` finds.

A child process saves step 1 normally, then saves step 2 and SIGKILLs itself (a real signal, no
Python clean-up) at a chosen point of that save. The parent then loads the path: before the new
folder is complete it must get step 1, after that step 2 -- never nothing, never a mix. The next
save must finish the interrupted one's renames and delete its temp folders.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.lightning.test_rank_failure import SLACK_S, _check_survivor_failed, _launch
from tests.reliability.checkpoint_files import run_python, save_folder, saved_step
from tests.reliability.torchrun_rank import run_as_torchrun_rank

CHILD = """
import os, signal, sys
from lightrec.distributed.checkpoint import files, integrity
from tests.reliability.checkpoint_files import save_folder

path, point = sys.argv[1], sys.argv[2]
save_folder(path, step=1)

def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)

if point == "while-writing-shard":
    write = integrity.HashingWriter.write
    def write_then_die(self, data):
        write(self, data)
        if self.bytes > 512:
            die()
    integrity.HashingWriter.write = write_then_die
elif point == "before-manifest":
    files.write_manifest = lambda *a, **k: die()
else:
    replace, calls = os.replace, []
    def replace_then_die(src, dst):
        replace(src, dst)
        calls.append(dst)
        if len(calls) == {"after-old-moved-aside": 1, "after-new-moved-in": 2}[point]:
            die()
    os.replace = replace_then_die
save_folder(path, step=2)
print("not killed")
"""


@pytest.mark.parametrize(
    ("point", "expected_step"),
    [
        ("while-writing-shard", 1),
        ("before-manifest", 1),
        ("after-old-moved-aside", 2),  # <path> missing: the complete .tmp-<run> is the checkpoint
        ("after-new-moved-in", 2),
    ],
)
def test_killed_save_leaves_a_loadable_checkpoint(tmp_path: Path, point: str, expected_step: int) -> None:
    from lightrec.distributed.checkpoint import is_sharded_checkpoint, load_sharded_checkpoint

    path = tmp_path / "last.ckpt"
    done = run_python(CHILD.replace("sys.argv[1], sys.argv[2]", f"{str(path)!r}, {point!r}"))
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr[-2000:])
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name != "last.ckpt")
    assert leftovers, "the kill left no trace: it did not hit the save"

    assert is_sharded_checkpoint(path)
    assert saved_step(path) == expected_step
    assert "state_dict" in load_sharded_checkpoint(path, __import__("torch").nn.Linear(64, 64))

    save_folder(path, step=3)  # the next save finishes what was interrupted and cleans up
    assert saved_step(path) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


# ---------------------------------------------------------------- a rank killed in a 2-rank save
def _saving_rank(
    rank: int, world_size: int, port: int, victim: int, how: str, tmp: str, reports: Any
) -> None:
    run_as_torchrun_rank(rank, world_size, port, reports, lambda: _save_twice(rank, victim, tmp, reports))


def _save_twice(rank: int, victim: int, tmp: str, reports: Any) -> str:
    import os
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from lightrec.distributed.checkpoint import integrity

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    path = os.path.join(tmp, "last.ckpt")
    save_folder(path, step=1)
    if rank == victim:
        write = integrity.HashingWriter.write

        def write_then_die(self: Any, data: Any) -> int:
            n = write(self, data)
            if self.bytes > 512:
                reports.put((rank, "killing", "", time.monotonic()))
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGKILL)
            return n

        integrity.HashingWriter.write = write_then_die  # type: ignore[method-assign]
    save_folder(path, step=2)
    return "saved"


def test_rank_killed_while_saving_fails_the_save_on_the_others_and_keeps_the_old_checkpoint(
    tmp_path: Path,
) -> None:
    run = _launch(2, 1, "kill", str(tmp_path), target=_saving_rank)
    _check_survivor_failed(run, 1, within_s=SLACK_S, messages=("its peer, rank 1,",))
    first = run["reports"][0][1].splitlines()[0]
    assert first.startswith("CollectiveError: all_gather of a checkpoint save's outcome"), first
    assert saved_step(tmp_path / "last.ckpt") == 1  # the old checkpoint, complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # rank 0 removed the partial save
