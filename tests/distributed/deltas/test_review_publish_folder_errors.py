"""The publish folder a user points a ``DeltaWriter`` (or a ``DeltaPublisher``) at cannot be used: a typed
error that names ``dirpath`` and the fix. A path that is a file used to raise a bare ``FileExistsError``
(a path under a file: ``NotADirectoryError``) from ``mkdir``; a folder the writer may not write raised a
``DeltaWriteError`` with no word of what to do (review of the publish path)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from lightrec.distributed.deltas import DeltaFormatError, DeltaWriteError, DeltaWriter
from lightrec.distributed.deltas import writer as writer_module
from tests.distributed.deltas.helpers import SPECS, dense, full_rows


def test_a_dirpath_that_is_a_file_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "publish"
    path.write_text("not a folder")
    with pytest.raises(DeltaFormatError, match=r"dirpath .*publish.* is a file, not a folder"):
        DeltaWriter(path, SPECS)
    assert path.read_text() == "not a folder"


def test_a_dirpath_under_a_file_is_a_write_error_naming_dirpath(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(DeltaWriteError, match=r"dirpath=.*file/publish.*pass another dirpath") as info:
        DeltaWriter(tmp_path / "file" / "publish", SPECS)
    assert info.value.errno == errno.ENOTDIR


def test_a_folder_the_writer_may_not_write_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = DeltaWriter(tmp_path / "publish", SPECS)

    def refused(path: object, *args: object, **kwargs: object) -> None:  # a read-only folder (root ignores chmod)
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(writer_module.os, "mkdir", refused)
    with pytest.raises(DeltaWriteError, match="Make the folder writable, or publish elsewhere") as info:
        writer.write_snapshot(full_rows(0), dense(0))
    assert info.value.errno == errno.EACCES
    assert writer.latest_version is None
