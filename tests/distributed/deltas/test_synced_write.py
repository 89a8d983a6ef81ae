"""``write_synced``: the bytes, size and SHA-256 of a version's file, through O_DIRECT or the page cache.

Large files bypass the page cache (``O_DIRECT`` from a page-aligned bounce buffer, the last block
padded and the file truncated back); small ones, and file systems without ``O_DIRECT``, are written
buffered. Every path must leave exactly the concatenation of the parts on disk.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lightrec.distributed.deltas import synced_write
from lightrec.distributed.deltas.synced_write import write_synced


def _parts(sizes: list[int], seed: int = 0) -> list[memoryview]:
    """Alternating read-only ``bytes`` parts and writable tensor views, as the safetensors writer gives."""
    g = torch.Generator().manual_seed(seed)
    out: list[memoryview] = []
    for i, n in enumerate(sizes):
        data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        out.append(memoryview(bytes(data.numpy())) if i % 2 == 0 else data.numpy().data.cast("B"))
    return out


def _check(path: Path, parts: list[memoryview]) -> None:
    expected = b"".join(bytes(p) for p in parts)
    record = write_synced(path, parts)
    assert path.read_bytes() == expected
    assert record.bytes == len(expected) and record.sha256 == hashlib.sha256(expected).hexdigest()


def _direct_supported(folder: Path) -> bool:
    fd = synced_write._open_direct(folder / "probe")
    if fd is None:
        return False
    os.close(fd)
    (folder / "probe").unlink()
    return True


def _on_direct_writes(monkeypatch: pytest.MonkeyPatch, act: Callable[[memoryview], None]) -> list[int]:
    """Spy on ``write_synced``'s writes: each one to an ``O_DIRECT`` file is checked for O_DIRECT's
    block rule, its length listed (the returned list) and handed to ``act`` (which may raise) first."""
    real_write, lengths = os.write, []

    def write(fd: int, data: memoryview) -> int:
        if getattr(os, "O_DIRECT", 0) & fcntl.fcntl(fd, fcntl.F_GETFL):
            assert len(data) % synced_write._BLOCK == 0  # kept by padding the last block
            lengths.append(len(data))
            act(data)
        return real_write(fd, data)

    monkeypatch.setattr(synced_write.os, "write", write)
    return lengths


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file direct, through a 16 KiB bounce buffer: block and chunk edges at test sizes."""
    monkeypatch.setattr(synced_write, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(synced_write, "_CHUNK", 4 * synced_write._BLOCK)


@pytest.mark.parametrize("sizes", [[1], [4095], [4096], [4097], [16383, 1], [16384], [16385], [7, 30000, 3, 4096, 12345], [0, 5000, 0]])
def test_direct_writes_hold_exactly_the_parts(tmp_path: Path, small_chunks: None, sizes: list[int],
                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    if not _direct_supported(tmp_path):
        pytest.skip(f"{tmp_path}'s file system has no O_DIRECT")
    direct_writes = _on_direct_writes(monkeypatch, lambda data: None)
    _check(tmp_path / "f", _parts(sizes))
    assert direct_writes or sum(sizes) == 0, "the file was not written through O_DIRECT"


def test_a_large_file_with_the_real_buffer(tmp_path: Path) -> None:
    _check(tmp_path / "big", _parts([100, synced_write._CHUNK + 12345, 8, 3 << 20]))


def test_buffered_where_o_direct_is_refused(tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synced_write, "_open_direct", lambda path: None)  # what tmpfs / macOS give
    _check(tmp_path / "f", _parts([10, 40000, 3]))


def test_a_write_refused_after_open_starts_over_buffered(tmp_path: Path, small_chunks: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    if not _direct_supported(tmp_path):
        pytest.skip(f"{tmp_path}'s file system has no O_DIRECT")

    def refuse(data: memoryview) -> None:  # the last, padded block: whole blocks were written before it
        if len(data) < synced_write._CHUNK:
            raise OSError(errno.EINVAL, "Invalid argument")

    refused = _on_direct_writes(monkeypatch, refuse)
    _check(tmp_path / "f", _parts([10, 40000, 3]))
    assert refused


def test_a_short_direct_write_is_a_full_disk(tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    if not _direct_supported(tmp_path):
        pytest.skip(f"{tmp_path}'s file system has no O_DIRECT")
    monkeypatch.setattr(synced_write.os, "write", lambda fd, data: len(data) // 2)
    with pytest.raises(OSError) as info:
        write_synced(tmp_path / "f", _parts([40000]))
    assert info.value.errno == errno.ENOSPC


def test_the_file_must_not_exist(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"old")
    with pytest.raises(FileExistsError):
        write_synced(tmp_path / "f", _parts([5 << 20]))
    assert (tmp_path / "f").read_bytes() == b"old"


def test_a_file_system_that_refuses_o_direct_at_open(tmp_path: Path, small_chunks: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Linux creates the file and then fails the open with EINVAL (tmpfs before 6.6): the buffered
    write that follows must find no file in its way."""
    real_open = os.open

    def open_(path: Path, flags: int, mode: int = 0o777) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            os.close(real_open(path, flags & ~os.O_DIRECT, mode))  # created, then refused
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real_open(path, flags, mode)

    monkeypatch.setattr(synced_write.os, "open", open_)
    _check(tmp_path / "f", _parts([10, 40000, 3]))


def test_parts_of_any_item_format_are_written_as_their_bytes(tmp_path: Path) -> None:
    floats = torch.arange(300_000, dtype=torch.float32)
    parts = [memoryview(bytes(range(7))).cast("B"), memoryview(floats.numpy()), memoryview(bytes(floats.numpy())).cast("f")]
    _check(tmp_path / "f", parts)


def test_the_bounce_buffer_is_not_shared_with_a_forked_child(tmp_path: Path) -> None:
    """A process forked after the buffer exists writes its own copy (a shared mapping would let a
    parent and a child publishing at once overwrite each other's blocks between hash and write)."""
    view, _ = synced_write._bounce()
    view[:4] = b"AAAA"
    pid = os.fork()
    if pid == 0:
        child_view, _ = synced_write._bounce()
        child_view[:4] = b"BBBB"
        os._exit(0)
    os.waitpid(pid, 0)
    assert bytes(view[:4]) == b"AAAA"
