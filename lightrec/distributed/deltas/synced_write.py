"""Write one file of a version durably, hashing it on the way, without growing the page cache.

A delta of a million 64-wide fp32 rows is 330 MB, written every publish and never read back by the
writer. Through the page cache every publish takes that much fresh memory from the kernel, and on
our 2-core VM allocating it cost ten times the copy itself (0.8 s of system CPU per 330 MB against
0.08 s when the pages of the previous version were reused), CPU the training ranks lose. Large
files are therefore written with ``O_DIRECT`` from one small page-aligned bounce buffer per thread::

    parts (views of the tensors)  --copy (torch, GIL released)-->  bounce buffer [8 MiB, page aligned]
        --sha256 (GIL released)-->  --os.write(O_DIRECT)-->  disk

The last block is padded to the file system's block and the file truncated to its size after.
Where ``O_DIRECT`` is refused (tmpfs before Linux 6.6, macOS) and for small files the file is written through the page
cache and its pages are dropped after the ``fsync`` (``POSIX_FADV_DONTNEED``), so the next version
reuses them. Both ways: the file is created exclusively, fsync'd and closed before this returns; an
``OSError`` (``ENOSPC``, ...) propagates and the caller removes the temporary folder.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import threading
from pathlib import Path

import torch

from lightrec.distributed.deltas.manifest import FileRecord

__all__ = ["DIRECT_MIN_BYTES", "write_synced"]

DIRECT_MIN_BYTES = 1 << 20  # smaller files (manifests, dense weights of a small model) go through the cache
_CHUNK = 8 << 20  # the bounce buffer: a multiple of every block size O_DIRECT asks for
_BLOCK = 4096  # O_DIRECT's alignment of offsets and lengths (the largest logical block in use)
_buffers = threading.local()


def _bounce() -> tuple[memoryview, torch.Tensor]:
    """This thread's page-aligned buffer, as a memoryview (for write and hash) and a uint8 tensor (for copies)."""
    if getattr(_buffers, "size", 0) < _CHUNK:
        # Page aligned; private, so that a process forked after this one made it writes its own copy.
        area = mmap.mmap(-1, _CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        _buffers.size, _buffers.view = _CHUNK, memoryview(area)
        _buffers.tensor = torch.frombuffer(area, dtype=torch.uint8)
    return _buffers.view, _buffers.tensor


def _as_tensor(part: memoryview) -> torch.Tensor | None:
    """``part`` as a uint8 tensor sharing its memory (None when it is read-only, e.g. ``bytes``)."""
    if part.readonly or part.nbytes == 0:
        return None
    return torch.frombuffer(part, dtype=torch.uint8)


def _open_direct(path: Path) -> int | None:
    """Create ``path`` for ``O_DIRECT`` writes; None where the file system or the OS has no ``O_DIRECT``."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flag, 0o644)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: no O_DIRECT here (tmpfs before Linux 6.6); else a real failure
            raise
        # Linux creates the file before it finds O_DIRECT unsupported; O_EXCL made it ours to remove.
        path.unlink(missing_ok=True)
        return None


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _write_direct(fd: int, parts: list[memoryview], digest: hashlib._Hash) -> int:
    """Copy ``parts`` through the bounce buffer and write it in ``_CHUNK`` blocks; returns the size."""
    view, tensor = _bounce()
    filled = size = 0

    def flush(length: int) -> None:
        written = os.write(fd, view[:length])
        if written != length:  # a direct write stops short only when the device is full
            raise OSError(errno.ENOSPC, f"short write ({written} of {length} bytes)")

    for part in parts:
        source = _as_tensor(part)
        offset = 0
        while offset < part.nbytes:
            n = min(_CHUNK - filled, part.nbytes - offset)
            if source is not None:
                tensor[filled : filled + n].copy_(source[offset : offset + n])
            else:
                view[filled : filled + n] = part[offset : offset + n]
            digest.update(view[filled : filled + n])
            filled, offset, size = filled + n, offset + n, size + n
            if filled == _CHUNK:
                flush(_CHUNK)
                filled = 0
    if filled:
        padded = -(-filled // _BLOCK) * _BLOCK
        view[filled:padded] = bytes(padded - filled)
        flush(padded)
        os.ftruncate(fd, size)
    return size


def _drop_cached(fd: int) -> None:
    """Let the kernel drop the just-fsync'd file's pages (the writer never reads them again)."""
    if hasattr(os, "posix_fadvise"):  # not on macOS / Windows
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:  # a file system without it: the pages stay cached, nothing else changes
            pass


def write_synced(path: Path, parts: list[memoryview]) -> FileRecord:
    """Create ``path`` (it must not exist), write the concatenation of ``parts``, fsync, close.

    Returns its size and SHA-256, hashed from the bytes as they are written (no second pass).
    """
    digest = hashlib.sha256()
    parts = [p if p.format == "B" and p.ndim == 1 else p.cast("B") for p in parts]  # bytes, whatever the view
    total = sum(p.nbytes for p in parts)
    fd = _open_direct(path) if total >= DIRECT_MIN_BYTES else None
    direct = fd is not None
    if fd is None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if direct:
            try:
                size = _write_direct(fd, parts, digest)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # The file system accepted O_DIRECT at open but refuses these writes: start over buffered.
                import fcntl  # POSIX only; this branch runs where O_DIRECT exists

                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                digest, direct = hashlib.sha256(), False
        if not direct:
            size = 0
            for part in parts:
                digest.update(part)
                size += part.nbytes
                _write_all(fd, part)
        os.fsync(fd)
        if not direct:
            _drop_cached(fd)
    finally:
        os.close(fd)
    return FileRecord(size, digest.hexdigest())
