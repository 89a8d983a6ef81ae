"""Shared-memory segments of the intra-host transport: private files in ``/dev/shm`` that do not outlive a job.

A segment is a file ``/dev/shm/lightrec-<uid>-<pid>-<start time>-<tag>`` created with mode 0600
(only the job's user can open it) and fully allocated up front (``posix_fallocate``: a
shared-memory filesystem that is too small fails *here*, with :class:`ShmSpaceError` saying how
much is free and what to do, not later with a SIGBUS in the middle of a copy). Every rank maps
its peers' segments and then the name is **unlinked**: the memory lives on only as long as some
process maps it, so a rank killed with SIGKILL takes its mappings with it. A name exists only
between creation and the last peer's open (a collective handshake at start-up, or when a rank
grows its data segment), except for a grown segment that some peer never maps (one it is never
sent anything from, as in a gather to rank 0): its creator's exit hook unlinks that name once the
peers have read what lives there (multiprocessing's exit hook, which runs at a normal exit, one by
an exception included; it waits 2 s at most for them, and a name still unread stays, as below).

A rank that ends without its exit hook -- SIGKILL, the OOM killer, or a plain SIGTERM (Python's
default action ends the process at once; lightrec installs no SIGTERM handler, and Lightning's,
which turns SIGTERM into an exception and a normal exit, lets the hook run) -- can leave such
names, each holding its memory, until :func:`sweep_stale_segments` -- run by every transport at
start-up -- removes the files of this user whose creator is gone (the creator's pid *and* start
time must match a live process, so a reused pid does not protect a stale file). Nothing is left
for good, but the memory comes back only when the next job of the same user starts a transport
with the same folder (``LIGHTREC_SHM_DIR``), or when the folder is cleared (a container's
``/dev/shm`` ends with it).
"""

from __future__ import annotations

import mmap
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from lightrec import _switches

__all__ = ["SHM_DIR", "ShmSegment", "ShmSpaceError", "segment_name", "sweep_stale_segments"]

SHM_DIR = _switches.SHM_DIR.read()  # at import, as the segments of a process must all live in one place
_PREFIX = "lightrec-"


class ShmSpaceError(RuntimeError):
    """The shared-memory filesystem cannot hold a segment of the intra-host transport."""


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces: split after it.
    return stat[stat.rindex(")") + 2 :].split()[19]


def segment_name(tag: str) -> str:
    """A fresh segment name owned by this process: user, pid and start time, then ``tag``."""
    pid = os.getpid()
    return f"{_PREFIX}{os.getuid()}-{pid}-{_start_time(pid)}-{tag}"


def sweep_stale_segments(directory: Path | None = None) -> list[str]:
    """Remove this user's segments whose creating process is gone; returns the names removed."""
    directory = SHM_DIR if directory is None else directory
    removed: list[str] = []
    prefix = f"{_PREFIX}{os.getuid()}-"
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        parts = entry.name[len(prefix) :].split("-", 2)
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        if _start_time(int(parts[0])) == parts[1]:
            continue  # its creator still runs
        try:
            if entry.stat(follow_symlinks=False).st_uid == os.getuid():
                os.unlink(entry.path)
                removed.append(entry.name)
        except FileNotFoundError:
            pass  # another rank swept it first
    return removed


@dataclass
class ShmSegment:
    """One mapped segment: ``data`` is a ``[nbytes]`` uint8 tensor over the shared mapping."""

    name: str
    nbytes: int
    data: torch.Tensor
    _map: mmap.mmap

    @classmethod
    def create(cls, tag: str, nbytes: int, purpose: str, directory: Path | None = None) -> ShmSegment:
        """Create, allocate and map a new segment (private to this user); the name stays until
        :meth:`unlink`."""
        directory = SHM_DIR if directory is None else directory
        name = segment_name(tag)
        path = directory / name
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:  # a missing or read-only folder: the same error on every rank, not a hang
            raise ShmSpaceError(
                f"lightrec's intra-host transport cannot create {purpose} in {directory} ({exc.strerror}). Set "
                f"{_switches.SHM_DIR.name} to a writable shared-memory folder (default /dev/shm), or set "
                "LIGHTREC_SHM=0 to exchange through gloo instead"
            ) from exc
        try:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                os.unlink(path)
                free = shutil.disk_usage(directory).free
                raise ShmSpaceError(
                    f"the shared-memory filesystem {directory} has {free / 2**20:.0f} MiB free, but lightrec's "
                    f"intra-host transport needs {nbytes / 2**20:.0f} MiB more for {purpose} ({exc.strerror}). "
                    "Enlarge it (docker run --shm-size=2g, or mount -o remount,size=... /dev/shm), or set "
                    "LIGHTREC_SHM=0 to exchange through gloo instead"
                ) from exc
            mapping = mmap.mmap(fd, nbytes)
        except BaseException:
            if path.exists():
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        return cls(name, nbytes, torch.frombuffer(mapping, dtype=torch.uint8), mapping)

    @classmethod
    def open(cls, name: str, directory: Path | None = None) -> ShmSegment:
        """Map a peer's segment by name (it must still be linked)."""
        directory = SHM_DIR if directory is None else directory
        fd = os.open(directory / name, os.O_RDWR)
        try:
            nbytes = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        return cls(name, nbytes, torch.frombuffer(mapping, dtype=torch.uint8), mapping)

    def unlink(self, directory: Path | None = None) -> None:
        """Remove the name (the mapping stays valid); a no-op if it is gone already."""
        directory = SHM_DIR if directory is None else directory
        try:
            os.unlink(directory / self.name)
        except FileNotFoundError:
            pass

    def words(self, dtype: torch.dtype, offset: int, count: int) -> torch.Tensor:
        """``[count]`` view of ``dtype`` at byte ``offset`` of the segment."""
        size = torch.empty((), dtype=dtype).element_size()
        return self.data[offset : offset + count * size].view(dtype)

    def close(self) -> None:
        """Drop the mapping (views of it must be gone; a view still alive keeps it mapped)."""
        self.data = torch.empty(0, dtype=torch.uint8)
        try:
            self._map.close()
        except BufferError:
            pass  # a tensor still exports the buffer: the mapping goes with it
