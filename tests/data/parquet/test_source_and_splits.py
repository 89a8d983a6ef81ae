"""Paths (file, folder with hive partitions, glob, list, fsspec URI), the feature spec, table sizing and splits."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from lightrec.data import ParquetDataModule
from lightrec.data.parquet import ParquetSource, build_spec, size_tables, split_slices
from lightrec.data.parquet.sharding import take_rows
from lightrec.data.parquet.sizing import column_range
from lightrec.data.parquet.source import list_files, names_file
from tests.data.parquet.helpers import event_table, write_events

LAYOUT = [
    ("day=01/part-0.parquet", 40, 16),
    ("day=01/part-1.parquet", 30, 16),
    ("day=02/part-0.parquet", 50, 16),
    ("day=03/part-0.parquet", 20, 16),
]


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    write_events(tmp_path / "logs", LAYOUT)
    (tmp_path / "logs" / "_SUCCESS").write_text("")
    (tmp_path / "logs" / "day=02" / ".part-9.parquet.tmp").write_bytes(b"half a file")
    (tmp_path / "logs" / "_temporary").mkdir()
    (tmp_path / "logs" / "_temporary" / "x.parquet").write_bytes(b"junk")
    return tmp_path / "logs"


def _names(source: ParquetSource) -> list[str]:
    return [f.path.split("logs/")[1] for f in source.files]


def test_paths_name_files_folders_globs_and_lists_skipping_hidden_names(logs: Path) -> None:
    everything = [name for name, _, _ in LAYOUT]
    assert _names(ParquetSource(str(logs))) == everything
    assert _names(ParquetSource(str(logs / "day=01" / "part-1.parquet"))) == ["day=01/part-1.parquet"]
    assert _names(ParquetSource(str(logs / "day=0[12]" / "*.parquet"))) == everything[:3]
    assert _names(ParquetSource(f"{logs}/**/part-0.parquet")) == [everything[0], everything[2], everything[3]]
    assert _names(ParquetSource([str(logs / "day=03"), str(logs / "day=01")])) == [*everything[:2], everything[3]]
    assert ParquetSource(str(logs)).files[2].partitions == (("day", "02"),)
    with pytest.raises(FileNotFoundError, match=r"no Parquet files at .*nowhere.*lightrec data convert"):
        ParquetSource(str(logs / "nowhere"))
    # As a shell glob: * stays inside one name, ** crosses any number of folders (none included).
    write_events(logs / "day=01" / "old", [("part-0.parquet", 10, 16)])
    assert _names(ParquetSource(f"{logs}/day=*/part-*.parquet")) == everything
    assert _names(ParquetSource(f"{logs}/day=01/**/part-0.parquet")) == ["day=01/old/part-0.parquet", everything[0]]
    assert _names(ParquetSource(f"{logs}/day=01/*")) == everything[:2]


@pytest.mark.parametrize(
    "path", ["", "day=01", "day=01/", "day=01/part-1.parquet", "day=0[12]/*.parquet", "**/part-0.parquet", "*", "day=02/*"]
)
def test_names_file_agrees_with_a_listing(logs: Path, path: str) -> None:
    """What a following loader decides from a late file's name is what listing the path would have found."""
    fs = pafs.LocalFileSystem()
    everything = sorted(str(p) for p in logs.rglob("*") if p.is_file())  # hidden names included
    selection = f"{logs}/{path}" if path else str(logs)
    assert [f for f in everything if names_file(selection, f)] == list_files(fs, selection)


