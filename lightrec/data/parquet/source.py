"""Where the Parquet files are: a path, folder, glob or URI -> a sorted list of files with their footers.

``path`` may be

* a file (``data/day_0.parquet``);
* a folder, read recursively; hive-style partition folders (``day=2024-01-07/hour=03/...``) give
  each file its partition values, which the splits can select on;
* a glob (``data/day=*/part-*.parquet``; ``*``, ``?`` and ``[...]`` stay inside one name, a ``**`` name
  matches any depth);
* a list of any of these;
* a URI of any filesystem pyarrow reaches (``s3://``, ``gs://``, ``hdfs://``, ``file://``), or of
  an fsspec filesystem where fsspec and its backend are installed (``memory://``, ``abfs://``, ...).

Names starting with ``.`` or ``_`` are skipped at every level below the given folder (Spark's
``_SUCCESS``, ``_temporary/``, writers' hidden ``.part`` files), as pyarrow's datasets do. With
``marker="_SUCCESS"`` (a writer that writes its files in place and marks the folder when done), a
file is listed only once its folder holds that marker file (:func:`complete_files`): the footer of a
file still being written is not read. Files are
read in the order of their full paths, sorted as strings: zero-pad partition values and file
numbers (``day=07``, ``part-00012``) so that this is time order.

Every file's footer is read once, here (row groups and their sizes, column statistics); its size
and modification time are kept so that a reader notices a file that changed after it was listed
(:class:`~lightrec.data.parquet.errors.ParquetFileChangedError`).
"""

from __future__ import annotations

import copy
import fnmatch
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypedDict

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lightrec.data.parquet.errors import ParquetFileChangedError, ParquetFileError

__all__ = [
    "ColumnStats",
    "FileStamp",
    "ParquetFileInfo",
    "ParquetSource",
    "SourceSummary",
    "complete_files",
    "hidden",
    "list_files",
    "names_file",
    "open_parquet",
    "read_file_info",
    "resolve_filesystem",
]

_GLOB = re.compile(r"[*?\[]")


class SourceSummary(TypedDict):
    """:meth:`ParquetSource.describe`: the counts a log line or ``lightrec data inspect`` shows."""

    files: int
    row_groups: int
    rows: int
    bytes: int


def resolve_filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path inside it)`` for a local path or a URI (module docstring)."""
    if "://" not in path:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path))
    try:
        return pafs.FileSystem.from_uri(path)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:  # a scheme pyarrow does not build in
        try:
            import fsspec
        except ImportError:
            raise ValueError(
                f"path {path!r}: pyarrow cannot open this kind of URI ({exc}) and fsspec is not installed; "
                "pip install fsspec and its backend (s3fs, gcsfs, adlfs, ...)"
            ) from exc
        fs, inner = fsspec.core.url_to_fs(path)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), inner


def hidden(name: str) -> bool:
    """Whether a file or folder name is skipped: it starts with ``.`` or ``_``."""
    return name.startswith((".", "_"))


def _visible_below(path: str, base: str) -> bool:
    relative = path[len(base) :].lstrip("/") if path.startswith(base) else os.path.basename(path)
    return not any(hidden(part) for part in relative.split("/") if part)


def _glob(path: str) -> tuple[str, str] | None:
    """``(base folder, pattern)`` of a glob path, or None when ``path`` is no glob."""
    match = _GLOB.search(path)
    if match is None:
        return None
    before = path[: match.start()]
    # No "/" before the wildcard: a glob relative to the root of a filesystem given by the caller.
    base = (before.rsplit("/", 1)[0] or "/") if "/" in before else ""
    return base, path


def listing_root(path: str) -> str:
    """Where a listing of ``path`` starts: ``path`` itself (a file or folder), or a glob's base folder."""
    glob = _glob(path)
    return path if glob is None else glob[0]


