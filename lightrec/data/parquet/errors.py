"""Typed errors for bad Parquet data, and the count of rows that ``on_error="skip"`` left out.

Every error names where the problem is -- the file, the row group, the column, the row and the
value -- and what to do about it::

    ParquetValueError: data/day=3/part-0.parquet, row group 2, column 'cat_7', row 1234 (row 525522
    of the file): negative id -5. Ids index embedding rows and must be >= 0: fix the writer, or map
    raw ids with id_mapping='hash' (any int64) ...

The classes (all :class:`~lightrec.data.DataFormatError`, so one ``except`` catches every reader's
bad data):

* :class:`ParquetSchemaError` -- a column is missing or has a type the feature cannot read;
* :class:`ParquetValueError` -- a bad value: a negative or out-of-range id, a null id or label, a
  label outside {0, 1} for binary cross-entropy, an infinite dense value;
* :class:`ParquetFileError` -- a file that is truncated, corrupt or cannot be read;
* :class:`ParquetFileChangedError` -- a file that changed (size or modification time) after the
  source listed it.

With ``on_error="skip"`` a :class:`ParquetValueError` is not raised: the row is left out of its batch
and counted in a :class:`SkippedRows` (the count, and the first few messages, for the log and
TensorBoard). Schema and file errors are never skipped: they are not about a row.

Loader workers re-raise an error in the training process as ``type(error)(text)``, so every class
also takes a single message.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TypedDict

from lightrec.data.errors import DataFormatError

__all__ = [
    "ParquetDataError",
    "ParquetFileChangedError",
    "ParquetFileError",
    "ParquetSchemaError",
    "ParquetValueError",
    "SkippedRows",
    "where",
]

logger = logging.getLogger(__name__)


def where(
    path: str,
    row_group: int | None = None,
    column: str | None = None,
    row: int | None = None,
    file_row: int | None = None,
) -> str:
    """``path, row group g, column 'c', row r (row f of the file)``: the parts that are known."""
    parts = [path]
    if row_group is not None:
        parts.append(f"row group {row_group}")
    if column is not None:
        parts.append(f"column {column!r}")
    if row is not None:
        of_file = f" (row {file_row} of the file)" if file_row is not None and file_row != row else ""
        parts.append(f"row {row}{of_file}")
    return ", ".join(parts)


class ParquetDataError(DataFormatError):
    """Bad Parquet data (the base class; see the module docstring).

    Args:
        message: what is wrong and the fix; the location is put in front of it.
        path: the file.
        row_group: the row group of the file, when the problem is inside one.
        column: the column.
        row: the row within the row group.
        file_row: the row within the file.
        value: the bad value.

    Attributes:
        path, row_group, column, row, value: as given (``line`` is ``file_row``, or 0).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str = "",
        row_group: int | None = None,
        column: str | None = None,
        row: int | None = None,
        file_row: int | None = None,
        value: object = None,
    ) -> None:
        self.row_group, self.column, self.row, self.value = row_group, column, row, value
        self.file_row = file_row
        self._message = message
        text = f"{where(path, row_group, column, row, file_row)}: {message}" if path else message
        # DataFormatError's one-message form sets path/line/reason; ours are set after it.
        super().__init__(text)
        self.path, self.line, self.reason = path, file_row or 0, message

    def __reduce__(self) -> tuple[object, ...]:
        # A worker's error crosses a process boundary pickled: keep every attribute.
        fields: _ErrorFields = dict(
            path=self.path, row_group=self.row_group, column=self.column, row=self.row,
            file_row=self.file_row, value=self.value,
        )  # fmt: skip
        return (_rebuild, (type(self), self._message, fields))


class _ErrorFields(TypedDict):
    """:class:`ParquetDataError`'s keyword arguments, as pickled by ``__reduce__``."""

    path: str
    row_group: int | None
    column: str | None
    row: int | None
    file_row: int | None
    value: object


def _rebuild(cls: type[ParquetDataError], message: str, fields: _ErrorFields) -> ParquetDataError:
    return cls(message, **fields)


class ParquetSchemaError(ParquetDataError):
    """A column the features need is missing from a file, or has a type they cannot read."""


class ParquetValueError(ParquetDataError):
    """A bad value in a row (skippable with ``on_error="skip"``)."""


class ParquetFileError(ParquetDataError):
    """A file that is truncated, corrupt or cannot be read at all."""


class ParquetFileChangedError(ParquetDataError):
    """A file whose size or modification time changed after the source listed it."""


@dataclass
class SkippedRows:
    """Rows left out under ``on_error="skip"``: how many, and the first messages.

    Args:
        count: rows skipped so far.
        examples: the first ``keep`` messages (file, row group, column, row, value).
        keep: how many messages to keep.
    """

    count: int = 0
    examples: list[str] = field(default_factory=list)
    keep: int = 5

    def add(self, count: int, examples: list[str]) -> None:
        """Count ``count`` more skipped rows; keep their messages while there is room."""
        self.count += count
        room = self.keep - len(self.examples)
        if room > 0:
            self.examples.extend(examples[:room])

    def log(self, what: str) -> None:
        """One warning with the count and the first messages (nothing when no row was skipped)."""
        if self.count:
            logger.warning(
                "%s: skipped %d bad row(s) (on_error='skip'); first ones: %s", what, self.count, "; ".join(self.examples)
            )
