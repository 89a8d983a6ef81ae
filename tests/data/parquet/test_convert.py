"""``lightrec data convert`` (Criteo TSV plain and .gz, CSV) and ``lightrec data inspect``."""

from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightrec.cli.app import main
from lightrec.data import DataFormatError, parse_criteo_lines
from lightrec.data.errors import LineErrors
from lightrec.data.parquet import ParquetDataModule
from lightrec.data.parquet.convert import MANIFEST, convert_to_parquet
from lightrec.data.parquet.text_tables import hex_to_int64
from tests.recipes.helpers import write_criteo_kaggle


def _read(folder: Path) -> pa.Table:
    files = sorted(p for p in folder.glob("*.parquet"))
    return pa.concat_tables([pq.read_table(p) for p in files])


def test_criteo_tsv_and_gz_convert_to_the_values_lightrecs_criteo_parser_reads(tmp_path: Path) -> None:
    raw = write_criteo_kaggle(tmp_path / "day_0", rows=500)
    with gzip.open(tmp_path / "day_1.gz", "wb") as f:
        f.write(raw.read_bytes())
    manifest = convert_to_parquet([raw, tmp_path / "day_1.gz"], tmp_path / "out", rows_per_file=180, row_group_size=64,
                                  block_bytes=5000, progress=False)  # fmt: skip
    assert [f["file"] for f in manifest["files"]][:4] == ["day_0-00000.parquet", "day_0-00001.parquet",
                                                         "day_0-00002.parquet", "day_1-00000.parquet"]  # fmt: skip
    assert [f["lines"] for f in manifest["files"]] == [180, 180, 140] * 2 and manifest["rows"] == 1000
    assert pq.ParquetFile(tmp_path / "out" / "day_0-00000.parquet").metadata.num_row_groups == 3  # 64 + 64 + 52
    table = _read(tmp_path / "out")
    labels, dense, cats = parse_criteo_lines(raw.read_bytes().splitlines(keepends=True), str(raw), 1, LineErrors())
    first = table.slice(0, 500)
    assert first.column("label").to_pylist() == labels.astype(int).tolist()
    ints = np.stack([first.column(f"int_{i}").fill_null(0).to_numpy() for i in range(13)], axis=1)
    assert np.array_equal(ints, dense)  # blanks are nulls here, 0 there
    raw_cats = np.stack([first.column(f"cat_{i}").fill_null(-1).to_numpy() for i in range(26)], axis=1)
    assert np.array_equal(raw_cats, cats)  # raw values; blanks: null here, -1 there
    assert table.slice(500).equals(first)  # the .gz input gives the same rows


def test_hex_parsing_folds_wide_values_and_flags_bad_ones() -> None:
    values, bad = hex_to_int64(pa.array(["ff", None, "7fffffffffffffff", "ffffffffffffffff", "zz", "0"]))
    assert values.to_pylist() == [255, None, 2**63 - 1, 2**63 - 1, None, 0]
    assert bad.tolist() == [False, False, False, False, True, False]


def test_bad_lines_are_named_or_skipped_and_counted(tmp_path: Path) -> None:
    raw = write_criteo_kaggle(tmp_path / "day_0", rows=50)
    lines = raw.read_text().splitlines(keepends=True)
    lines[6] = "1\t2\n"  # too few fields
    lines[20] = lines[20].replace("\t", "\tx", 1)  # a dense value that is not a number
    lines[33] = "7" + lines[33][1:]  # a label that is not 0/1
    raw.write_text("".join(lines))
    with pytest.raises(DataFormatError, match=r"day_0:7: wrong number of fields \(expected 40\)"):
        convert_to_parquet(raw, tmp_path / "out", progress=False)
    manifest = convert_to_parquet(raw, tmp_path / "skip", on_error="skip", progress=False)
    assert manifest["skipped_lines"] == 3 and manifest["rows"] == 47
    lines[6] = lines[5]
    raw.write_text("".join(lines))
    with pytest.raises(DataFormatError, match=r"day_0:21: cannot convert a value"):
        convert_to_parquet(raw, tmp_path / "out2", progress=False)


class _Interrupt(Exception):
    pass


