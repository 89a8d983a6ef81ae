"""``uint64`` ids above ``2**63 - 1`` with ``id_mapping="none"``: never a table sized from them, never read as the
negative int64 their bits make (found in review: a table of ``2**64`` rows, and negative ids in the batches)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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

_BIG = 2**63 + 5


def _write(path: Path, ids: pa.Array) -> ParquetSource:
    labels = pa.array(np.arange(len(ids)) % 2, pa.int8())
    pq.write_table(pa.table({"label": labels, "user": ids}), path)  # column statistics stored (pyarrow's default)
    return ParquetSource(str(path))


@pytest.mark.parametrize("kind", [pa.uint64(), pa.list_(pa.uint64())])
def test_a_table_is_not_sized_from_uint64_ids_above_the_int64_range(tmp_path: Path, kind: pa.DataType) -> None:
    values = [1, 2, _BIG, 3]
    ids = pa.array([[v] for v in values] if pa.types.is_list(kind) else values, kind)
    source = _write(tmp_path / "a.parquet", ids)
    spec = build_spec(source.schema, str(tmp_path), "label", [], ["user"])
    # before: num_embeddings = 2**64 (the statistics' max + 1), and the id read as a negative int64 in the batch
    with pytest.raises(ValueError, match=rf"feature 'user'.*largest id {_BIG}.*id_mapping='hash'"):
        size_tables(source, spec)


def test_a_declared_table_past_the_int64_range_still_refuses_uint64_ids_above_it(tmp_path: Path) -> None:
    source = _write(tmp_path / "a.parquet", pa.array([1, 2, _BIG, 3], pa.uint64()))
    spec = build_spec(source.schema, str(tmp_path), "label", [], ["user"], num_embeddings=2**64)
    loader = ParquetLoader(source, spec, slices_of(source.files), 2)
    # before: the statistics (max 2**63 + 5 < 2**64) skipped the id checks; the batch held -9223372036854775803
    with pytest.raises(ParquetValueError, match=rf"row 2: id {_BIG} in feature 'user' is above 2\*\*63 - 1"):
        list(loader)