def _glob_matches(pattern: str, path: str) -> bool:
    """Whether ``path`` matches ``pattern`` as a shell glob: ``*``, ``?`` and ``[...]`` stay inside one
    name (``day=*/part-*.parquet`` does not reach ``day=1/old/part-0.parquet``); a ``**`` name matches
    any number of names, none included. (``fnmatch`` alone lets ``*`` cross ``/``.)"""
    return _names_match(tuple(pattern.split("/")), tuple(path.split("/")))


def _names_match(pattern: tuple[str, ...], names: tuple[str, ...]) -> bool:
    if not pattern:
        return not names
    if pattern[0] == "**":
        return any(_names_match(pattern[1:], names[i:]) for i in range(len(names) + 1))
    return bool(names) and fnmatch.fnmatchcase(names[0], pattern[0]) and _names_match(pattern[1:], names[1:])


def list_files(fs: pafs.FileSystem, path: str) -> list[str]:
    """The files ``path`` names (a file, a folder read recursively, or a glob), sorted; may be empty."""
    glob = _glob(path)
    if glob is None:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return [path]
        if info.type != pafs.FileType.Directory:
            return []
        base = path.rstrip("/")
        found = fs.get_file_info(pafs.FileSelector(base, recursive=True))
        return sorted(f.path for f in found if f.type == pafs.FileType.File and _visible_below(f.path, base))
    base, pattern = glob
    if fs.get_file_info(base).type != pafs.FileType.Directory:
        return []
    found = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    return sorted(
        f.path
        for f in found
        if f.type == pafs.FileType.File and _glob_matches(pattern, f.path) and _visible_below(f.path, base)
    )


def complete_files(fs: pafs.FileSystem, files: Sequence[str], marker: str | None) -> list[str]:
    """The ``files`` whose folder holds the file ``marker`` (all of them when ``marker`` is None), in order.

    A writer that writes in place marks a folder when its files are done (Spark's ``_SUCCESS``): a
    file of a folder without the marker may be partial, or have no footer yet. One look per folder.
    """
    if marker is None:
        return list(files)
    marked: dict[str, bool] = {}
    out = []
    for file in files:
        folder = file.rsplit("/", 1)[0] if "/" in file else ""  # "" : the root of a filesystem given by the caller
        if folder not in marked:
            marked[folder] = fs.get_file_info(f"{folder}/{marker}" if folder else marker).type == pafs.FileType.File
        if marked[folder]:
            out.append(file)
    return out


def names_file(path: str, file: str) -> bool:
    """Whether :func:`list_files` of ``path`` lists ``file`` (an existing file), decided from the names alone.

    For files that arrive after ``path`` was listed (a following loader): ``path`` names ``file`` when
    it is the file, a folder above it, or a glob that matches it, and no name below the folder (or
    the glob's base) is hidden.
    """
    glob = _glob(path)
    if glob is None:
        base = path.rstrip("/")
        return file == path or (file.startswith(base + "/") and _visible_below(file, base))
    base, pattern = glob
    return _glob_matches(pattern, file) and _visible_below(file, base)


def partitions_of(path: str) -> tuple[tuple[str, str], ...]:
    """The hive partition values in a file's path: ``.../day=07/hour=3/x.parquet`` -> (("day", "07"), ("hour", "3"))."""
    parts = path.split("/")[:-1]
    return tuple(tuple(p.split("=", 1)) for p in parts if "=" in p and not p.startswith("="))  # type: ignore[misc]


def open_parquet(fs: pafs.FileSystem, path: str) -> pq.ParquetFile:
    """A ``ParquetFile`` over ``path`` (reads of row groups pre-buffered).

    A local file is read with positioned reads, never memory-mapped (as
    :class:`~lightrec.data.parquet.reader.BlockReader` reads rows): pages read through a map are
    decoded in place, and a file cut short under the map (a writer replacing it in place) kills the
    process with SIGBUS, where a read returns an error this module can name. The footer is no
    exception: it is parsed from the map too, while an in-place writer may truncate the file.

    Raises:
        ParquetFileError: the file is not Parquet, truncated or corrupt.
    """
    try:
        if isinstance(fs, pafs.LocalFileSystem):
            return pq.ParquetFile(path, memory_map=False, pre_buffer=True)
        return pq.ParquetFile(fs.open_input_file(path), pre_buffer=True)
    # A corrupt footer fails in more ways than ArrowInvalid / OSError: names that are not UTF-8 are pyarrow's
    # UnicodeDecodeError (a ValueError), other damage another ArrowException. Each is this file's problem.
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ParquetFileError(
            f"not a readable Parquet file ({exc}); it may be truncated (a copy or write that did not finish) or "
            "corrupt: write or copy it again, or move it out of the data folder",
            path=path,
        ) from exc