def test_an_interrupted_conversion_resumes_to_the_same_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = write_criteo_kaggle(tmp_path / "day_0", rows=400)
    with gzip.open(tmp_path / "day_1.gz", "wb") as f:
        f.write(write_criteo_kaggle(tmp_path / "x", rows=300, seed=1).read_bytes())
    inputs = [raw, tmp_path / "day_1.gz"]
    options = dict(rows_per_file=100, row_group_size=32, block_bytes=3000, progress=False)
    reference = convert_to_parquet(inputs, tmp_path / "whole", **options)  # type: ignore[arg-type]

    from lightrec.data.parquet import convert

    closed = []
    real_close = convert._FileWriter.close

    def close_then_fail(self: convert._FileWriter) -> None:
        if len(closed) == 5:  # the 6th file (day_1's 2nd) never finishes: the process dies while writing it
            raise _Interrupt
        real_close(self)
        closed.append(self.path.name)

    monkeypatch.setattr(convert._FileWriter, "close", close_then_fail)
    with pytest.raises(_Interrupt):
        convert_to_parquet(inputs, tmp_path / "resumed", **options)  # type: ignore[arg-type]
    monkeypatch.setattr(convert._FileWriter, "close", real_close)
    assert len(json.loads((tmp_path / "resumed" / MANIFEST).read_text())["files"]) == 5
    assert list((tmp_path / "resumed").glob(".*.tmp"))  # the half-written file is hidden from readers
    resumed = convert_to_parquet(inputs, tmp_path / "resumed", **options)  # type: ignore[arg-type]
    assert resumed["files"] == reference["files"]
    for entry in reference["files"]:
        assert pq.read_table(tmp_path / "resumed" / entry["file"]).equals(pq.read_table(tmp_path / "whole" / entry["file"]))
    with pytest.raises(ValueError, match=r"holds a conversion with other settings \(\['row_group_size'\]\)"):
        convert_to_parquet(inputs, tmp_path / "resumed", **{**options, "row_group_size": 16})  # type: ignore[arg-type]


def test_csv_with_a_header_keeps_its_types_across_files_and_resumes(tmp_path: Path) -> None:
    lines = ["click,user,price,tags\n"] + [f"{i % 2},{i},{i * 0.5},t{i % 3}\n" for i in range(30)]
    (tmp_path / "events.csv").write_text("".join(lines))
    manifest = convert_to_parquet(tmp_path / "events.csv", tmp_path / "out", format="csv", rows_per_file=12,
                                  progress=False)  # fmt: skip
    assert [f["first_line"] for f in manifest["files"]] == [2, 14, 26]
    table = _read(tmp_path / "out")
    assert table.schema.names == ["click", "user", "price", "tags"] and table.num_rows == 30
    assert str(table.schema.field("user").type) == "int64" and table.column("price").to_pylist()[3] == 1.5
    data = ParquetDataModule(str(tmp_path / "out"), label="click", dense=["price"], sparse=["user"], batch_size=10)
    assert sum(b.batch_size for b in data.train_dataloader()) == 30


def test_the_cli_converts_and_inspects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = write_criteo_kaggle(tmp_path / "train.txt", rows=300)
    assert main(["data", "convert", str(raw), "--out", str(tmp_path / "pq"), "--no-progress",
                 "--rows-per-file", "200"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "converted 1 input(s) -> 2 Parquet file(s)" in out and "300 rows" in out
    assert main(["data", "inspect", str(tmp_path / "pq"), "--dense", "int_0,int_1", "--sparse", "cat_0,cat_1"]) == 0
    text = capsys.readouterr().out
    assert "2 file(s), 2 row group(s), 300 rows" in text and "label: label" in text
    assert "dense (2): int_0, int_1" in text
    cat0 = pq.read_table(tmp_path / "pq").column("cat_0")
    assert f"{cat0.drop_null().to_numpy().max()}" in text
    assert main(["data", "inspect", str(tmp_path / "pq"), "--json", "--sparse", "cat_0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 300 and report["sparse"][0]["nulls"] == cat0.null_count
    assert main(["data", "inspect", str(tmp_path / "nothing")]) == 2
    assert "no Parquet files at" in capsys.readouterr().err
    assert main(["data", "convert", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 2


def _generate_tsv(path: Path, megabytes: int) -> None:
    raw = write_criteo_kaggle(path.with_suffix(".one"), rows=20_000, seed=3).read_bytes()
    with open(path, "wb") as f:
        for _ in range(max(1, megabytes * 2**20 // len(raw))):
            f.write(raw)


def _peak_rss_mb(args: list[str]) -> float:
    code = (
        "import resource, sys\nfrom lightrec.cli.app import main\n"
        f"assert main({args!r}) == 0\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=1800)
    return float(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_conversion_memory_does_not_grow_with_the_input(tmp_path: Path) -> None:
    """Peak RSS converting 100 MB and 400 MB of TSV: the same, within the block and row group buffers."""
    rss = {}
    for mb in (100, 400):
        _generate_tsv(tmp_path / f"in{mb}.tsv", mb)
        args = ["data", "convert", str(tmp_path / f"in{mb}.tsv"), "--out", str(tmp_path / f"out{mb}"), "--no-progress",
                "--block-mb", "16"]  # fmt: skip
        rss[mb] = _peak_rss_mb(args)
    assert rss[400] < rss[100] * 1.3, rss
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (the parent's own RSS is not the measure)
