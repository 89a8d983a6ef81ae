"""The native build's turn-taking: a process killed mid-build must not make later processes wait forever.

torch marks a build in progress with a plain ``lock`` file that other processes poll; lightrec takes an
``flock`` around the build (``lightrec._native._build_turn``) and removes a ``lock`` left by a dead builder.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from lightrec import _native

_HOLDER = """
import sys, time
from pathlib import Path
from lightrec._native import _build_turn
with _build_turn(Path(sys.argv[1])):
    (Path(sys.argv[1]) / "lock").write_text("")  # what torch writes while it builds
    print("holding", flush=True)
    time.sleep(120)
"""


def test_a_lock_file_left_by_a_killed_build_is_removed(tmp_path: Path) -> None:
    (tmp_path / "lock").write_text("")
    with _native._build_turn(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_the_turn_waits_for_a_live_holder_and_is_free_once_it_is_killed(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        waiter = subprocess.Popen(
            [sys.executable, "-c", "import sys; from pathlib import Path; from lightrec._native import _build_turn\n"
             "with _build_turn(Path(sys.argv[1])): print('turn', flush=True)", str(tmp_path)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.0)
        assert waiter.poll() is None, "took the turn while a live build held it"
        holder.send_signal(signal.SIGKILL)  # dies mid-build, leaving torch's lock file behind
        out, _ = waiter.communicate(timeout=60)
        assert out.strip() == "turn"
        assert not (tmp_path / "lock").exists()
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_the_build_folder_follows_torch_extensions_dir(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = _native._build_directory()
    assert directory.parent.parent == tmp_path and directory.name.startswith("lightrec_native-")
    assert directory.parent.name.startswith(f"py{sys.version_info.major}{sys.version_info.minor}_")


def test_each_environment_and_checkout_builds_in_its_own_folder(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """Two virtual environments (or checkouts) sharing one folder made torch rebuild it in turn: the
    folder is keyed by torch's install and lightrec's sources, the same for the same pair."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    here = _native._build_directory()
    assert _native._build_directory() == here
    other_tree = tmp_path / "other_checkout" / "csrc"
    other_tree.mkdir(parents=True)
    monkeypatch.setattr(_native, "_CSRC", other_tree)
    assert _native._build_directory() != here
    assert _native._build_directory().parent == here.parent
