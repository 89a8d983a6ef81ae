"""``tests.multiprocess.run_ranks`` gives its ranks what a spawned process would get.

Its gloo ranks are forked from a forkserver that started once per session (for speed), so without
care they would see the environment, working folder and output of whichever test started that
server. Every distributed test relies on the ranks seeing its own ``monkeypatch.setenv`` (switches
such as ``LIGHTREC_SHM``) and ``chdir``, and a failing test shows its ranks' output.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.multiprocess import run_ranks


def _report(rank: int, world_size: int) -> tuple[str | None, str]:
    print(f"stdout of rank {rank}", flush=True)
    print(f"stderr of rank {rank}", file=sys.stderr, flush=True)
    return os.environ.get("RUN_RANKS_PROBE"), os.getcwd()


def test_ranks_see_the_tests_environment_and_folder_and_write_to_its_capture(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with capfd.disabled():  # the forkserver may start here: with other output, and the environment before the change
        run_ranks(_report, world_size=2)
    monkeypatch.setenv("RUN_RANKS_PROBE", "set by this test")
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    assert run_ranks(_report, world_size=2) == [("set by this test", str(tmp_path))] * 2
    out, err = capfd.readouterr()
    assert "stdout of rank 0" in out and "stdout of rank 1" in out, out
    assert "stderr of rank 0" in err and "stderr of rank 1" in err, err
    monkeypatch.delenv("RUN_RANKS_PROBE")
    assert run_ranks(_report, world_size=2)[1][0] is None