@dataclass(frozen=True)
class ColumnStats:
    """What a row group's footer says of one column (its first leaf's column chunk), decoded.

    Attributes:
        min / max: the smallest and largest value (``None``: not stored); Python values of the column's
            type (``int`` for integer columns).
        null_count: nulls (``None``: not stored).
        nested: the leaf is inside a list: ``null_count`` then counts empty and null lists too, so it says
            nothing about null ids.
    """

    min: object
    max: object
    null_count: int | None
    nested: bool


def _leaves(dtype: pa.DataType) -> int:
    """How many Parquet leaf columns (column chunks) a column of Arrow type ``dtype`` is stored as."""
    if isinstance(dtype, pa.ExtensionType):
        return _leaves(dtype.storage_type)
    if pa.types.is_dictionary(dtype):
        return _leaves(dtype.value_type)
    if pa.types.is_struct(dtype):
        return sum(_leaves(dtype.field(i).type) for i in range(dtype.num_fields))
    if pa.types.is_map(dtype):
        return _leaves(dtype.key_type) + _leaves(dtype.item_type)
    if isinstance(dtype, (pa.ListType, pa.LargeListType, pa.FixedSizeListType)):
        return _leaves(dtype.value_type)
    return 1


@dataclass(frozen=True)
class ParquetFileInfo:
    """One file of a source: where it is, what it holds, and its stamp (size, modification time).

    Args:
        path: the path inside the source's filesystem.
        size / mtime_ns: the file's size and modification time when it was listed (mtime None where
            the filesystem has none).
        row_groups: rows of each row group.
        partitions: hive partition values of its folders, outermost first.
        metadata: the parsed footer (column statistics for table sizes and checks).
    """

    path: str
    size: int
    mtime_ns: int | None
    row_groups: tuple[int, ...]
    partitions: tuple[tuple[str, str], ...] = ()
    metadata: pq.FileMetaData | None = field(default=None, compare=False, repr=False)

    @property
    def rows(self) -> int:
        return sum(self.row_groups)

    @property
    def schema(self) -> pa.Schema:
        if self.metadata is None:
            raise ValueError(f"{self.path}: the footer was not kept")
        return self.metadata.schema.to_arrow_schema()

    def column_stats(self, row_group: int, column: str) -> ColumnStats | None:
        """The footer's statistics of ``column`` in ``row_group``: its first leaf's column chunk (a list
        column's values); ``None`` when the footer was not kept or has no such column, all fields ``None``
        when the writer stored no statistics.

        Raises:
            ParquetFileError: text of the footer read here (the column chunks' paths, a string column's
                min/max) is not UTF-8. The footer parsed, so this is damage inside it (flipped bytes),
                which pyarrow reports as a ``UnicodeDecodeError`` naming no file.
        """
        meta = self.metadata
        if meta is None:
            return None
        try:
            j = self._first_leaves.get(column)
            if j is None:
                return None
            chunk = meta.row_group(row_group).column(j)
            path = chunk.path_in_schema
            if path != column and not path.startswith(column + "."):
                return None  # not the leaf the schema says: no statistics rather than another column's
            stats = chunk.statistics
            if stats is None:
                return ColumnStats(None, None, None, path != column)
            low, high = (stats.min, stats.max) if stats.has_min_max else (None, None)
            nulls = int(stats.null_count) if stats.has_null_count else None
        except ValueError as exc:  # UnicodeDecodeError; an ArrowInvalid or a value out of range from other damage
            damage = "holds text that is not UTF-8" if isinstance(exc, UnicodeDecodeError) else "cannot be decoded"
            raise ParquetFileError(
                f"the footer's metadata of this column {damage} ({exc}); the file is corrupt (damaged bytes): "
                "write or copy it again, or move it out of the data folder",
                path=self.path, row_group=row_group, column=column,
            ) from exc  # fmt: skip
        return ColumnStats(low, high, nulls, path != column)

    @cached_property
    def _first_leaves(self) -> dict[str, int]:
        """``{column: index of its first leaf column chunk}`` for the top-level columns whose name is unique.

        Found from the schema, not from the chunks' dotted paths: those are ambiguous (a column ``item.cat``
        has the path of a field ``cat`` nested in ``item``, and its path starts as ``item``'s does).
        """
        assert self.metadata is not None
        out: dict[str, int] = {}
        doubled: set[str] = set()
        leaf = 0
        for f in self.metadata.schema.to_arrow_schema():
            if f.name in out:
                doubled.add(f.name)
            else:
                out[f.name] = leaf
            leaf += _leaves(f.type)
        return {name: j for name, j in out.items() if name not in doubled}

    def check_unchanged(self, fs: pafs.FileSystem) -> None:
        """Raise :class:`ParquetFileChangedError` when the file's size or modification time differs now."""
        now = fs.get_file_info(self.path)
        mtime = now.mtime_ns if now.mtime is not None else None
        if now.type != pafs.FileType.File or now.size != self.size or mtime != self.mtime_ns:
            state = "is gone" if now.type != pafs.FileType.File else f"is now {now.size} bytes (was {self.size})"
            raise ParquetFileChangedError(
                f"the file changed while it was being read: it {state} or was modified (mtime {mtime} vs {self.mtime_ns}). "
                "Files must not be rewritten in place while training reads them: write new files (and rename them "
                "in), then restart or follow the folder",
                path=self.path,
            )


