"""`lightrec consolidate` / `cp` and the `lightrec` entry point on the paths a new user can hit.

A checkpoint a killed save left between its renames (docs/checkpoints.md, "Crash-safe"), a
checkpoint folder missing its meta.pt, a file where `lightrec cp` wants a folder, an interrupted
copy, and output piped into a reader that leaves (`lightrec ls | head`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightrec.cli.app import main
from lightrec.distributed.checkpoint import consolidate_checkpoint, load_file


def _tiny_checkpoint(folder: Path) -> None:
    """A one-rank sharded checkpoint folder of one small table."""
    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
    from lightrec.distributed.checkpoint import save_sharded_checkpoint

    ebc = EmbeddingBagCollection(
        [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10, feature_names=["f"])]
    )
    save_sharded_checkpoint(str(folder), {"state_dict": ebc.state_dict()}, ebc)


def test_consolidate_reads_the_checkpoint_a_save_killed_between_its_renames_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.ckpt"
    _tiny_checkpoint(good)
    # killed between rename 1 and 2: <path> missing, <path>.old-<run> and a complete <path>.tmp-<run>
    path = tmp_path / "last.ckpt"
    shutil.copytree(good, tmp_path / "last.ckpt.old-run1")
    shutil.copytree(good, tmp_path / "last.ckpt.tmp-run1")
    out = tmp_path / "full.ckpt"
    assert main(["consolidate", str(path), str(out)]) == 0, capsys.readouterr().err
    expected = consolidate_checkpoint(good)["state_dict"]
    got = load_file(out)["state_dict"]
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_consolidate_names_the_missing_meta_file_of_an_incomplete_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "last.ckpt"
    _tiny_checkpoint(folder)
    (folder / "meta.pt").unlink()
    out = tmp_path / "full.ckpt"
    assert main(["consolidate", str(folder), str(out)]) == 1
    err = capsys.readouterr().err
    assert "no meta.pt" in err and "incomplete" in err and "no manifest.json" not in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == [folder]


def test_cp_into_an_existing_file_is_a_usage_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "notes"
    existing.write_text("mine")
    assert main(["cp", "dlrm", str(existing)]) == 2
    err = capsys.readouterr().err
    assert "'" + str(existing) + "' is a file" in err and "Traceback" not in err, err
    assert existing.read_text() == "mine"
    assert main(["cp", "dlrm", str(existing / "my.yaml")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_cp_interrupted_leaves_no_half_written_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = shutil.copyfile
    calls = []

    def copy_then_fail(source: Path, target: Path) -> None:
        calls.append(target)
        if len(calls) == 2:  # the second file: half of it written, then the disk is full
            Path(target).write_bytes(Path(source).read_bytes()[:10])
            raise OSError(28, "No space left on device")
        real(source, target)

    monkeypatch.setattr(shutil, "copyfile", copy_then_fail)
    dest = tmp_path / "my_dlrm"
    assert main(["cp", "dlrm", str(dest)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    # all or nothing: not the first file, nothing of the second, no staging folder, no dest folder
    assert not dest.exists(), sorted(p.name for p in dest.rglob("*"))
    assert [p.name for p in tmp_path.iterdir()] == []


def test_output_piped_into_a_reader_that_left_ends_without_a_traceback() -> None:
    read, write = os.pipe()
    os.close(read)  # `lightrec ls | head -0`: the reader is gone before the first line
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "lightrec.cli", "ls"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 1
