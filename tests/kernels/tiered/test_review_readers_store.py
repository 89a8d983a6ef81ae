"""Review: a failing SSD store leaves no folder it created behind, and a failing mmap is a
``TieredStorageError`` naming the folder and the fix."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest
import torch

import lightrec.kernels.tiered.store as store
from lightrec.kernels.tiered.store import SsdRowStore, TieredStorageError

LAYOUT = ([1000], [8], torch.float32, [{"momentum1": ((), torch.float32)}], ["t"])


def test_free_space_failure_removes_the_folders_it_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = store.shutil.disk_usage
    monkeypatch.setattr(store.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    target = tmp_path / "a" / "b" / "rows"
    with pytest.raises(TieredStorageError, match=r"has 0.00 GiB free"):
        SsdRowStore(*LAYOUT, directory=str(target))
    assert list(tmp_path.iterdir()) == []  # a, a/b and a/b/rows were made by the call: all gone
    existing = tmp_path / "mine"
    existing.mkdir()
    (existing / "keep.txt").write_text("x")
    with pytest.raises(TieredStorageError, match=r"has 0.00 GiB free"):
        SsdRowStore(*LAYOUT, directory=str(existing / "new"))
    assert sorted(p.name for p in existing.iterdir()) == ["keep.txt"]  # the user's folder stays


def test_mmap_failure_is_typed_names_the_folder_and_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def failing_mmap(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(args)
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(store.mmap, "mmap", failing_mmap)
    target = tmp_path / "new" / "rows"
    with pytest.raises(TieredStorageError, match=r"cannot memory-map .*'" + re.escape(str(target)) + r"'.*No such device.*local disk") as info:
        SsdRowStore(*LAYOUT, directory=str(target))
    assert info.value.errno == errno.ENODEV and calls
    assert list(tmp_path.iterdir()) == []
    # a pre-existing folder is kept (only what the call created is removed)
    existing = tmp_path / "kept"
    existing.mkdir()
    with pytest.raises(TieredStorageError, match="cannot memory-map"):
        SsdRowStore(*LAYOUT, directory=str(existing))
    assert existing.is_dir() and list(existing.iterdir()) == []


def test_store_still_works(tmp_path: Path) -> None:
    s = SsdRowStore(*LAYOUT, directory=str(tmp_path / "x" / "rows"))
    s.weights[0][3] = 1.5
    assert s.weights[0].sum().item() == pytest.approx(12.0) and (tmp_path / "x" / "rows").is_dir()
