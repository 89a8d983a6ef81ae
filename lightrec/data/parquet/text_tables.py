"""Blocks of Criteo TSV or CSV lines -> Arrow tables, with bad lines named (file and line) or skipped.

Parsing is pyarrow's CSV reader (C++, vectorised): one call per block. Criteo's 26 categorical
columns are 32-bit hex strings; they become ``int64`` raw values here, parsed straight from the
string column's buffers with numpy (values of up to 16 hex digits, folded to 63 bits as lightrec's
Criteo preprocessing does; empty -> null). The Parquet schema of a Criteo input::

    label  int8      0 or 1
    int_0 .. int_12  int64, nullable (the counts, raw: read them with dense_transform="log1p")
    cat_0 .. cat_25  int64, nullable (raw values: read them with id_mapping="hash" or "modulo",
                     num_embeddings=..., nulls="empty")

A line with the wrong number of fields is reported by pyarrow with its number. A value pyarrow
cannot convert (``"abc"`` in an integer column) fails the whole block without one; the block is
then bisected -- parsed in halves, recursively -- to find each bad line, so a block with ``k`` bad
lines costs ``O(k log n)`` small parses. With ``on_error="skip"`` bad lines are left out and counted
(:class:`~lightrec.data.errors.LineErrors`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from lightrec.data import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
from lightrec.data.errors import LineErrors

__all__ = ["CRITEO_SCHEMA", "TextFormat", "hex_to_int64"]

CRITEO_SCHEMA = pa.schema(
    [pa.field("label", pa.int8())]
    + [pa.field(n, pa.int64()) for n in DEFAULT_INT_NAMES]
    + [pa.field(n, pa.int64()) for n in DEFAULT_CAT_NAMES]
)
_FOLD = np.uint64((1 << 63) - 1)
_HEX = np.full(256, 255, dtype=np.uint8)
for _c in range(10):
    _HEX[ord("0") + _c] = _c
for _c in range(6):
    _HEX[ord("a") + _c] = _HEX[ord("A") + _c] = 10 + _c


def hex_to_int64(strings: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Hex strings -> ``(int64 array, bad row mask)``: nulls stay null; a bad string is null and flagged.

    Works on the string column's buffers: the characters of all strings lie back to back in one
    buffer (nulls and empty strings take none), so when every string has the same width -- Criteo's
    are 8 hex digits -- they are one ``[m, width]`` matrix of digits, packed two to a byte and read as
    big-endian integers; otherwise each digit is weighted by its place and the strings summed
    (``np.add.reduceat``).
    """
    strings = strings.cast(pa.large_string()) if not pa.types.is_large_string(strings.type) else strings
    n = len(strings)
    valid = strings.is_valid().to_numpy(zero_copy_only=False) if strings.null_count else np.ones(n, dtype=bool)
    buffers = strings.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[strings.offset : strings.offset + n + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, dtype=np.uint8)
    lengths = np.diff(offsets)
    present = lengths > 0
    bad = present & (lengths > 16)
    nibbles = _HEX[data[offsets[0] : offsets[-1]]]
    values = np.zeros(n, dtype=np.uint64)
    widths = np.unique(lengths[present])
    if len(widths) == 1 and widths[0] <= 16:  # every string as wide: a matrix of digits
        width = int(widths[0])
        digits = nibbles.reshape(-1, width)
        bad[present] |= (digits == 255).any(axis=1)
        # Two digits make a byte; the bytes, left-padded to 1, 2, 4 or 8, are a big-endian integer.
        nbytes = 1 << max(int(np.ceil(np.log2(-(-width // 2)))), 0)
        padded = np.zeros((len(digits), 2 * nbytes), dtype=np.uint8)
        padded[:, 2 * nbytes - width :] = digits & 15
        packed = (padded[:, 0::2] << 4) | padded[:, 1::2]
        values[present] = np.ascontiguousarray(packed).view(f">u{nbytes}").reshape(-1).astype(np.uint64)
    elif nibbles.size:
        row_of = np.repeat(np.arange(n), lengths)
        bad[np.unique(row_of[nibbles == 255])] = True
        place = (np.repeat(offsets[1:], lengths) - np.arange(offsets[0], offsets[-1]) - 1).astype(np.uint64)
        terms = nibbles.astype(np.uint64) << (np.minimum(place, 15) * np.uint64(4))
        values[present] = np.add.reduceat(terms, offsets[:-1][present] - offsets[0])
    ok = valid & present & ~bad
    out = pa.array((values & _FOLD).astype(np.int64), mask=~ok)
    return out, bad


class TextFormat:
    """How lines of one kind of input become an Arrow table (module docstring).

    Args:
        kind: ``"criteo"`` (TSV, no header, 40 fields) or ``"csv"`` (a header line names the columns).
        delimiter: the field separator of CSV input.
        column_names: the CSV columns (from the header); column_types: their Arrow types (from the
            first block, unless given).
    """

    def __init__(
        self,
        kind: str,
        delimiter: str = ",",
        column_names: Sequence[str] | None = None,
        column_types: dict[str, pa.DataType] | None = None,
    ) -> None:
        if kind not in ("criteo", "csv"):
            raise ValueError(f"format must be 'criteo' or 'csv', got {kind!r}")
        self.kind = kind
        self.delimiter = "\t" if kind == "criteo" else delimiter
        if kind == "criteo":
            self.column_names = CRITEO_SCHEMA.names
            types = {n: t for n, t in zip(CRITEO_SCHEMA.names, CRITEO_SCHEMA.types)}
            self.column_types: dict[str, pa.DataType] | None = {**types, **{n: pa.string() for n in DEFAULT_CAT_NAMES}}
        else:
            self.column_names = list(column_names or [])
            self.column_types = dict(column_types) if column_types else None

    def _read(self, data: bytes, invalid: list[int], threads: bool = False) -> pa.Table:
        def on_invalid(row: pacsv.InvalidRow) -> str:
            invalid.append(int(row.number) if row.number is not None else -1)
            return "skip"

        return pacsv.read_csv(
            pa.py_buffer(data),
            read_options=pacsv.ReadOptions(column_names=self.column_names, use_threads=threads,
                                           block_size=1 << 30 if not threads else 1 << 22),
            parse_options=pacsv.ParseOptions(
                delimiter=self.delimiter, quote_char=self.kind == "csv" and '"', invalid_row_handler=on_invalid,
                ignore_empty_lines=False,  # an empty line is a bad line, and line numbers stay true
            ),
            convert_options=pacsv.ConvertOptions(column_types=self.column_types, strings_can_be_null=True),
        )  # fmt: skip

    def _empty(self) -> pa.Table:
        types = self.column_types or {}
        return pa.table({n: pa.array([], types.get(n, pa.string())) for n in self.column_names})

    def parse(self, data: bytes, path: str, first_line: int, errors: LineErrors) -> pa.Table:
        """The block's lines as a table; bad lines raised or skipped through ``errors``."""
        table, numbers = self._parse_lines(data, path, first_line, errors)
        if self.column_types is None:  # CSV: the first block fixes the types of all later ones
            self.column_types = {f.name: (pa.string() if pa.types.is_null(f.type) else f.type) for f in table.schema}
            table = table.cast(pa.schema([(n, t) for n, t in self.column_types.items()]))
        return self._finish(table, numbers, path, errors) if self.kind == "criteo" else table

    def _parse_lines(self, data: bytes, path: str, first_line: int, errors: LineErrors) -> tuple[pa.Table, np.ndarray]:
        """The lines' table and each row's line number (bad lines raised or skipped)."""
        invalid: list[int] = []
        try:
            # All cores parse; only a block with bad lines is parsed again on one, which numbers them.
            table = self._read(data, invalid, threads=True)
            if invalid:
                invalid = []
                table = self._read(data, invalid)
        except pa.ArrowInvalid as exc:
            lines = data.splitlines(keepends=True)
            if len(lines) <= 1:
                errors.bad_line(path, first_line, f"cannot convert a value ({_short(exc)})")
                return self._empty(), np.zeros(0, dtype=np.int64)
            half = len(lines) // 2
            head = self._parse_lines(b"".join(lines[:half]), path, first_line, errors)
            tail = self._parse_lines(b"".join(lines[half:]), path, first_line + half, errors)
            return pa.concat_tables([head[0], tail[0]]), np.concatenate([head[1], tail[1]])
        for number in invalid:
            errors.bad_line(path, first_line + number - 1, f"wrong number of fields (expected {len(self.column_names)})")
        numbers = np.arange(table.num_rows + len(invalid), dtype=np.int64) + first_line
        if invalid:
            numbers = np.delete(numbers, np.asarray(invalid) - 1)
        return table, numbers

    def _finish(self, table: pa.Table, numbers: np.ndarray, path: str, errors: LineErrors) -> pa.Table:
        """Criteo: check labels, turn the hex categoricals into int64 (bad values named or skipped)."""
        bad = np.zeros(table.num_rows, dtype=bool)
        labels = table.column("label").to_numpy(zero_copy_only=False)
        odd = ~np.isin(labels, (0, 1))
        columns = {}
        for name in DEFAULT_CAT_NAMES:
            column = table.column(name)
            values, not_hex = hex_to_int64(column.combine_chunks() if column.num_chunks != 1 else column.chunk(0))
            columns[name] = values
            bad |= not_hex
        bad |= odd
        for i in np.flatnonzero(bad):
            what = f"label {labels[i]!r} is not 0 or 1" if odd[i] else "a categorical value is not hex of at most 16 digits"
            errors.bad_line(path, int(numbers[i]), what)
        for name, values in columns.items():
            table = table.set_column(table.schema.get_field_index(name), name, values)
        table = table.cast(CRITEO_SCHEMA)
        return table.filter(pa.array(~bad)) if bad.any() else table


def _short(exc: Exception) -> str:
    text = str(exc).splitlines()[0]
    return text if len(text) < 200 else text[:200] + "..."

