"""A new user's first hour with ``lightrec`` (issue 16): one-line usage errors with exit 2 before any
rank starts, "did you mean", the devices/cores warning, and Lightning habits that work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightrec.cli import main
from lightrec.lightning.recipe.checks import RequestedDevices, warn_if_devices_exceed_cores
from lightrec.recipes import CONFIGS_DIR
from tests.test_cli import TINY

# (arguments after `lightrec run`, text the one error line must hold)
MISTAKES = [
    (["dlrm", "--data.init_args.batch_size", "0"], "batch_size must be a positive int, got 0"),
    (["dlrm", "--trainer.max_epohcs", "2"], "--trainer.max_epohcs is not an option (did you mean '--trainer.max_epochs'?)"),
    (["dlrm", "--data.init_args.batch_sise", "2"], "(did you mean '--data.init_args.batch_size'?)"),
    (["dlrm", "--model.embeding_dim", "8"], "(did you mean '--model.embedding_dim'?)"),
    (["dlrm", "--config", "dlrm_crteo"], "(did you mean 'dlrm_criteo'?); valid configs: deepfm_movielens, dlrm,"),
    (["dlrm", "--ckpt_path", "nope/last.ckpt"], "--ckpt_path 'nope/last.ckpt' does not exist"),
    (["dlrm", "--trainer.max_epochs", "x"], "--trainer.max_epochs: Expected a <class 'int'>"),
    (["two_tower", "--data.init_args.data_dir", "data/ml-100k"], "https://files.grouplens.org/datasets/movielens/ml-100k.zip"),
    (["dlrm", "--config", "dlrm_criteo"], "https://go.criteo.net/"),  # no preprocessed Criteo here
]  # fmt: skip


@pytest.mark.parametrize(("args", "expected"), MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_user_mistakes_are_one_line_with_exit_2_before_any_rank_starts(
    args: list[str],
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", *args]) == 2  # the default configs start 2 ranks: none was started
    captured = capfd.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0]
    assert not list(tmp_path.iterdir())  # no logs, no checkpoints: nothing ran


@pytest.mark.slow  # ~12 s, a fresh interpreter: the mistakes above are the same code path in process
def test_the_console_script_says_it_in_one_line_too(tmp_path: Path) -> None:
    """The real command (a fresh process, 2 ranks by default): 1 line, exit 2 (was 82 lines, exit 1)."""
    cmd = [sys.executable, "-m", "lightrec.cli", "run", "dlrm", "--data.init_args.batch_size", "0"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 2
    assert _without_fbgemm_warning((done.stdout + done.stderr).strip().splitlines()) == [
        "error: batch_size must be a positive int, got 0"
    ]


def _without_fbgemm_warning(lines: list[str]) -> list[str]:
    """Drop lightrec's one FbgemmUnavailableWarning (and the source line Python prints under it).

    It is expected where an fbgemm build for another torch is installed (e.g. fbgemm-gpu-cpu 1.8.0
    beside torch 2.11), and says so once; everything else must still be the one error line.
    """
    out: list[str] = []
    skip_source_line = False
    for line in lines:
        if "FbgemmUnavailableWarning" in line:
            skip_source_line = True
            continue
        if skip_source_line and line.startswith(" "):
            skip_source_line = False
            continue
        skip_source_line = False
        out.append(line)
    return out


def test_unknown_recipe_suggests_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["run", "two_towr"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "unknown recipe 'two_towr' (did you mean 'two_tower'?)" in err[1]


def test_more_cpu_devices_than_cores_warns() -> None:
    cores = os.cpu_count() or 1
    line = warn_if_devices_exceed_cores(RequestedDevices(cores + 2, "cpu"))
    assert line is not None and f"--devices {cores + 2}" in line and f"{cores} cores" in line
    assert warn_if_devices_exceed_cores(RequestedDevices(str(cores + 2), "cpu")) is not None
    assert warn_if_devices_exceed_cores(RequestedDevices(cores, "cpu")) is None
    assert warn_if_devices_exceed_cores(RequestedDevices(cores + 2, "gpu")) is None  # GPUs are not cores


def test_bare_command_prints_help_and_version_names_the_stack(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lightrec") and "lightrec ls" in out
    assert main(["--version"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("lightrec ") and f"torch {torch.__version__}" in line and "lightning " in line


def test_cp_to_a_yaml_file_writes_the_default_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "x.yaml"
    assert main(["cp", "dlrm", str(target)]) == 0
    assert target.is_file() and target.read_text() == (CONFIGS_DIR / "dlrm.yaml").read_text()
    assert f"lightrec run dlrm --config {target}" in capsys.readouterr().out
    assert main(["cp", "dlrm", str(target)]) == 2  # never overwrites


def test_short_config_flag_replaces_the_shipped_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`-c my.yaml` works like `--config my.yaml`: the shipped dlrm.yaml is not loaded underneath."""
    mine = tmp_path / "my.yaml"
    mine.write_text("model:\n  embedding_dim: 8\ndata:\n  class_path: lightrec.data.SyntheticCriteo\n")
    for flag in ("-c", "--config"):
        assert main(["run", "dlrm", flag, str(mine), "--print_config"]) == 0
        config = capsys.readouterr().out
        assert "embedding_dim: 8" in config
        assert "devices: auto" in config and "strategy: lightrec" not in config  # dlrm.yaml says 2 / lightrec
    # The shortcuts still override a config given with -c (they are placed after it).
    assert main(["run", "dlrm", "-c", str(mine), "--devices", "1", "--print_config"]) == 0
    assert "devices: 1" in capsys.readouterr().out.replace("'", "")


def test_run_accepts_a_recipe_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cp", "dlrm", str(tmp_path / "mine")]) == 0
    monkeypatch.chdir(tmp_path)
    argv = ["run", str(tmp_path / "mine" / "dlrm.py"), "--devices", "1", "--trainer.strategy", "auto", *TINY]
    assert main(argv) == 0
    assert "lightrec recipe finished" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["run", str(tmp_path / "nope.py")])
    assert "recipe file" in capsys.readouterr().err
