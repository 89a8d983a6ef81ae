"""A file written in place whose write finishes between the stat and the footer read of a listing: its footer is the
complete file's, so the stamp kept with it must be too (found in review: the partial file's size was kept, and the
complete, valid file was refused as changed while read -- ParquetFileChangedError, training stopped)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from lightrec.data.parquet import FollowingParquetLoader, FollowOptions, ParquetSource, build_spec
from lightrec.data.parquet import source as source_module
from tests.data.parquet.helpers import event_table

POLL = FollowOptions(poll_interval=0.02, idle_timeout=0.3)


def _parquet_bytes(start: int, rows: int) -> bytes:
    sink = io.BytesIO()
    pq.write_table(event_table(rows, seed=start, start=start), sink, row_group_size=16)
    return sink.getvalue()


def test_a_file_finished_between_the_stat_and_the_footer_read_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "part-00.parquet").write_bytes(_parquet_bytes(0, 20))
    source = ParquetSource(str(tmp_path))
    spec = build_spec(source.schema, str(tmp_path), "label", ["row"], ["scalar"])
    loader = FollowingParquetLoader(source, spec, 10, follow=POLL)

    late = tmp_path / "part-01.parquet"
    whole = _parquet_bytes(20, 30)
    late.write_bytes(whole[: len(whole) // 2])  # a writer in the middle of writing it in place
    opened = source_module.open_parquet

    def finishing_open(fs: pafs.FileSystem, path: str) -> Any:
        if path == str(late) and late.stat().st_size != len(whole):
            late.write_bytes(whole)  # the writer finishes after the listing's stat, before its footer read
        return opened(fs, path)

    monkeypatch.setattr(source_module, "open_parquet", finishing_open)
    rows = [int(r) for b in loader for r in b.dense_features[:, 0].tolist()]
    assert rows == list(range(50))
