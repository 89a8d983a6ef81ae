"""A corrupt footer whose names are not UTF-8 is a ``ParquetFileError`` naming the file -- also when it lands in a
followed folder mid-stream (found in review: pyarrow's ``UnicodeDecodeError`` escaped, naming no file, and a following
loader stopped at once instead of giving the file the polls an unreadable one gets)."""

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
    ParquetSource,
    build_spec,
)
from tests.data.parquet.helpers import event_table

POLL = FollowOptions(poll_interval=0.02, idle_timeout=0.3)


def _corrupt_names(start: int, rows: int) -> bytes:
    """A Parquet file whose footer names a column with bytes that are not UTF-8 (a column no feature reads)."""
    table = event_table(rows, seed=start, start=start).append_column("qqqqqq", pa.array([0] * rows))
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=16)
    data = sink.getvalue()
    assert b"qqqqqq" in data
    return data.replace(b"qqqqqq", b"\x94qqqqq")


def test_a_footer_with_names_that_are_not_utf8_is_a_file_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "part-00.parquet"
    bad.write_bytes(_corrupt_names(0, 20))
    with pytest.raises(ParquetFileError, match=r"part-00\.parquet: not a readable Parquet file"):
        ParquetSource(str(tmp_path))


def test_a_corrupt_footer_landing_mid_stream_stops_following_with_the_file_named(tmp_path: Path) -> None:
    pq.write_table(event_table(20, seed=0), tmp_path / "part-00.parquet", row_group_size=16)
    source = ParquetSource(str(tmp_path))
    spec = build_spec(source.schema, str(tmp_path), "label", ["row"], ["scalar"])
    loader = FollowingParquetLoader(source, spec, 10, follow=POLL)
    stream = iter(loader)
    next(stream)
    (tmp_path / "part-01.parquet").write_bytes(_corrupt_names(20, 20))
    with pytest.raises(ParquetFileError, match=r"part-01\.parquet: not a readable Parquet file"):
        list(stream)