def test_an_fsspec_uri_is_read_through_pyarrow(logs: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    for name, _, _ in LAYOUT[:2]:
        memory.pipe(f"/events/{name}", (logs / name).read_bytes())
    source = ParquetSource("memory://events")
    assert [f.path.split("events/")[1] for f in source.files] == [LAYOUT[0][0], LAYOUT[1][0]]
    data = ParquetDataModule("memory://events", dense=["d_float"], sparse=["scalar", "multi"], batch_size=10)
    assert sum(b.batch_size for b in data.train_dataloader()) == 70


def test_auto_spec_patterns_and_options(logs: Path) -> None:
    schema = ParquetSource(str(logs)).schema
    auto = build_spec(schema, "x", "label", "auto", "auto")
    assert auto.dense == ("d_float",)
    assert auto.keys == ["d_int", "scalar", "narrow", "multi", "tags", "row"]
    patterned = build_spec(schema, "x", "label", ["d_*"], ["s*", "multi"])
    assert patterned.dense == ("d_float", "d_int") and patterned.keys == ["scalar", "multi"]
    options = build_spec(schema, "x", "label", [], {"user": "scalar", "tags": {"weights": "tag_w", "pooling": "MEAN"}},
                         num_embeddings=1000, id_mapping="hash")  # fmt: skip
    assert [(f.name, f.column, f.weights, f.num_embeddings, f.id_mapping) for f in options.sparse] == [
        ("user", "scalar", None, 1000, "hash"), ("tags", "tags", "tag_w", 1000, "hash"),
    ]  # fmt: skip
    assert options.table_configs(8)[1].pooling.value == "MEAN"
    with pytest.raises(ValueError, match=r"id_mapping='modulo' needs num_embeddings"):
        build_spec(schema, "x", "label", [], ["scalar"], id_mapping="modulo")
    with pytest.raises(ValueError, match=r"sparse\['x'\] has unknown options \['size'\]"):
        build_spec(schema, "x", "label", [], {"x": {"column": "scalar", "size": 3}})
    with pytest.raises(ValueError, match=r"columns \['scalar'\] are used twice"):
        build_spec(schema, "x", "label", ["scalar"], ["scalar"])


def test_hashed_modulo_and_managed_ids_land_in_their_tables(logs: Path) -> None:
    sparse = {
        "h": {"column": "row", "num_embeddings": 7, "id_mapping": "hash"},
        "m": {"column": "row", "num_embeddings": 5, "id_mapping": "modulo"},
        "raw": {"column": "row", "num_embeddings": 3, "id_mapping": "managed"},  # raw ids, for managed collisions
    }
    data = ParquetDataModule(str(logs), dense=[], sparse=sparse, batch_size=20)
    batch = next(iter(data.train_dataloader()))
    assert batch.sparse_features["m"].values().tolist() == [r % 5 for r in range(20)]
    hashed = batch.sparse_features["h"].values()
    assert 0 <= int(hashed.min()) and int(hashed.max()) < 7 and len(set(hashed.tolist())) > 3
    assert batch.sparse_features["raw"].values().tolist() == list(range(20))  # unchanged, beyond the 3 rows
    assert [c.num_embeddings for c in data.table_configs(4)] == [7, 5, 3]


def test_sizes_are_scanned_where_statistics_are_missing(tmp_path: Path) -> None:
    table = event_table(30)
    pq.write_table(table, tmp_path / "a.parquet", write_statistics=False)
    source = ParquetSource(str(tmp_path / "a.parquet"))
    found = column_range(source, "multi")
    assert found.scanned_row_groups == 1 and found.max == max(v for r in table.column("multi").to_pylist() for v in r)
    spec = size_tables(source, build_spec(source.schema, "x", "label", [], ["scalar"]))
    assert spec.sparse[0].num_embeddings == max(table.column("scalar").to_pylist()) + 1


def _rows(source: ParquetSource, slices: list) -> int:
    return sum(s.rows for s in slices)


def test_splits_by_partition_value_file_and_fraction(logs: Path) -> None:
    source = ParquetSource(str(logs))
    by_day = split_slices(source, val={"day": "02"}, test={"day": ["03"]})
    assert [_rows(source, by_day[k]) for k in ("train", "val", "test")] == [70, 50, 20]
    by_file = split_slices(source, val=str(logs / "day=01" / "part-1.parquet"))
    assert [_rows(source, by_file[k]) for k in ("train", "val", "test")] == [110, 30, 0]
    by_fraction = split_slices(source, val=0.1, test=0.25)  # of 140 rows: 14 and 35, at the end
    assert [_rows(source, by_fraction[k]) for k in ("train", "val", "test")] == [91, 14, 35]
    first = by_fraction["val"][0]  # row 91: the 6th row of the 2nd row group of day=02/part-0
    assert (first.file, first.row_group, first.lo) == (2, 1, 5)
    everything = split_slices(source)
    assert _rows(source, everything["train"]) == 140 and everything["val"] == everything["test"] == []
    assert take_rows(everything["train"], 16, 40)[0].lo == 0


def test_split_mistakes_are_named(logs: Path) -> None:
    source = ParquetSource(str(logs))
    with pytest.raises(ValueError, match=r"val=\{'day': '09'\} selects no file: the partition values in the data are"):
        split_slices(source, val={"day": "09"})
    with pytest.raises(ValueError, match=r"val and test fractions must be >= 0 and sum to < 1"):
        split_slices(source, val=0.6, test=0.5)
    with pytest.raises(ValueError, match=r"use one kind"):
        split_slices(source, val=0.1, test={"day": "03"})
    with pytest.raises(ValueError, match=r"files are in both val and test"):
        split_slices(source, val={"day": "03"}, test=str(logs / "day=03"))


def test_the_datamodule_reads_its_splits_and_sizes_tables_over_all_of_them(logs: Path) -> None:
    data = ParquetDataModule(str(logs), dense=["d_float", "d_int"], sparse=["scalar", "multi"], batch_size=10,
                             val={"day": "02"}, test={"day": "03"})  # fmt: skip
    assert data.num_dense_features == 2
    assert [len(data.train_dataloader()), len(data.val_dataloader()), len(data.test_dataloader())] == [7, 5, 2]
    everything = pa.concat_tables([pq.read_table(logs / n) for n, _, _ in LAYOUT])
    assert data.table_configs(4)[0].num_embeddings == max(everything.column("scalar").to_pylist()) + 1
    none = ParquetDataModule(str(logs), sparse=["scalar"])
    assert none.val_dataloader() == [] and none.test_dataloader() == []


def test_globs_and_markers_at_the_root_of_a_filesystem_given_by_the_caller(tmp_path: Path) -> None:
    """Paths relative to a caller's filesystem root: a glob with no folder before its wildcard lists the root,
    and the marker of a file at the root is looked for at the root (not below the file's own name)."""
    from lightrec.data.parquet.source import complete_files, listing_root

    pq.write_table(pa.table({"a": [1]}), tmp_path / "part-0.parquet")
    store = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    assert listing_root("part-*.parquet") == "" and listing_root("/data/day=*/x.parquet") == "/data"
    assert list_files(store, "part-*.parquet") == ["part-0.parquet"]
    assert complete_files(store, ["part-0.parquet"], "_SUCCESS") == []
    (tmp_path / "_SUCCESS").write_text("")
    assert complete_files(store, ["part-0.parquet"], "_SUCCESS") == ["part-0.parquet"]