FileStamp = tuple[str, int]
"""``(path, size)`` of a listed file: what ranks compare their listings by (a file replaced in place between two
listings has the same path but, as a rule, another size; the time is not compared: each node's own copy of the
same files has its own)."""


def _no_files(path: str, listed: int, marker: str | None) -> str:
    """Why ``path`` gave no file, and what to do."""
    if listed and marker is not None:
        return (
            f"no complete Parquet files at {path!r}: {listed} file(s) there, but no folder holding them has the "
            f"marker file {marker!r} yet; mark a folder when its files are written (or drop marker)"
        )
    return (
        f"no Parquet files at {path!r}: give a file, a folder, a glob or a URI (names starting with '.' or "
        "'_' are skipped); convert TSV or CSV files with `lightrec data convert`"
    )


_FOOTER_TRIES = 3  # footer reads of a file that changes while it is read, before it is called unreadable


def _stamp(fs: pafs.FileSystem, path: str) -> tuple[int | None, int | None]:
    """``(size, mtime_ns)`` of ``path`` now (mtime None where the filesystem has none)."""
    stat = fs.get_file_info(path)
    return stat.size, stat.mtime_ns if stat.mtime is not None else None


def read_file_info(fs: pafs.FileSystem, path: str) -> ParquetFileInfo:
    """Stat and read the footer of one file (:class:`ParquetFileError` when it is not readable).

    The file is stamped before and after its footer is read, and the two must agree: a writer writing it in
    place can finish (or rewrite it) in between, and a stamp of the file as it was before would not be the
    stamp of the footer kept -- the complete file would then be refused as changed when its rows are read.
    A file that keeps changing over ``_FOOTER_TRIES`` reads is a :class:`ParquetFileError` (a following
    loader lists it again at its next polls).
    """
    for _ in range(_FOOTER_TRIES):
        before = _stamp(fs, path)
        meta = open_parquet(fs, path).metadata
        if _stamp(fs, path) == before:
            break
    else:
        raise ParquetFileError(
            f"the file changed while its footer was read, {_FOOTER_TRIES} times: it is still being written in place. "
            "Publish files whole (write under a hidden name, then rename), or mark their folder when they are "
            "written (marker='_SUCCESS')",
            path=path,
        )
    size, mtime_ns = before
    rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    return ParquetFileInfo(
        path=path, size=int(size or 0), mtime_ns=mtime_ns, row_groups=rows, partitions=partitions_of(path),
        metadata=meta,
    )  # fmt: skip


