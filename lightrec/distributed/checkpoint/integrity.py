"""What ties a sharded checkpoint together: a run id and a checksum of every file, in ``manifest.json``.

``manifest.json`` is the last file of a checkpoint folder to be written (rank 0 writes it once every
rank's file and ``meta.pt`` are on disk and synced), so its presence marks a complete save::

    {"format": "lightrec.sharded.v2", "run_id": "5f0c...", "world_size": 2,
     "files": {"meta.pt": {"bytes": 81234, "sha256": "9a1e..."},
               "shards-rank00000.pt": {"bytes": 1048871, "sha256": "..."}, ...}}

It is JSON, not a pickle, so it is read before any ``.pt`` file is opened; ``meta.pt`` carries the
same ``run_id``. On load every file is checked against it -- its size first (a truncated file is
named as truncated, without reading it), then its SHA-256 -- so a file from another save, a
corrupted byte or a cut-off write raises ``CheckpointError`` naming the file and what is wrong,
before the file is unpickled.

Checksums cost no extra pass when saving: ``torch.save`` writes through :class:`HashingWriter`,
which hashes the bytes on their way to the file. On load the files are read once more (SHA-256
runs at ~2 GB/s on one core of this machine; ``docs/checkpoints.md`` has the measured cost).
A write that fails for lack of space raises ``CheckpointError`` with the bytes needed and free.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from typing import BinaryIO

import torch

from lightrec.distributed.checkpoint.blocks import CheckpointError

__all__ = [
    "MANIFEST_FILE",
    "FileRecord",
    "HashingWriter",
    "Manifest",
    "estimate_bytes",
    "read_manifest",
    "save_hashed",
    "verify_file",
    "write_manifest",
]

MANIFEST_FILE = "manifest.json"
_CHUNK = 8 << 20


@dataclass(frozen=True)
class FileRecord:
    """Size and SHA-256 (hex) of one file of a checkpoint folder."""

    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``: the save's run id, how many ranks wrote it, and every file's record."""

    format: str
    run_id: str
    world_size: int
    files: dict[str, FileRecord]


class HashingWriter:
    """A write-only file object that hashes and counts what passes through it to ``f``.

    ``torch.save`` writes its zip archive sequentially through ``write`` when handed a file object,
    so the digest is the file's SHA-256 without reading the file back. An ``OSError`` of the
    underlying file (disk full, file too large) is kept in ``error``: ``torch.save`` would turn it
    into a message about the zip writer's position.
    """

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._hash = hashlib.sha256()
        self.bytes = 0
        self.error: OSError | None = None

    def write(self, data: bytes | memoryview) -> int:
        try:
            n = self._f.write(data)
        except OSError as exc:
            self.error = exc
            raise
        self._hash.update(data)
        self.bytes += len(data)
        return n

    def flush(self) -> None:
        self._f.flush()

    def record(self) -> FileRecord:
        return FileRecord(self.bytes, self._hash.hexdigest())


def estimate_bytes(obj: object) -> int:
    """Bytes of tensor data in ``obj`` (nested dicts/lists/tuples): a lower bound of its file size."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(estimate_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(estimate_bytes(v) for v in obj)
    return 0


def _disk_full(path: str, needed: int, exc: OSError | None) -> CheckpointError:
    free = shutil.disk_usage(os.path.dirname(path) or ".").free
    cause = f" ({exc.strerror})" if exc is not None else ""
    return CheckpointError(
        f"not enough disk space to write {path}{cause}: it needs about {needed} bytes, {free} are free on its "
        "filesystem; free space or save elsewhere (the previous checkpoint at this path is unchanged)"
    )


_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def save_hashed(obj: object, path: str, shown: str | None = None) -> FileRecord:
    """``torch.save(obj)`` to ``path``, synced to disk, and return its size and SHA-256.

    Refuses up front when the tensors alone would not fit in the free space, and turns a write
    that runs out of space part-way (``ENOSPC``, or ``EFBIG`` under a file-size limit) into the
    same ``CheckpointError`` -- also when it is closing the file that fails (the buffered tail is
    written then: that raised a bare ``OSError: [Errno 28]`` naming no file).

    Args:
        obj / path: what to save, and where.
        shown: the path to name in errors (a temporary file's destination), default ``path``.
    """
    name = shown or path
    needed = estimate_bytes(obj)
    if needed > shutil.disk_usage(os.path.dirname(path) or ".").free:
        raise _disk_full(name, needed, None)
    written = 0
    try:
        with open(path, "wb") as f:
            writer = HashingWriter(f)
            try:
                torch.save(obj, writer)  # type: ignore[arg-type]  # a file object: write() and flush()
                f.flush()
                os.fsync(f.fileno())
            except (OSError, RuntimeError) as exc:
                written = writer.bytes
                error = writer.error or (exc if isinstance(exc, OSError) else None)
                if error is not None and error.errno in _NO_SPACE:
                    raise _disk_full(name, max(needed, writer.bytes), error) from exc
                raise
    except OSError as exc:  # open() or the close of the file ran out of space
        if exc.errno in _NO_SPACE:
            raise _disk_full(name, max(needed, written), exc) from exc
        raise
    return writer.record()


def write_manifest(folder: str, manifest: Manifest) -> FileRecord:
    """Write ``manifest.json`` into ``folder`` (synced); the folder is complete from then on."""
    text = json.dumps(
        {
            "format": manifest.format,
            "run_id": manifest.run_id,
            "world_size": manifest.world_size,
            "files": {k: {"bytes": r.bytes, "sha256": r.sha256} for k, r in sorted(manifest.files.items())},
        },
        indent=1,
    ).encode()
    path = os.path.join(folder, MANIFEST_FILE)
    with open(path, "wb") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return FileRecord(len(text), hashlib.sha256(text).hexdigest())


def read_manifest(folder: str) -> Manifest:
    """Parse ``folder/manifest.json``; a missing or malformed one raises ``CheckpointError``."""
    path = os.path.join(folder, MANIFEST_FILE)
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read().decode())
        files = {str(k): FileRecord(int(v["bytes"]), str(v["sha256"])) for k, v in raw["files"].items()}
        return Manifest(str(raw["format"]), str(raw["run_id"]), int(raw["world_size"]), files)
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is missing: the save that wrote {folder} did not finish (the manifest is written last)"
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"{path} is corrupt ({type(exc).__name__}: {exc}); the checkpoint cannot be verified"
        ) from exc


def verify_file(folder: str, name: str, record: FileRecord) -> None:
    """Check ``folder/name`` against its manifest record: exists, same size, same SHA-256."""
    path = os.path.join(folder, name)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: the manifest lists it ({record.bytes} bytes)") from None
    if size != record.bytes:
        what = "truncated" if size < record.bytes else "longer than written"
        raise CheckpointError(f"{path} is {what}: {size} bytes on disk, the manifest records {record.bytes}")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != record.sha256:
        raise CheckpointError(
            f"{path} is corrupt or from another save: its SHA-256 is {digest.hexdigest()[:16]}..., the manifest "
            f"records {record.sha256[:16]}...; restore the file or use another checkpoint"
        )
