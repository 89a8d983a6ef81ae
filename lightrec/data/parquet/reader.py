"""Reading one unit of a plan: the rows of its block's row groups, in the block's order, as an Arrow table.

A loader worker (or the training process, with ``num_workers=0``) keeps the files it opened
(:class:`BlockReader`, up to 16 at a time) and reads whole row groups -- only the columns the feature
spec needs, single-threaded (``use_threads=False``: one loader worker is one core) and with the
column chunks of a row group fetched in one go (pre-buffering; it matters on object stores). A
shuffled block's rows are permuted with its seed; a unit then takes its range of them.

Before a local file's row group is read, the file's size and modification time are compared with
those the source listed (:class:`~lightrec.data.parquet.errors.ParquetFileChangedError`); on other
filesystems this is done once per file, when it is opened. Files are not memory-mapped: a file cut
short under a memory map kills the reading process with SIGBUS instead of raising an error.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lightrec.data.parquet.errors import ParquetFileError
from lightrec.data.parquet.sharding import Slice, Unit
from lightrec.data.parquet.source import ParquetFileInfo

__all__ = ["BlockReader", "RowLocation", "UnitRows"]

_OPEN_FILES = 16


@dataclass(frozen=True)
class RowLocation:
    """Where a row of a unit comes from (for error messages)."""

    path: str
    row_group: int
    row: int
    file_row: int


@dataclass
class UnitRows:
    """The rows of one unit as a table, and how to find where each row came from.

    Args:
        table: the unit's rows, in order.
        unit: the unit.
        order: the block rows the table's rows are (a shuffled block), or None (rows ``lo..hi`` in order).
        files: the source's files (for :meth:`locate`).
    """

    table: pa.Table
    unit: Unit
    order: np.ndarray | None
    files: Sequence[ParquetFileInfo]

    def locate(self, i: int) -> RowLocation:
        """File, row group and row of the table's row ``i``."""
        j = int(self.order[i]) if self.order is not None else self.unit.lo + i
        for s in self.unit.block.slices:
            if j < s.rows:
                info = self.files[s.file]
                row = s.lo + j
                return RowLocation(info.path, s.row_group, row, sum(info.row_groups[: s.row_group]) + row)
            j -= s.rows
        raise IndexError(f"row {i} is outside the unit ({self.unit.rows} rows)")


class BlockReader:
    """Reads units' rows from the source's files (module docstring).

    Args:
        filesystem: the source's filesystem.
        files: the source's files (a unit's slices index them; kept as given, so a following
            loader can append the files that arrive).
        columns: the columns to read.
    """

    def __init__(self, filesystem: pafs.FileSystem, files: Sequence[ParquetFileInfo], columns: Sequence[str]) -> None:
        self.filesystem = filesystem
        self.files = files if isinstance(files, list) else list(files)
        self.columns = list(columns)
        self._open: OrderedDict[int, pq.ParquetFile] = OrderedDict()
        self._local = isinstance(filesystem, pafs.LocalFileSystem)

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()  # open files stay in the process that opened them
        return state

    def _file(self, index: int) -> pq.ParquetFile:
        handle = self._open.get(index)
        if handle is not None:
            self._open.move_to_end(index)
            return handle
        info = self.files[index]
        info.check_unchanged(self.filesystem)
        try:
            source = info.path if self._local else self.filesystem.open_input_file(info.path)
            handle = pq.ParquetFile(source, metadata=info.metadata, pre_buffer=True)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ParquetFileError(f"cannot open the file ({exc})", path=info.path) from exc
        self._open[index] = handle
        if len(self._open) > _OPEN_FILES:
            self._open.popitem(last=False)
        return handle

    def read_slice(self, piece: Slice) -> pa.Table:
        """The slice's rows of its row group (only the reader's columns)."""
        info = self.files[piece.file]
        handle = self._file(piece.file)
        if self._local:
            info.check_unchanged(self.filesystem)
        try:
            table = handle.read_row_group(piece.row_group, columns=self.columns, use_threads=False)
        except (pa.ArrowInvalid, OSError) as exc:
            info.check_unchanged(self.filesystem)  # a changed file explains the failure better
            raise ParquetFileError(
                f"cannot read the row group ({exc}); the file is truncated or corrupt: write or copy it again",
                path=info.path, row_group=piece.row_group,
            ) from exc  # fmt: skip
        if table.num_rows != info.row_groups[piece.row_group]:
            raise ParquetFileError(
                f"the row group has {table.num_rows} rows but its footer says {info.row_groups[piece.row_group]}; "
                "the file is corrupt: write it again",
                path=info.path, row_group=piece.row_group,
            )  # fmt: skip
        return table if piece.rows == table.num_rows else table.slice(piece.lo, piece.rows)

    def read(self, unit: Unit) -> UnitRows:
        """The unit's rows: its block's slices concatenated, permuted with the block's seed, cut to the unit."""
        tables = [self.read_slice(s) for s in unit.block.slices]
        if any(t.schema != tables[0].schema for t in tables[1:]):
            tables = [_signed_ids(t) for t in tables]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")
        if unit.block.seed is None:
            rows = table if unit.rows == table.num_rows else table.slice(unit.lo, unit.rows)
            return UnitRows(rows, unit, None, self.files)
        order = np.random.default_rng(unit.block.seed).permutation(unit.block.rows)[unit.lo : unit.hi]
        return UnitRows(table.take(pa.array(order)), unit, order, self.files)


def _signed_ids(table: pa.Table) -> pa.Table:
    """``uint64`` columns, and lists of them, as ``int64`` with the same bits, as one file's are read
    (``columns._int64``): promoting a ``uint64`` and an ``int64`` file's slices to one type refuses a value
    above ``2**63 - 1``, which ``id_mapping="hash"`` takes as a raw id (and the id checks name for the others)."""
    fields, changed = [], False
    for f in table.schema:
        kind = f.type
        if pa.types.is_uint64(kind):
            f, changed = f.with_type(pa.int64()), True
        elif pa.types.is_list(kind) and pa.types.is_uint64(kind.value_type):
            f, changed = f.with_type(pa.list_(pa.int64())), True
        elif pa.types.is_large_list(kind) and pa.types.is_uint64(kind.value_type):
            f, changed = f.with_type(pa.large_list(pa.int64())), True
        fields.append(f)
    return table.cast(pa.schema(fields), safe=False) if changed else table
