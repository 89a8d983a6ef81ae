"""``DeltaReader``: list the complete versions of a publish folder, verify them, rebuild the tables at a version.

Every file is checked against its manifest record -- size first (a truncated file is named as
truncated), then SHA-256 -- *before* its bytes are parsed, and the tensors are parsed from those very
bytes (no second read that could differ). safetensors holds no code: nothing in a file runs.

A version ``v`` is rebuilt from its chain: the snapshot ``base`` it names, then every version after
it up to ``v`` (consecutive), a later row replacing an earlier one (:func:`merge_versions`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch

from lightrec.distributed.deltas.errors import (
    DeltaChainError,
    DeltaFormatError,
    DeltaNotFoundError,
    DeltaVerificationError,
)
from lightrec.distributed.deltas.manifest import (
    DENSE_FILE,
    LATEST_FILE,
    MANIFEST_FILE,
    ROWS_FILE,
    Manifest,
    TableSpec,
    parse_version_name,
    version_name,
)
from lightrec.distributed.deltas.rows import (
    TableRows,
    all_finite,
    check_rows,
    merge_rows,
    payload_bytes,
    values_dtype,
)

__all__ = ["DeltaReader", "DeltaState", "Stamp", "Version", "merge_versions"]

# What a version folder holds: ``(name, inode, bytes, mtime_ns)`` of the folder (".") and of each entry.
Stamp = tuple[tuple[str, int, int, int], ...]

# No manifest comes near this (a table is ~150 bytes of JSON); a larger file is not read into memory.
_MAX_MANIFEST_BYTES = 64 << 20


@dataclass(frozen=True)
class Version:
    """One verified version: its manifest, the rows of every table it changes, its dense weights."""

    manifest: Manifest
    rows: dict[str, TableRows]
    dense: dict[str, torch.Tensor]


@dataclass(frozen=True)
class DeltaState:
    """Versions ``first..version`` merged: what applying them in order does.

    Attributes:
        version / first: the last and first version merged.
        complete: ``first`` is a snapshot, so ``rows`` holds every row of every table and the
            state is the model at ``version`` whatever came before.
        tables: the tables (row format, managed...) as the last version lists them.
        rows: ``{table: TableRows}`` the newest row of every row the versions hold.
        dense: the newest dense weights by name (empty when no version had any).
        global_step / wall_time: the last version's.
    """

    version: int
    first: int
    complete: bool
    tables: dict[str, TableSpec]
    rows: dict[str, TableRows]
    dense: dict[str, torch.Tensor]
    global_step: int
    wall_time: float


def merge_versions(versions: Sequence[Version], allow_gaps: bool = False) -> DeltaState:
    """Merge versions, oldest first (see :class:`DeltaState`).

    Args:
        allow_gaps: merge versions that are ascending but not consecutive (a follower skipping a
            refused version); the result is then not exactly any version's state.

    Raises:
        DeltaChainError: no versions, versions that are not consecutive (ascending with
            ``allow_gaps``), or a table whose spec changes.
    """
    if not versions:
        raise DeltaChainError("no versions to merge")
    numbers = [v.manifest.version for v in versions]
    ordered = numbers == sorted(set(numbers)) if allow_gaps else numbers == list(range(numbers[0], numbers[-1] + 1))
    if not ordered:
        raise DeltaChainError(f"versions must be {'ascending' if allow_gaps else 'consecutive'} to be merged, got {numbers}")
    last = versions[-1].manifest
    for v in versions:
        for name, spec in v.manifest.tables.items():
            if last.tables.get(name, spec) != spec:
                raise DeltaChainError(f"table {name!r} changes from {spec} (v{v.manifest.version}) to {last.tables[name]}")
    parts: dict[str, list[TableRows]] = {}
    dense: dict[str, torch.Tensor] = {}
    for v in versions:
        for name, rows in v.rows.items():
            parts.setdefault(name, []).append(rows)
        dense.update(v.dense)
    return DeltaState(
        version=last.version, first=numbers[0], complete=versions[0].manifest.kind == "snapshot",
        tables=dict(last.tables), rows={name: merge_rows(p) for name, p in parts.items()}, dense=dense,
        global_step=last.global_step, wall_time=last.wall_time,
    )  # fmt: skip


class DeltaReader:
    """Reads a publish folder written by :class:`~lightrec.distributed.deltas.writer.DeltaWriter`.

    Args:
        dirpath: the publish folder; it may not exist yet (then it has no versions).
    """

    def __init__(self, dirpath: str | os.PathLike[str]) -> None:
        self.dirpath = Path(dirpath)
        self._manifests: dict[int, tuple[tuple[int, ...], Manifest]] = {}

    def versions(self) -> list[int]:
        """The complete versions (folders under their final name), ascending; not verified yet."""
        try:
            names = os.listdir(self.dirpath)
        except FileNotFoundError:
            names = []
        listed = sorted(v for v in map(parse_version_name, names) if v is not None)
        for gone in set(self._manifests).difference(listed):  # removed by retention: a follower lives for days
            del self._manifests[gone]
        return listed

    def latest(self) -> int | None:
        """The newest complete version (from the listing; ``LATEST`` can lag one version after a crash)."""
        return max(self.versions(), default=None)

    def latest_hint(self) -> int | None:
        """What ``LATEST`` says (None when missing or unreadable)."""
        try:
            return parse_version_name((self.dirpath / LATEST_FILE).read_text().strip())
        except OSError:
            return None

    def folder(self, version: int) -> Path:
        return self.dirpath / version_name(version)

    def stamp(self, version: int) -> Stamp | None:
        """What ``version``'s folder holds now (None: gone); it changes when a file of it is added,
        removed, replaced or written, so a follower knows when a refused version is worth reading again."""
        folder = self.folder(version)
        try:
            found = [(".", os.stat(folder))]
            with os.scandir(folder) as entries:
                found.extend((e.name, e.stat()) for e in entries)
        except OSError:  # gone (retention), or an entry removed while listed: not a stable state
            return None
        return tuple(sorted((name, st.st_ino, st.st_size, st.st_mtime_ns) for name, st in found))

    def manifest(self, version: int) -> Manifest:
        """The checked manifest of ``version`` (cached while its folder and file stay the same).

        Raises:
            DeltaNotFoundError: no such version folder.
            DeltaVerificationError: the manifest is missing, corrupt (its own checksum included), or
                names another version.
        """
        folder = self.folder(version)
        path = folder / MANIFEST_FILE
        try:
            # the manifest's own stat too: one rewritten in place (cp over a folder) leaves the folder's alone
            key = (os.stat(folder).st_ino, *_file_key(path))
            cached = self._manifests.get(version)
            if cached is not None and cached[0] == key:
                return cached[1]
            data = _read_regular(path, version, _MAX_MANIFEST_BYTES)
            text = data.decode()
        except FileNotFoundError:
            if not folder.exists():
                versions = self.versions()
                raise DeltaNotFoundError(f"{folder} does not exist, or was removed while being read (retention?); "
                                         f"versions here: {versions}") from None  # fmt: skip
            raise DeltaVerificationError(f"{path} is missing: the version is incomplete", path, version) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise DeltaVerificationError(f"{path} cannot be read ({exc})", path, version) from exc
        if len(data) > _MAX_MANIFEST_BYTES:
            raise DeltaVerificationError(f"{path} is larger than any manifest ({_MAX_MANIFEST_BYTES} bytes at most)",
                                         path, version)  # fmt: skip
        try:
            manifest = Manifest.from_json(text)
        except DeltaFormatError as exc:
            raise DeltaVerificationError(f"{path} is corrupt: {exc}", path, version) from exc
        if manifest.version != version:
            raise DeltaVerificationError(f"{path} is the manifest of version {manifest.version}, not {version}",
                                         path, version)  # fmt: skip
        try:
            manifest.check_checksum()  # a field no tensor check sees (global_step, int8 read as int4, ...)
        except DeltaFormatError as exc:
            raise DeltaVerificationError(f"{path} is corrupt: {exc}", path, version) from exc
        self._manifests[version] = (key, manifest)
        return manifest

    def read(self, version: int) -> Version:
        """Verify and load ``version``: every file's size and SHA-256, then its tensors against the manifest.

        Raises:
            DeltaNotFoundError: the version is not (or no longer) there.
            DeltaVerificationError: a file is missing, truncated, corrupt or inconsistent (``path`` names it).
        """
        manifest = self.manifest(version)
        loaded = {name: self._load(version, name, record.bytes, record.sha256)
                  for name, record in manifest.files.items()}  # fmt: skip
        rows = self._table_rows(version, manifest, loaded.get(ROWS_FILE, {}))
        dense = loaded.get(DENSE_FILE, {})
        path = self.folder(version) / DENSE_FILE
        bad = [k for k, t in dense.items() if t.dtype != torch.float32]
        if bad:
            raise DeltaVerificationError(f"{path}: dense tensors must be float32, {bad} are not", path, version)
        # Checksums prove the bytes are the writer's, not that the writer was sane (a trainer that diverged):
        # a served NaN weight or row would fail every request. The writer refuses these; another one may not.
        bad = [k for k, t in dense.items() if not all_finite(t)]
        if bad:
            raise DeltaVerificationError(f"{path}: dense tensors {bad[:5]} hold NaN or infinite values", path, version)
        bad = [n for n, t in rows.items() if t.values.is_floating_point() and not all_finite(t.values)]
        if bad:
            path = self.folder(version) / ROWS_FILE
            raise DeltaVerificationError(f"{path}: the rows of tables {bad[:5]} hold NaN or infinite values", path,
                                         version)  # fmt: skip
        return Version(manifest, rows, dense)

    def chain(self, version: int) -> list[int]:
        """``[base, ..., version]``: the versions that rebuild ``version``.

        Raises:
            DeltaChainError: a version of the chain is missing, or the manifests disagree about it.
            DeltaNotFoundError / DeltaVerificationError: reading a manifest failed.
        """
        manifest = self.manifest(version)
        listed = set(self.versions())
        chain = list(range(manifest.base, version + 1))
        missing = [v for v in chain if v not in listed]
        if missing:
            raise DeltaChainError(
                f"version {version} builds on snapshot {manifest.base}, but {[version_name(v) for v in missing]} "
                f"are not in {self.dirpath} (removed by retention?); read a newer version"
            )
        for v in chain[1:]:
            m = self.manifest(v)
            if m.kind != "delta" or m.base != manifest.base:
                raise DeltaChainError(f"version {v} ({m.kind}, base {m.base}) does not belong to the chain of snapshot "
                                      f"{manifest.base} that version {version} names")  # fmt: skip
        return chain

    def state(self, version: int | None = None) -> DeltaState:
        """The tables and dense weights at ``version`` (default: the newest), rebuilt from its chain.

        Raises:
            DeltaNotFoundError: the folder has no version (or not this one); and as :meth:`chain`/:meth:`read`.
        """
        if version is None:
            version = self.latest()
            if version is None:
                raise DeltaNotFoundError(f"{self.dirpath} holds no version yet")
        return merge_versions([self.read(v) for v in self.chain(version)])

    # ------------------------------------------------------------------ verification
    def _load(self, version: int, name: str, size: int, sha256: str) -> dict[str, torch.Tensor]:
        path = self.folder(version) / name
        try:
            data = _read_regular(path, version, size)
        except FileNotFoundError:
            if not self.folder(version).exists():
                raise DeltaNotFoundError(f"{self.folder(version)} was removed while being read (retention?)") from None
            raise DeltaVerificationError(f"{path} is missing; the manifest lists it", path, version) from None
        except OSError as exc:
            raise DeltaVerificationError(f"{path} cannot be read ({exc})", path, version) from exc
        if len(data) != size:
            what = "truncated" if len(data) < size else "longer than written"
            found = len(data) if len(data) < size else f"more than {size}"  # not read past size + 1
            raise DeltaVerificationError(f"{path} is {what}: {found} bytes on disk, the manifest records {size}",
                                         path, version)  # fmt: skip
        if hashlib.sha256(data).hexdigest() != sha256:
            raise DeltaVerificationError(
                f"{path} is corrupt: its SHA-256 differs from the one its manifest records", path, version
            )
        try:
            return safetensors.torch.load(data)
        except Exception as exc:  # the bytes were written by someone else: any parse error is corruption
            raise DeltaVerificationError(f"{path} is not a readable safetensors file ({exc})", path, version) from exc

    def _table_rows(self, version: int, manifest: Manifest, tensors: dict[str, torch.Tensor]) -> dict[str, TableRows]:
        path = self.folder(version) / ROWS_FILE
        rows: dict[str, TableRows] = {}
        expected: set[str] = set()
        try:
            for name, n in manifest.rows.items():
                if n == 0:
                    continue
                spec = manifest.tables[name]
                keys = [f"{name}/ids", f"{name}/values"] + ([f"{name}/raw_ids"] if spec.managed else [])
                expected.update(keys)
                absent = [k for k in keys if k not in tensors]
                if absent:
                    raise DeltaFormatError(f"tensors {absent} are missing")
                values = tensors[f"{name}/values"]
                table = TableRows(tensors[f"{name}/ids"], values, tensors.get(f"{name}/raw_ids"))
                width = spec.dim if spec.row_format in ("fp32", "fp16") else None
                check_rows(table, spec, width)
                if table.ids.shape[0] != n or values.dtype != values_dtype(spec.row_format):
                    raise DeltaFormatError(f"table {name!r}: {table.ids.shape[0]} rows of {values.dtype}, the manifest "
                                           f"says {n} of {spec.row_format}")  # fmt: skip
                if width is None and values.shape[1] < payload_bytes(spec.dim, spec.row_format):
                    raise DeltaFormatError(f"table {name!r}: {values.shape[1]}-byte rows are too short for "
                                           f"{spec.row_format} dim {spec.dim}")  # fmt: skip
                rows[name] = table
            extra = sorted(set(tensors) - expected)
            if extra:
                raise DeltaFormatError(f"tensors {extra[:5]} belong to no table of the manifest")
        except DeltaFormatError as exc:
            raise DeltaVerificationError(f"{path} does not match its manifest: {exc}", path, version) from exc
        return rows


def _file_key(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _read_regular(path: Path, version: int, limit: int) -> bytes:
    """The bytes of the regular file ``path``: all of them up to ``limit``, else ``limit + 1`` (not read
    further: a file longer than its record is refused as such, never loaded whole).

    Opened without blocking and checked before any read: a FIFO under a version file's name would wait
    for a writer forever (the follower's thread with it), a device such as ``/dev/zero`` never end.

    Raises:
        FileNotFoundError / OSError: as ``open``.
        DeltaVerificationError: ``path`` is no regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with open(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DeltaVerificationError(f"{path} is not a regular file (mode {stat.filemode(mode)}); a version holds "
                                         "regular files only: publish it again", path, version)  # fmt: skip
        return file.read(limit + 1)
