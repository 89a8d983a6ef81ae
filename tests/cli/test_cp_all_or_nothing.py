"""`lightrec cp RECIPE DIR` writes the recipe and its configs all or nothing.

A failure half-way (the second file cannot be written) leaves nothing of the copy behind -- no file, no
folder it made, no staging folder -- and never removes or changes a file the user already had.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lightrec.cli import cp as cp_command
from lightrec.cli import main
from lightrec.recipes import CONFIGS_DIR, RECIPES


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _fail_second_copy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """shutil.copyfile writes half of the second file, then the disk is full."""
    real = shutil.copyfile
    calls: list[str] = []

    def copy_then_fail(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        calls.append(str(target))
        if len(calls) == 2:
            Path(target).write_bytes(Path(source).read_bytes()[:10])
            raise OSError(28, "No space left on device")
        real(source, target)

    monkeypatch.setattr(shutil, "copyfile", copy_then_fail)
    return calls


def test_a_failed_second_file_into_a_new_folder_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _fail_second_copy(monkeypatch)
    dest = tmp_path / "deeper" / "my_dlrm"  # its parent is missing too: made, then removed again
    assert main(["cp", "dlrm", str(dest)]) == 1
    assert len(calls) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "nothing was written" in err and "Traceback" not in err, err
    assert str(dest / "configs") in err  # names the file that could not be written, not a staging path
    assert list(tmp_path.iterdir()) == []  # no dest, no 'deeper', no staging folder


def test_a_failed_second_file_into_an_existing_folder_keeps_the_users_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "work"
    (dest / "configs").mkdir(parents=True)
    (dest / "notes.txt").write_text("mine")
    (dest / "configs" / "other.yaml").write_text("a: 1\n")
    before = _files(dest)
    _fail_second_copy(monkeypatch)
    assert main(["cp", "dlrm", str(dest)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert _files(dest) == before  # nothing added, nothing removed or changed
    assert _tree(dest) == ["configs", "configs/other.yaml", "notes.txt"]


def test_a_failed_move_into_place_removes_the_files_already_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The copies are staged; the second of the moves into an existing folder fails: the first is undone,
    and the configs/ folder the copy made is removed again."""
    dest = tmp_path / "work"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    real = cp_command._place_new
    moved: list[Path] = []

    def place_then_fail(staged: Path, target: Path) -> None:
        if moved:
            raise PermissionError(13, "Permission denied", str(target))
        real(staged, target)
        moved.append(target)

    monkeypatch.setattr(cp_command, "_place_new", place_then_fail)
    assert main(["cp", "dlrm", str(dest)]) == 1
    err = capsys.readouterr().err
    assert "Permission denied" in err and "nothing was written" in err, err
    assert moved == [dest / "dlrm.py"]
    assert _tree(dest) == ["notes.txt"] and (dest / "notes.txt").read_text() == "mine"


def test_a_file_that_appears_while_copying_is_never_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another process writes configs/dlrm.yaml between the check and the move: it is kept, the copy
    refuses (a usage error) and removes what it had moved."""
    dest = tmp_path / "work"
    dest.mkdir()
    real = cp_command._place_new

    def someone_writes_first(staged: Path, target: Path) -> None:
        if target.name == "dlrm.yaml":
            target.parent.mkdir(exist_ok=True)
            target.write_text("theirs")
        real(staged, target)

    monkeypatch.setattr(cp_command, "_place_new", someone_writes_first)
    assert main(["cp", "dlrm", str(dest)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert _tree(dest) == ["configs", "configs/dlrm.yaml"]
    assert (dest / "configs" / "dlrm.yaml").read_text() == "theirs"


def test_a_successful_copy_into_an_existing_folder_leaves_no_staging_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "work"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    monkeypatch.chdir(dest)
    assert main(["cp", "dlrm", "."]) == 0  # the parent of "." is not where the copy stages
    tree = _tree(dest)
    assert "dlrm.py" in tree and "configs/dlrm.yaml" in tree and "notes.txt" in tree
    assert not [name for name in tree if name.startswith(".")], tree
    assert (dest / "dlrm.py").read_bytes() == RECIPES["dlrm"].path.read_bytes()
    assert (dest / "configs" / "dlrm.yaml").read_bytes() == (CONFIGS_DIR / "dlrm.yaml").read_bytes()


def test_a_new_folder_gets_the_usual_permissions(tmp_path: Path) -> None:
    """The staging folder becomes the copy: it is made as mkdir makes folders, not 0700 like mkdtemp."""
    umask = os.umask(0o022)
    try:
        assert main(["cp", "dlrm", str(tmp_path / "mine")]) == 0
    finally:
        os.umask(umask)
    assert (tmp_path / "mine").stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_a_failed_yaml_copy_removes_the_folders_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full_disk(source: str, target: str) -> None:
        Path(target).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", full_disk)
    assert main(["cp", "dlrm", str(tmp_path / "a" / "b" / "x.yaml")]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
