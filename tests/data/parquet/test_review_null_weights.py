"""A weighted feature's rows without ids: null ids with null weights (an outer join's missing rows) are an
empty bag under ``nulls="empty"``, and a null weights list is named as weights, not as ids."""

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


def _loader(tmp_path: Path, tags: list, weights: list, **options: object) -> ParquetLoader:
    table = pa.table(
        {
            "label": pa.array([1, 0, 1, 0], pa.int8()),
            "tags": pa.array(tags, pa.list_(pa.int64())),
            "tag_w": pa.array(weights, pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet")
    source = ParquetSource(str(tmp_path))
    sparse = {"tags": {"weights": "tag_w", **options}}
    spec = size_tables(source, build_spec(source.schema, str(tmp_path), "label", dense=[], sparse=sparse))
    return ParquetLoader(source, spec, slices_of(source.files), batch_size=4)


def test_null_ids_with_null_weights_are_an_empty_bag_with_nulls_empty(tmp_path: Path) -> None:
    loader = _loader(tmp_path, [[1, 2], None, [], [4]], [[0.5, 0.25], None, [], [2.0]], nulls="empty")
    (batch,) = list(loader)
    kjt = batch.sparse_features
    assert kjt.lengths().tolist() == [2, 0, 0, 1]
    assert kjt.values().tolist() == [1, 2, 4]
    assert kjt.weights().tolist() == [0.5, 0.25, 2.0]


def test_null_weights_beside_ids_are_named_as_weights(tmp_path: Path) -> None:
    loader = _loader(tmp_path, [[1, 2], [3], [], [4]], [[0.5, 0.25], None, [], [2.0]], nulls="empty")
    with pytest.raises(ParquetValueError, match="has 1 ids but 0 weights") as error:
        list(loader)
    assert (error.value.column, error.value.row) == ("tag_w", 1)


def test_a_null_weights_list_is_a_weights_error_without_nulls_empty(tmp_path: Path) -> None:
    loader = _loader(tmp_path, [[1, 2], [], [], [4]], [[0.5, 0.25], None, [], [2.0]])
    with pytest.raises(ParquetValueError, match="null list of weights of feature 'tags'") as error:
        list(loader)
    assert (error.value.column, error.value.row) == ("tag_w", 1)
    assert "null list of ids" not in str(error.value)
