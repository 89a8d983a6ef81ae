"""Text inside a row group's column metadata that is not UTF-8 (a column chunk's path, a string column's statistics;
what flipped bytes make of a footer that still parses) is a ``ParquetFileError`` naming the file, row group and
column -- when table sizes are read from the statistics, when a unit's statistics are checked while its rows are
read, and when such a file lands in a followed folder (found in review: pyarrow's ``UnicodeDecodeError`` escaped from
the statistics lookups, naming no file)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightrec.data.parquet import (
    FollowingParquetLoader,
    FollowOptions,
    ParquetFileError,
    ParquetLoader,
    ParquetSource,
    build_spec,
    size_tables,
    slices_of,
)
from lightrec.data.parquet.sizing import column_range
from tests.data.parquet.helpers import event_table

POLL = FollowOptions(poll_interval=0.02, idle_timeout=0.3)


def _footer_start(data: bytes) -> int:
    """Where the footer (the Thrift ``FileMetaData``) starts: its length is the 4 bytes before the closing magic."""
    return len(data) - 8 - int.from_bytes(data[-8:-4], "little")


def _with_bad_text(rows: int, text: bytes, start: int = 0) -> bytes:
    """A Parquet file whose footer parses (schema, row groups) but holds ``text`` with its first byte made 0x94 (not
    UTF-8) everywhere after the schema: in the column chunks' ``path_in_schema`` (a column name) or their
    statistics (a string value). The pages are untouched, so the rows themselves read fine."""
    table = event_table(rows, seed=start, start=start).append_column("note", pa.array(["zzzz"] * rows))
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=16)
    data = bytearray(sink.getvalue())
    footer = _footer_start(bytes(data))
    found = [i for i in range(footer, len(data)) if data.startswith(text, i)]
    schema_name = 1 if text != b"zzzz" else 0  # the schema's own element keeps the name: the footer must parse
    assert len(found) > schema_name, "the text is not in the footer"
    for i in found[schema_name:]:
        data[i] = 0x94
    handle = pq.ParquetFile(io.BytesIO(bytes(data)))  # the premise: the footer parses and the rows read
    assert handle.read_row_group(0).num_rows == 16
    return bytes(data)


def test_sizing_from_statistics_with_a_column_path_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "part-00.parquet").write_bytes(_with_bad_text(40, b"scalar"))
    source = ParquetSource(str(tmp_path))
    spec = build_spec(source.schema, str(tmp_path), "label", [], ["scalar"])
    # before: UnicodeDecodeError: 'utf-8' codec can't decode byte 0x94 (no file named)
    with pytest.raises(ParquetFileError, match=r"part-00\.parquet, row group 0, column 'scalar': .*not UTF-8"):
        size_tables(source, spec)


def test_id_ranges_over_string_statistics_that_are_not_utf8_name_the_file(tmp_path: Path) -> None:
    """``column_range`` (public; what ``lightrec data inspect`` builds on) reads a column's statistics whatever its type."""
    (tmp_path / "part-00.parquet").write_bytes(_with_bad_text(40, b"zzzz"))
    source = ParquetSource(str(tmp_path))
    # before: UnicodeDecodeError from the statistics' min
    with pytest.raises(ParquetFileError, match=r"part-00\.parquet, row group 0, column 'note': .*not UTF-8"):
        column_range(source, "note", scan=False)


def test_reading_rows_whose_column_path_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "part-00.parquet").write_bytes(_with_bad_text(40, b"scalar"))
    source = ParquetSource(str(tmp_path))
    spec = build_spec(source.schema, str(tmp_path), "label", [], ["scalar"], num_embeddings=100)
    loader = ParquetLoader(source, spec, slices_of(source.files), 8)
    # before: UnicodeDecodeError from the statistics check of the first unit's ids
    with pytest.raises(ParquetFileError, match=r"part-00\.parquet, row group 0, column 'scalar': .*write or copy"):
        list(loader)


def test_a_file_with_a_column_path_that_is_not_utf8_landing_mid_stream_stops_following_with_the_file_named(
    tmp_path: Path,
) -> None:
    pq.write_table(event_table(20, seed=0), tmp_path / "part-00.parquet", row_group_size=16)
    source = ParquetSource(str(tmp_path))
    spec = build_spec(source.schema, str(tmp_path), "label", ["row"], ["scalar"], num_embeddings=100)
    loader = FollowingParquetLoader(source, spec, 10, follow=POLL)
    stream = iter(loader)
    next(stream)
    (tmp_path / "part-01.parquet").write_bytes(_with_bad_text(20, b"scalar", start=20))
    with pytest.raises(ParquetFileError, match=r"part-01\.parquet"):
        list(stream)
