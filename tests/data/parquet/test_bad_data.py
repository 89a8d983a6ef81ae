"""Every kind of bad data gets a typed error naming file, row group, column, row and value, with the fix;
``on_error="skip"`` leaves bad rows out, counts them, and never skips silently."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightrec.data import DataFormatError
from lightrec.data.parquet import (
    ParquetFileChangedError,
    ParquetFileError,
    ParquetLoader,
    ParquetSchemaError,
    ParquetSource,
    ParquetValueError,
    build_spec,
    size_tables,
    slices_of,
)


def _table(rows: int = 40, **columns: Any) -> pa.Table:
    rng = np.random.default_rng(0)
    data = {
        "label": pa.array(rng.integers(0, 2, rows).astype(np.int8)),
        "price": pa.array(rng.random(rows)),
        "user": pa.array(rng.integers(0, 10, rows)),
        "items": pa.array([[1, 2], [], [3]] * (rows // 3) + [[4]] * (rows % 3), pa.list_(pa.int64())),
    }
    data.update(columns)
    return pa.table(data)


def _write(path: Path, table: pa.Table, row_group_size: int = 16, **options: Any) -> Path:
    pq.write_table(table, path, row_group_size=row_group_size, **options)
    return path


def _read(path: Path, batch_size: int = 8, on_error: str = "raise", **spec: Any) -> ParquetLoader:
    source = ParquetSource(str(path))
    options: dict[str, Any] = {"dense": ["price"], "sparse": ["user", "items"], **spec}
    built = size_tables(source, build_spec(source.schema, str(path), "label", **options))
    loader = ParquetLoader(source, built, slices_of(source.files), batch_size, on_error=on_error)  # type: ignore[arg-type]
    list(loader)
    return loader


def _source_spec(path: Path) -> tuple[ParquetSource, Any, list[Any]]:
    source = ParquetSource(str(path))
    spec = size_tables(source, build_spec(source.schema, str(path), "label", ["price"], ["user", "items"]))
    return source, spec, slices_of(source.files)


def _with(values: list[Any], at: int, value: Any, dtype: pa.DataType) -> pa.Array:
    values = list(values)
    values[at] = value
    return pa.array(values, dtype)


def test_a_missing_column_names_the_file_and_the_columns(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.parquet", _table().drop_columns(["user"]))
    with pytest.raises(ParquetSchemaError, match=r"a\.parquet, column 'user': sparse feature 'user' reads column 'user', which the "
                       r"file does not have; its columns are \['label', 'price', 'items'\]") as info:
        _read(path)
    assert info.value.column == "user" and isinstance(info.value, DataFormatError)


def test_a_mistyped_column_says_what_it_needs(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.parquet", _table(user=pa.array(["u1"] * 40)))
    with pytest.raises(ParquetSchemaError, match=r"needs integer ids or lists of integer ids, but the column is string"):
        _read(path)
    with pytest.raises(ParquetSchemaError, match=r"dense features must be numbers, but the column is string"):
        _read(_write(tmp_path / "b.parquet", _table(price=pa.array(["x"] * 40))))


def test_a_second_file_with_another_schema_is_refused_before_reading(tmp_path: Path) -> None:
    from lightrec.data import ParquetDataModule

    (tmp_path / "d").mkdir()
    _write(tmp_path / "d" / "0.parquet", _table())
    _write(tmp_path / "d" / "1.parquet", _table().drop_columns(["items"]))
    data = ParquetDataModule(str(tmp_path / "d"), dense=["price"], sparse=["user", "items"])
    with pytest.raises(ParquetSchemaError, match=r"1\.parquet, column 'items': sparse feature 'items' reads column 'items'"):
        data.check_data()


@pytest.mark.parametrize(
    ("column", "second", "types"),
    [
        ("user", pa.array([[1]] * 40, pa.list_(pa.int64())), r"list<element: int64> \(list of number\) here but int64 \(number\)"),
        ("label", pa.array([False, True] * 20), r"bool \(bool\) here but int8 \(number\)"),
        ("items", pa.array([1] * 40, pa.int64()), r"int64 \(number\) here but list<element: int64> \(list of number\)"),
    ],
)
def test_a_column_of_another_kind_in_a_later_file_is_refused_before_reading(
    tmp_path: Path, column: str, second: pa.Array, types: str
) -> None:
    from lightrec.data import ParquetDataModule

    _write(tmp_path / "0.parquet", _table())
    _write(tmp_path / "1.parquet", _table(**{column: second}))
    data = ParquetDataModule(str(tmp_path), dense=["price"], sparse=["user", "items"], shuffle=True, shuffle_window=2)
    with pytest.raises(ParquetSchemaError, match=rf"1\.parquet, column '{column}': the column is {types} in .*0\.parquet, "
                       r"the first file; every file must give a column the same kind: write the files with one schema") as info:
        data.check_data()  # footers only: before any row is read (a concat of the two would raise ArrowTypeError)
    assert info.value.column == column


def test_types_of_one_kind_mix_across_files(tmp_path: Path) -> None:
    from lightrec.data import ParquetDataModule

    _write(tmp_path / "0.parquet", _table())
    wider = {"label": pa.array([0.0, 1.0] * 20), "price": pa.array(range(40), pa.int32()),
             "user": pa.array([3] * 40, pa.int8()), "items": pa.array([[2]] * 40, pa.large_list(pa.int32()))}
    _write(tmp_path / "1.parquet", _table(**wider))
    data = ParquetDataModule(str(tmp_path), dense=["price"], sparse=["user", "items"], batch_size=8, shuffle=True,
                             shuffle_window=4)
    assert sum(b.batch_size for b in data.train_dataloader()) == 80


def test_a_negative_id_names_file_row_group_column_row_and_value(tmp_path: Path) -> None:
    users = _table().column("user").to_pylist()
    path = _write(tmp_path / "a.parquet", _table(user=_with(users, 21, -5, pa.int64())))
    with pytest.raises(ParquetValueError) as info:
        _read(path, num_embeddings=None)
    error = info.value
    assert (error.row_group, error.column, error.row, error.file_row, error.value) == (1, "user", 5, 21, -5)
    assert str(error).startswith(f"{path}, row group 1, column 'user', row 5 (row 21 of the file): negative id -5")
    assert "id_mapping='hash'" in str(error) and "on_error='skip'" in str(error)


def test_a_uint64_id_above_the_int64_range_is_named_by_its_own_value(tmp_path: Path) -> None:
    big = 2**63 + 5  # read as int64 bits it is negative: the message must not show a value the file lacks
    users = _table().column("user").to_pylist()
    path = _write(tmp_path / "a.parquet", _table(user=_with(users, 21, big, pa.uint64())))
    with pytest.raises(ParquetValueError, match=rf"row 5 .*: id {big} in feature 'user' is above 2\*\*63 - 1") as info:
        _read(path, num_embeddings=100, id_mapping="managed")
    assert "id_mapping='hash'" in str(info.value)
    _read(path, num_embeddings=100, id_mapping="hash")  # any 64-bit id is a raw id to hash


@pytest.mark.parametrize("id_mapping", ["hash", "managed"])
def test_a_uint64_file_and_an_int64_file_mix_in_one_shuffled_unit(tmp_path: Path, id_mapping: str) -> None:
    from lightrec.data import ParquetDataModule

    big = 2**63 + 5
    _write(tmp_path / "0.parquet", _table(user=pa.array([1] * 40, pa.int64())))
    _write(tmp_path / "1.parquet", _table(user=pa.array([2] * 39 + [big], pa.uint64())))
    data = ParquetDataModule(str(tmp_path), dense=["price"], sparse=["user", "items"], batch_size=8, shuffle=True,
                             shuffle_window=4, num_embeddings=100, id_mapping=id_mapping)  # type: ignore[arg-type]
    if id_mapping == "hash":  # before: pyarrow's ArrowInvalid from promoting the slices to one type
        assert sum(b.batch_size for b in data.train_dataloader()) == 80
        return
    with pytest.raises(ParquetValueError, match=r"1\.parquet, row group 2, column 'user', row 7 \(row 39 of the file\)"):
        list(data.train_dataloader())


def test_an_id_beyond_the_declared_table_is_out_of_range(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.parquet", _table())
    with pytest.raises(ParquetValueError, match=r"id \d of feature 'user' is out of range for its table of 5 rows"):
        _read(path, sparse={"user": {"num_embeddings": 5}, "items": "items"})
    items = _table().column("items").to_pylist()
    path = _write(tmp_path / "b.parquet", _table(items=_with(items, 30, [1, 99], pa.list_(pa.int64()))))
    with pytest.raises(ParquetValueError, match=r"row group 1, column 'items', row 14 .*id 99 of feature 'items'"):
        _read(path, sparse={"user": "user", "items": {"num_embeddings": 10}})


def test_null_ids_are_errors_unless_read_as_empty_bags(tmp_path: Path) -> None:
    users = _table().column("user").to_pylist()
    path = _write(tmp_path / "a.parquet", _table(user=_with(users, 3, None, pa.int64())))
    with pytest.raises(ParquetValueError, match=r"row 3: null id in feature 'user': set nulls='empty'"):
        _read(path)
    source = ParquetSource(str(path))
    spec = size_tables(source, build_spec(source.schema, str(path), "label", ["price"], ["user"], nulls="empty"))
    batch = next(iter(ParquetLoader(source, spec, slices_of(source.files), 8)))
    assert batch.sparse_features.lengths().tolist() == [1, 1, 1, 0, 1, 1, 1, 1]
    items = _table().column("items").to_pylist()
    path = _write(tmp_path / "b.parquet", _table(items=_with(items, 2, [4, None], pa.list_(pa.int64()))))
    with pytest.raises(ParquetValueError, match=r"row 2: null id inside the list of feature 'items'"):
        _read(path)


def test_labels_must_be_present_and_binary_for_bce(tmp_path: Path) -> None:
    labels = _table().column("label").to_pylist()
    path = _write(tmp_path / "a.parquet", _table(label=_with(labels, 7, None, pa.int8())))
    with pytest.raises(ParquetValueError, match=r"column 'label', row 7: null label"):
        _read(path)
    path = _write(tmp_path / "b.parquet", _table(label=_with([float(v) for v in labels], 9, 0.5, pa.float64())))
    with pytest.raises(ParquetValueError, match=r"row 9: label 0.5 is not 0 or 1.*binary_label=False"):
        _read(path)
    _read(path, binary_label=False)  # a regression target is fine when asked for
    flags = pa.array([bool(v) for v in labels])
    loader = ParquetLoader(*_source_spec(_write(tmp_path / "c.parquet", _table(label=flags))), batch_size=8)
    assert next(iter(loader)).labels.tolist() == [float(v) for v in labels[:8]]  # bools read as 0./1.


def test_an_infinite_dense_value_is_bad_and_nulls_are_filled(tmp_path: Path) -> None:
    prices = _table().column("price").to_pylist()
    path = _write(tmp_path / "a.parquet", _table(price=_with(prices, 12, float("inf"), pa.float64())))
    with pytest.raises(ParquetValueError, match=r"column 'price', row 12: dense value inf is infinite"):
        _read(path)


def test_weights_must_be_parallel_to_their_ids(tmp_path: Path) -> None:
    weights = pa.array([[0.5, 0.5], [], [1.0]] * 13 + [[2.0]], pa.list_(pa.float32()))
    bad = weights.to_pylist()
    bad[4] = [1.0, 2.0, 3.0]
    path = _write(tmp_path / "a.parquet", _table(w=pa.array(bad, pa.list_(pa.float32()))))
    with pytest.raises(ParquetValueError, match=r"column 'w', row 4: the row has 0 ids but 3 weights"):
        _read(path, sparse={"user": "user", "items": {"weights": "w"}})


def test_skip_drops_rows_whose_weights_mismatch_and_keeps_the_weights_of_the_others(tmp_path: Path) -> None:
    weights = [[0.5, 0.25], [], [0.75]] * 13 + [[2.0]]
    bad = list(weights)
    bad[4] = [1.0, 2.0, 3.0]  # row 4 has no ids
    path = _write(tmp_path / "a.parquet", _table(w=pa.array(bad, pa.list_(pa.float32()))))
    loader = _read(path, on_error="skip", sparse={"user": "user", "items": {"weights": "w"}})
    assert loader.skipped.count == 1 and "row 4: the row has 0 ids but 3 weights" in loader.skipped.examples[0]
    batches = list(loader)
    assert [b.batch_size for b in batches] == [7, 8, 8, 8, 8]  # row 4 left out of the first batch
    read = [w for b in batches for w in b.sparse_features["items"].weights().tolist()]
    assert read == [w for i, row in enumerate(weights) if i != 4 for w in row]  # not 1.0: the good rows keep theirs


def test_a_truncated_file_is_named_with_the_fix(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.parquet", _table())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ParquetFileError, match=r"a\.parquet: not a readable Parquet file .*truncated"):
        ParquetSource(str(path))


def test_a_corrupt_row_group_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.parquet", _table(rows=64), compression="snappy")
    source = ParquetSource(str(path))
    spec = size_tables(source, build_spec(source.schema, str(path), "label", ["price"], ["user", "items"]))
    meta = source.files[0].metadata
    column = meta.row_group(2).column(2)  # 'user' of row group 2
    data = bytearray(path.read_bytes())
    start = column.data_page_offset
    data[start : start + column.total_compressed_size] = os.urandom(column.total_compressed_size)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(source.files[0].mtime_ns, source.files[0].mtime_ns))  # the same stamp: not "changed"
    loader = ParquetLoader(source, spec, slices_of(source.files), 8)
    with pytest.raises(ParquetFileError, match=r"a\.parquet, row group 2: cannot read the row group"):
        list(loader)


def test_a_file_changed_while_read_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.parquet", _table())
    source = ParquetSource(str(path))
    spec = size_tables(source, build_spec(source.schema, str(path), "label", ["price"], ["user", "items"]))
    batches = iter(ParquetLoader(source, spec, slices_of(source.files), 8))
    next(batches)
    _write(path, _table(rows=48))  # rewritten in place
    with pytest.raises(ParquetFileChangedError, match=r"the file changed while it was being read.*write new files"):
        list(batches)


def test_skip_leaves_bad_rows_out_counts_them_and_keeps_the_steps(tmp_path: Path) -> None:
    users = _table().column("user").to_pylist()
    users[3], users[21] = -1, None
    path = _write(tmp_path / "a.parquet", _table(user=pa.array(users, pa.int64())))
    loader = _read(path, on_error="skip")
    assert loader.skipped.count == 2
    assert "row 3: negative id -1" in loader.skipped.examples[0] and "null id" in loader.skipped.examples[1]
    sizes = [b.batch_size for b in loader]
    assert sizes == [7, 8, 7, 8, 8]  # the batches that held a bad row are that much smaller; 5 steps still


def test_skip_works_in_loader_workers_and_reports_the_count(tmp_path: Path) -> None:
    users = _table(rows=64).column("user").to_pylist()
    users[40] = -3
    path = _write(tmp_path / "a.parquet", _table(rows=64, user=pa.array(users, pa.int64())))
    source = ParquetSource(str(path))
    spec = size_tables(source, build_spec(source.schema, str(path), "label", ["price"], ["user"]))
    counts: list[int] = []
    loader = ParquetLoader(source, spec, slices_of(source.files), 8, num_workers=2, on_error="skip")
    loader.on_skip = counts.append
    assert sum(b.batch_size for b in loader) == 63 and counts == [1]
    loader.part_rows = 16  # handed over in parts: the same batches, the bad row counted once
    assert [b.batch_size for b in loader] == [8] * 5 + [7] + [8] * 2 and counts == [1, 2]


def test_a_batch_of_bad_rows_only_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.parquet", _table(rows=16, user=pa.array([-1] * 8 + [1] * 8)))
    with pytest.raises(ParquetValueError, match=r"every row of batch 0 was bad and skipped"):
        _read(path, on_error="skip")


def test_skipped_rows_are_logged_to_tensorboard(tmp_path: Path) -> None:
    import lightning.pytorch as pl
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lightrec.data import ParquetDataModule
    from lightrec.lightning import RecModule
    from lightrec.models import DLRM
    from lightrec.modules import EmbeddingBagCollection

    users = _table(rows=64).column("user").to_pylist()
    users[5] = -2
    _write(tmp_path / "a.parquet", _table(rows=64, user=pa.array(users, pa.int64())))
    data = ParquetDataModule(str(tmp_path / "a.parquet"), dense=["price"], sparse=["user"], batch_size=16, on_error="skip")

    class Tiny(RecModule):
        def __init__(self) -> None:
            super().__init__()
            ebc = EmbeddingBagCollection(data.table_configs(4))
            self.model = DLRM(embedding_bag_collection=ebc, dense_in_features=1, dense_arch_layer_sizes=[4],
                              over_arch_layer_sizes=[1])  # fmt: skip

        def forward(self, dense: Any, sparse: Any) -> Any:
            return self.model(dense, sparse)

    logger = pl.loggers.TensorBoardLogger(str(tmp_path), name="tb")
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=4, logger=logger, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    trainer.fit(Tiny(), datamodule=data)
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert [s.value for s in events.Scalars("data/train_skipped_rows")] == [1.0]
