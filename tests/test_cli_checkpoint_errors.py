"""``lightrec consolidate`` / ``export`` / ``plan`` mistakes: one line, exit code 2, no traceback (issue 23).

Before: consolidating a folder that exists but is not a checkpoint printed a traceback
(``FileNotFoundError: checkpoint ... does not exist``); a missing checkpoint, a foreign file and an
output that exists exited with code 1 like a failed command; ``lightrec plan ...
--data.init_args.batch_size=-5`` buried "batch_size must be a positive int" in jsonargparse's
"Does not validate against any of the Union subtypes" block (with a "Given value: Namespace(...)" line).
The full-disk case (exit 1, one line naming the file) is in
``tests/reliability/test_checkpoint_integrity.py`` (it needs a small tmpfs).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightrec.cli import main
from tests.reliability.checkpoint_files import save_folder


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "last.ckpt"
    save_folder(path, step=3)
    return path


def test_consolidate_of_a_folder_that_is_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "version_0"
    (folder / "checkpoints").mkdir(parents=True)
    assert main(["consolidate", str(folder), str(tmp_path / "full.ckpt")]) == 2
    line = _one_error_line(capsys)
    assert line == (
        f"lightrec consolidate: error: '{folder}' is a folder but not a lightrec sharded checkpoint (it holds no "
        "meta.pt and no manifest.json); pass the checkpoint folder itself, e.g. "
        "lightning_logs/<name>/version_0/checkpoints/last.ckpt"
    )
    assert main(["export", str(folder)]) == 2
    assert "is a folder but not a lightrec sharded checkpoint" in _one_error_line(capsys)


def test_the_console_script_prints_no_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lightrec.cli", "consolidate", str(tmp_path), str(tmp_path / "full.ckpt")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "checkpoint '{source}' does not exist"),
        ("output exists", "'{out}' exists; pass --force to replace it"),
        ("output is a folder", "'{out}' is a folder; give the file to write"),
        ("output folder missing", "the folder of '{out}' does not exist; create it first"),
        ("foreign file", "'{source}' is neither a lightrec sharded checkpoint directory nor a file written by"),
    ],
)
def test_consolidate_user_mistakes_exit_2(
    case: str, expected: str, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = checkpoint, tmp_path / "full.ckpt"
    if case == "missing":
        source = tmp_path / "nope.ckpt"
    elif case == "output exists":
        out.write_text("keep me")
    elif case == "output is a folder":
        out = tmp_path / "outdir"
        out.mkdir()
    elif case == "output folder missing":
        out = tmp_path / "no" / "such" / "full.ckpt"
    elif case == "foreign file":
        source = tmp_path / "plain.ckpt"
        torch.save({"state_dict": {}}, source)
    assert main(["consolidate", str(source), str(out)]) == 2
    assert expected.format(source=source, out=out) in _one_error_line(capsys)
    if case == "output exists":
        assert out.read_text() == "keep me"
    assert main(["consolidate", str(checkpoint), str(tmp_path / "ok.ckpt")]) == 0  # the same command, fixed


def test_plan_names_a_bad_value_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "dlrm", "--data.init_args.batch_size=-5"]) == 2
    line = _one_error_line(capsys)
    assert line.endswith("dlrm.yaml: batch_size must be a positive int, got -5"), line
    assert "Does not validate" not in line and "Namespace(" not in line
