"""``DeltaWriter``: write versions of the publish folder so that a crash or a full disk never shows a partial one.

One version is written as::

    1. encode every file in memory (rows in their row format; a safetensors file as views of those
       tensors, not a copy: ``safetensors_stream``); nothing on disk yet
    2. mkdir DIR/.tmp-v000000007-<pid>-<random>/
    3. write rows.safetensors, dense.safetensors: each written, fsync'd, closed (its SHA-256 taken from the
       bytes as they are written; large files bypass the page cache: ``synced_write``)
    4. write manifest.json last, fsync it, fsync the folder
    5. rename the folder to DIR/v000000007          <- the commit point: the version exists from here on
    6. fsync DIR (the rename survives a power loss)
    7. LATEST: written to DIR/.tmp-LATEST-..., fsync'd, os.replace'd onto DIR/LATEST, fsync DIR
    8. retention: old versions are renamed to .tmp-del-... (gone at once for readers), then deleted;
       skipped where 7 failed (LATEST still names an older version, which must not go), retried at the
       next write

A SIGKILL anywhere before 5 leaves a ``.tmp-*`` folder that no reader lists (the next writer removes
it); after 5 the version is complete. LATEST may lag behind the newest folder by one version after
a kill between 5 and 7: readers list the folders (:class:`~lightrec.distributed.deltas.reader.DeltaReader`).
An ``OSError`` in 2-5 (``ENOSPC``, ...) removes the temporary folder and raises
:class:`~lightrec.distributed.deltas.errors.DeltaWriteError`; the previous version stays the newest.
One writer per folder at a time: a new writer removes every ``.tmp-*`` it finds. Where another writer
renamed a version to the number a write was about to take (that rule broken, e.g. by the aborted publish
thread of a fit still finishing as the next fit starts), the write raises ``DeltaWriteError`` and the writer
looks at the folder again: its next version follows the newest one, and must be a snapshot.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from lightrec._version import __version__
from lightrec.distributed.deltas.errors import DeltaFormatError, DeltaWriteError
from lightrec.distributed.deltas.manifest import (
    DENSE_FILE,
    LATEST_FILE,
    MANIFEST_FILE,
    ROWS_FILE,
    TMP_PREFIX,
    Manifest,
    TableSpec,
    parse_version_name,
    version_name,
)
from lightrec.distributed.deltas.rows import TableRows, all_finite, check_rows, encode_rows
from lightrec.distributed.deltas.safetensors_stream import safetensors_parts
from lightrec.distributed.deltas.synced_write import write_synced
from lightrec.quant.row_codec import DEFAULT_ROW_ALIGNMENT

__all__ = ["DeltaWriter", "fsync_dir"]

logger = logging.getLogger(__name__)

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)


def fsync_dir(folder: Path) -> None:
    """Make the entries of ``folder`` (new files, renames) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_tree(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _read_kind(folder: Path) -> str | None:
    try:
        manifest = Manifest.from_json((folder / MANIFEST_FILE).read_text())
        # An edited manifest (a delta relabelled "snapshot") is refused by every reader: counted as a
        # snapshot here, retention would remove the real snapshot the versions after it build on.
        manifest.check_checksum()
        return manifest.kind
    except (OSError, ValueError):  # unreadable or edited: neither kept as a snapshot nor trusted
        return None


class DeltaWriter:
    """Writes snapshots and deltas of a fixed set of tables into ``dirpath`` (see the module docstring).

    Args:
        dirpath: the publish folder (created if missing).
        tables: every table a version may hold (``TableSpec``: rows, dim, row format, managed).
        retention: how many snapshots (each with the deltas after it) to keep; older versions are
            removed after each write. None keeps everything. The newest snapshot and every version
            after it are never removed.
        row_alignment: int8/int4 rows are padded to this many bytes (16: what ``quantize`` stores).

    The next version number follows the newest complete version in the folder, so a writer that
    restarts continues the numbering. A trainer resumed from a checkpoint older than that version
    should write a snapshot first: its deltas would otherwise build on rows it never trained.

    Raises:
        DeltaFormatError: no tables, two with one name, ``retention`` < 1, or ``dirpath`` is a file.
        DeltaWriteError: ``dirpath`` cannot be created or listed (a parent that is a file, no permission).
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str],
        tables: Iterable[TableSpec],
        retention: int | None = 2,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
    ) -> None:
        specs = list(tables)
        if not specs or not all(isinstance(t, TableSpec) for t in specs):
            raise DeltaFormatError(f"tables must be a non-empty list of TableSpec, got {specs!r}")
        self.tables: dict[str, TableSpec] = {t.name: t for t in specs}
        if len(self.tables) != len(specs):
            raise DeltaFormatError(f"two tables share a name: {sorted(t.name for t in specs)}")
        if retention is not None and (isinstance(retention, bool) or not isinstance(retention, int) or retention < 1):
            raise DeltaFormatError(f"retention must be None or an int >= 1 (snapshots kept), got {retention!r}")
        if isinstance(row_alignment, bool) or not isinstance(row_alignment, int) or row_alignment < 1:
            raise DeltaFormatError(f"row_alignment must be a positive int (bytes), got {row_alignment!r}")
        self.dirpath = Path(dirpath)
        self.retention = retention
        self.row_alignment = row_alignment
        if self.dirpath.exists() and not self.dirpath.is_dir():
            raise DeltaFormatError(f"dirpath {str(self.dirpath)!r} is a file, not a folder; pass the path of a folder "
                                   "(created when missing)")  # fmt: skip
        try:
            self.dirpath.mkdir(parents=True, exist_ok=True)
            self.clean_stale()
            self._kinds: dict[int, str | None] = self._scan()
        except OSError as exc:  # a parent that is a file, a folder this process may not list or write, ...
            raise DeltaWriteError(f"could not open the publish folder dirpath={str(self.dirpath)!r} ({exc}); make it "
                                  "writable, or pass another dirpath", exc.errno) from exc  # fmt: skip
        # Set when another writer took a version number: the newest version is not this writer's, so
        # a delta of this writer (rows changed since *its* previous version) cannot follow it.
        self._needs_snapshot = False

    # ------------------------------------------------------------------ state
    @property
    def latest_version(self) -> int | None:
        """The newest complete version in the folder (None: empty)."""
        return max(self._kinds, default=None)

    @property
    def latest_snapshot(self) -> int | None:
        """The newest snapshot in the folder (None: none yet; deltas need one)."""
        return max((v for v, k in self._kinds.items() if k == "snapshot"), default=None)

    def _scan(self) -> dict[int, str | None]:
        """``{version: kind}`` of every version folder (kind None: its manifest is unreadable)."""
        kinds: dict[int, str | None] = {}
        for entry in self.dirpath.iterdir():
            version = parse_version_name(entry.name)
            if version is not None:
                kinds[version] = _read_kind(entry)
        return kinds

    def clean_stale(self) -> None:
        """Remove every ``.tmp-*`` entry: versions a crash or a full disk left half-written."""
        for entry in self.dirpath.iterdir():
            if entry.name.startswith(TMP_PREFIX):
                logger.info("removing %s, left by an interrupted write", entry)
                _remove_tree(entry)

    # ------------------------------------------------------------------ writes
    def write_snapshot(
        self, rows: Mapping[str, TableRows], dense: Mapping[str, torch.Tensor], global_step: int = 0
    ) -> int:
        """Write a snapshot: every row of every table (ids ``0..num_embeddings-1``) and the dense weights.

        Args:
            rows: ``{table: TableRows}`` for every table of the writer; values float32 ``[n, dim]``
                (converted to the table's row format) or already in it.
            dense: ``{name: tensor}`` dense weights (the trained model's state-dict names), float32.
            global_step: the training step the version holds.

        Returns:
            The new version.

        Raises:
            DeltaFormatError: a table is missing or partial, or rows/dense are malformed.
            DeltaWriteError: the disk refused the write (the previous version is still the newest).
        """
        missing = sorted(set(self.tables) - set(rows))
        if missing:
            raise DeltaFormatError(f"a snapshot holds every table; rows lacks {missing}")
        for name, r in rows.items():
            spec = self.tables.get(name)
            if spec is not None and not torch.equal(r.ids.cpu(), torch.arange(spec.num_embeddings)):
                raise DeltaFormatError(
                    f"a snapshot holds every row: table {name!r} needs ids 0..{spec.num_embeddings - 1}, "
                    f"got {r.ids.numel()} ids"
                )
        return self._write("snapshot", rows, dense, global_step)

    def write_delta(
        self,
        rows: Mapping[str, TableRows],
        dense: Mapping[str, torch.Tensor] | None = None,
        global_step: int = 0,
    ) -> int:
        """Write a delta on top of the newest version: the rows that changed (any subset of tables),
        and the dense weights when given.

        Raises:
            DeltaFormatError: no snapshot in the folder yet, malformed rows/dense, or the newest version
                is another writer's (write a snapshot first).
            DeltaWriteError: the disk refused the write (the previous version is still the newest).
        """
        if self.latest_snapshot is None:
            raise DeltaFormatError(f"{self.dirpath} has no snapshot yet; write_snapshot(...) first")
        if self._needs_snapshot:
            raise DeltaFormatError(
                f"the newest version of {self.dirpath} ({version_name(self.latest_version or 1)}) was written by "
                "another writer: a delta of this one would build on rows it did not write; write_snapshot(...) first"
            )
        return self._write("delta", rows, dense or {}, global_step)

    def _encode(
        self, rows: Mapping[str, TableRows], dense: Mapping[str, torch.Tensor]
    ) -> tuple[dict[str, int], dict[str, list[memoryview]]]:
        unknown = sorted(set(rows) - set(self.tables))
        if unknown:
            raise DeltaFormatError(f"rows names tables {unknown} this writer does not know; its tables are {sorted(self.tables)}")
        tensors: dict[str, torch.Tensor] = {}
        counts = dict.fromkeys(self.tables, 0)
        for name, r in rows.items():
            spec = self.tables[name]
            encoded = TableRows(r.ids.detach().cpu(), encode_rows(r.values, spec, self.row_alignment),
                                None if r.raw_ids is None else r.raw_ids.detach().cpu())  # fmt: skip
            check_rows(encoded, spec)
            counts[name] = int(encoded.ids.shape[0])
            if counts[name]:
                tensors.update({f"{name}/ids": encoded.ids.contiguous(), f"{name}/values": encoded.values})
                if encoded.raw_ids is not None:
                    tensors[f"{name}/raw_ids"] = encoded.raw_ids.contiguous()
        files = {ROWS_FILE: safetensors_parts(tensors)} if tensors else {}
        for key, value in dense.items():
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                raise DeltaFormatError(f"dense[{key!r}] must be a floating-point tensor, got {type(value).__name__}")
            if not all_finite(value):  # a diverged trainer: every served score would be NaN
                raise DeltaFormatError(f"dense[{key!r}] has non-finite values; a served weight must be finite")
        if dense:
            flat = {k: v.detach().cpu().float().contiguous().clone() for k, v in dense.items()}
            files[DENSE_FILE] = safetensors_parts(flat)
        return counts, files

    def _write(self, kind: str, rows: Mapping[str, TableRows], dense: Mapping[str, torch.Tensor], step: int) -> int:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise DeltaFormatError(f"global_step must be a non-negative int, got {step!r}")
        counts, files = self._encode(rows, dense)
        previous = self.latest_version
        version = (previous or 0) + 1
        name = version_name(version)
        base = version if kind == "snapshot" else self.latest_snapshot
        assert base is not None  # write_delta checked
        tmp = self.dirpath / f"{TMP_PREFIX}{name}-{os.getpid()}-{secrets.token_hex(4)}"
        committed = False
        try:
            os.mkdir(tmp)
            records = {fname: write_synced(tmp / fname, data) for fname, data in files.items()}
            manifest = Manifest(
                version=version, kind=kind, base=base, parent=None if kind == "snapshot" else previous,
                global_step=step, wall_time=time.time(), lightrec_version=__version__, tables=dict(self.tables),
                rows=counts, dense=DENSE_FILE in files, files=records,
            )  # fmt: skip
            write_synced(tmp / MANIFEST_FILE, [memoryview(manifest.to_json().encode())])
            fsync_dir(tmp)
            os.rename(tmp, self.dirpath / name)  # the commit point
            committed = True
            fsync_dir(self.dirpath)
        except OSError as exc:
            if committed:  # the version is complete and visible; only its durability is in doubt
                logger.warning("version %s is written but syncing %s failed: %s", name, self.dirpath, exc)
            elif exc.errno in (errno.EEXIST, errno.ENOTEMPTY) and (self.dirpath / name).is_dir():
                raise self._taken(name, exc) from exc
            else:
                raise self._failed(name, previous, exc) from exc
        finally:
            if not committed:
                _remove_tree(tmp)
        self._kinds[version] = kind
        if kind == "snapshot":
            self._needs_snapshot = False
        if self._write_latest(name):
            # Not after a failed LATEST: it still names an older version, which retention could remove.
            # The next write retries both.
            self._apply_retention()
        return version

    def _failed(self, name: str, previous: int | None, exc: OSError) -> DeltaWriteError:
        kept = f"the newest version is still {version_name(previous)}" if previous else "the folder has no version yet"
        if exc.errno in _NO_SPACE:
            free = shutil.disk_usage(self.dirpath).free
            return DeltaWriteError(
                f"not enough disk space to write {self.dirpath / name} ({exc.strerror}; {free} bytes free); "
                f"{kept}. Free space, lower retention, or publish elsewhere", exc.errno)  # fmt: skip
        hint = ". Make the folder writable, or publish elsewhere" if exc.errno in _NO_PERMISSION else ""
        return DeltaWriteError(f"could not write {self.dirpath / name} ({exc}); {kept}{hint}", exc.errno)

    def _taken(self, name: str, exc: OSError) -> DeltaWriteError:
        """Another writer renamed its version to ``name`` first (one writer per folder was not kept).

        Without a fresh look at the folder every later write of this writer would take the same number
        and fail the same way; with it the next one follows the newest version -- as a snapshot, since
        that version's rows are not this writer's."""
        self._kinds = self._scan()
        self._needs_snapshot = True
        return DeltaWriteError(
            f"{self.dirpath / name} was written by another writer while this one wrote it (one writer per folder); "
            f"nothing of this write is kept. The next version follows {version_name(self.latest_version or 1)} "
            "and must be a snapshot: stop the other writer", exc.errno)  # fmt: skip

    def _write_latest(self, name: str) -> bool:
        """Point ``LATEST`` at ``name``; False (logged) where that failed."""
        tmp = self.dirpath / f"{TMP_PREFIX}{LATEST_FILE}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            write_synced(tmp, [memoryview(f"{name}\n".encode())])
            os.replace(tmp, self.dirpath / LATEST_FILE)
            fsync_dir(self.dirpath)
        except OSError as exc:  # the version is written: readers list folders; the next write retries
            logger.warning("%s is written but %s could not be updated: %s", name, self.dirpath / LATEST_FILE, exc)
            tmp.unlink(missing_ok=True)
            return False
        return True

    def _apply_retention(self) -> None:
        """Remove versions older than the ``retention``-th newest snapshot (oldest first)."""
        snapshots = sorted(v for v, k in self._kinds.items() if k == "snapshot")
        if self.retention is None or len(snapshots) <= self.retention:
            return
        keep_from = snapshots[-self.retention]
        for version in sorted(v for v in self._kinds if v < keep_from):
            folder = self.dirpath / version_name(version)
            doomed = self.dirpath / f"{TMP_PREFIX}del-{folder.name}-{os.getpid()}-{secrets.token_hex(4)}"
            try:
                os.rename(folder, doomed)  # gone for readers at once, deleted below
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("retention could not remove %s: %s", folder, exc)
                continue
            del self._kinds[version]
            _remove_tree(doomed)
