"""Column statistics belong to their own column: a column whose name is another's followed by a dot
(``item.cat`` before ``item``, as flattened struct columns are named) does not lend it its statistics."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightrec.data.parquet import (
    ParquetLoader,
    ParquetSource,
    ParquetValueError,
    build_spec,
    size_tables,
    slices_of,
)


def _write(tmp_path: Path) -> ParquetSource:
    table = pa.table(
        {
            "label": pa.array([1, 0, 1, 0], pa.int8()),
            "item.cat": pa.array([0, 1, 0, 1]),  # listed first: a prefix match would take its statistics
            "item": pa.array([5, 17, 3, 9]),
            "tags.list": pa.array([0, 1, 1, 0]),
            "tags": pa.array([[4, 30], [], [2], [7]], pa.list_(pa.int32())),
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet")
    return ParquetSource(str(tmp_path))


def test_a_table_is_sized_from_its_own_column_statistics(tmp_path: Path) -> None:
    source = _write(tmp_path)
    spec = size_tables(source, build_spec(source.schema, str(tmp_path), "label", sparse=["item", "tags"]))
    assert [f.num_embeddings for f in spec.sparse] == [18, 31]
    stats = source.files[0].column_stats(0, "item")
    assert stats is not None and (stats.min, stats.max, stats.nested) == (3, 17, False)
    stats = source.files[0].column_stats(0, "tags")
    assert stats is not None and (stats.min, stats.max, stats.nested) == (2, 30, True)


@pytest.mark.parametrize("column", ["item", "tags"])
def test_ids_past_a_declared_table_are_refused_despite_a_neighbours_statistics(tmp_path: Path, column: str) -> None:
    source = _write(tmp_path)
    spec = build_spec(source.schema, str(tmp_path), "label", sparse={column: {"num_embeddings": 2}})
    loader = ParquetLoader(source, spec, slices_of(source.files), batch_size=4)
    with pytest.raises(ParquetValueError, match="out of range for its table of 2 rows") as error:
        list(loader)
    assert error.value.column == column and str(tmp_path / "part-0.parquet") in str(error.value)