class ParquetSource:
    """The files of one or more paths (module docstring), each with its footer.

    Args:
        path: a file, folder, glob or URI, or a list of them (all on one filesystem).
        filesystem: a pyarrow filesystem to read from (default: from the path).
        marker: a file name (e.g. ``"_SUCCESS"``): only the files of folders that hold it are listed
            (:func:`complete_files`); None lists every file.
        unmarked: paths (of ``path``) whose files are listed without ``marker``: fixed selections beside a
            followed folder (``val=`` / ``test=`` paths, which nothing marks).

    Raises:
        FileNotFoundError: no (complete) file matches one of the paths.
        ParquetFileError: a file is not readable Parquet.
    """

    def __init__(
        self,
        path: str | Sequence[str],
        filesystem: pafs.FileSystem | None = None,
        marker: str | None = None,
        unmarked: Sequence[str] = (),
    ) -> None:
        paths = [path] if isinstance(path, str) else [str(p) for p in path]
        if not paths:
            raise ValueError("path must name at least one file, folder or glob, got an empty list")
        self.paths, self.marker = paths, marker
        fs = filesystem
        names: list[str] = []
        #: The paths inside the filesystem (what a following loader lists again).
        self.inner_paths: list[str] = []
        for p in paths:
            found_fs, inner = resolve_filesystem(p) if filesystem is None else (filesystem, p)
            fs = fs or found_fs
            self.inner_paths.append(inner)
            listed = list_files(fs, inner)
            needs = None if p in unmarked else marker
            found = complete_files(fs, listed, needs)
            if not found:
                raise FileNotFoundError(_no_files(p, len(listed), needs))
            names += found
        assert fs is not None
        self.filesystem: pafs.FileSystem = fs
        self.files: list[ParquetFileInfo] = [read_file_info(fs, name) for name in dict.fromkeys(sorted(names))]

    def stamps(self) -> list[FileStamp]:
        """``(path, size)`` of every file, in order: what another rank's listing is compared by (not the
        modification time: copies of the same files on each node's own disk have the same paths and sizes
        but their own times)."""
        return [(f.path, f.size) for f in self.files]

    def with_files(self, stamps: Sequence[FileStamp]) -> ParquetSource:
        """This source with exactly the files of ``stamps`` (:meth:`stamps` of another rank's listing of the
        same paths), in that order (:func:`~lightrec.data.parquet.ranks.agree_on_files`). The footers this
        source holds of files of the same size are kept, the others read now.

        Raises:
            ParquetFileChangedError: a file here has another size than ``stamps`` names: replaced or still
                being written in place while the ranks listed it.
            ParquetFileError / FileNotFoundError: a file cannot be read here.
        """
        held = {(f.path, f.size): f for f in self.files}
        files = []
        for path, size in stamps:
            info = held.get((path, size)) or read_file_info(self.filesystem, path)
            if info.size != size:
                raise ParquetFileChangedError(
                    f"another rank listed it as {size} bytes, this rank reads {info.size}: it was replaced or "
                    "written in place while the ranks started. Publish files whole (write under a hidden name, then "
                    "rename) so that every rank reads the same ones",
                    path=path,
                )  # fmt: skip
            files.append(info)
        other = copy.copy(self)
        other.files = files
        return other

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def schema(self) -> pa.Schema:
        """The first file's Arrow schema."""
        return self.files[0].schema

    def describe(self) -> SourceSummary:
        """Files, row groups and rows, for logs and ``lightrec data inspect``."""
        return {
            "files": len(self.files),
            "row_groups": sum(len(f.row_groups) for f in self.files),
            "rows": self.rows,
            "bytes": sum(f.size for f in self.files),
        }
