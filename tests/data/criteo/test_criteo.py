"""Criteo TSV preprocessing and the memory-mapped dataset on small files in the real format."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lightrec.data import CriteoMemmapDataset, DataFormatError, preprocess_criteo, rank_dataloader

CAP = 1000


def _row(rng: np.random.Generator, i: int) -> list[str]:
    label = str(i % 2)
    dense = ["" if rng.random() < 0.2 else str(int(rng.integers(-3, 500))) for _ in range(13)]
    cats = ["" if rng.random() < 0.1 else format(int(rng.integers(0, 40)) * 7919, "08x") for _ in range(26)]
    return [label, *dense, *cats]


def _write(path: Path, rows: list[list[str]], gz: bool = False) -> None:
    text = "".join("\t".join(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)


def _expected(rows: list[list[str]], cap: int = CAP) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plain-Python reference of the documented transform."""
    labels = np.array([float(r[0]) for r in rows], dtype=np.float32)
    dense = np.array(
        [[math.log(max(float(x) if x else 0.0, 0.0) + 1.0) for x in r[1:14]] for r in rows], dtype=np.float32
    )
    ids = np.array([[1 + int(x, 16) % (cap - 1) if x else 0 for x in r[14:]] for r in rows], dtype=np.int64)
    return labels, dense, ids


@pytest.fixture
def kaggle(tmp_path: Path) -> tuple[Path, list[list[str]]]:
    rng = np.random.default_rng(0)
    rows = [_row(rng, i) for i in range(250)]
    path = tmp_path / "train.txt"
    _write(path, rows)
    return path, rows


def test_preprocess_values_and_dataset(kaggle, tmp_path: Path) -> None:  # noqa: ANN001
    path, rows = kaggle
    meta = preprocess_criteo(
        path, tmp_path / "out", num_embeddings_cap=CAP, rows_per_chunk=64, progress=False
    )
    assert meta["rows"] == 250 and meta["skipped_lines"] == 0
    assert [c["rows"] for c in meta["parts"][0]["chunks"]] == [64, 64, 64, 58]
    assert meta["num_embeddings_per_feature"] == [CAP] * 26
    labels, dense, ids = _expected(rows)
    ds = CriteoMemmapDataset(tmp_path / "out", batch_size=50)
    assert len(ds) == 5
    b = ds[1]  # rows 50..99 straddle chunks 0 and 1
    np.testing.assert_allclose(b.dense_features.numpy(), dense[50:100], rtol=1e-6)
    np.testing.assert_array_equal(b.labels.numpy(), labels[50:100])
    kjt = b.sparse_features
    assert kjt.keys()[0] == "cat_0" and kjt.stride() == 50 and kjt.lengths().unique().tolist() == [1]
    np.testing.assert_array_equal(kjt.values().view(26, 50).T.numpy(), ids[50:100])
    assert ds.table_configs(8)[4].num_embeddings == CAP


def test_min_count_maps_rare_ids_to_zero_and_compacts(kaggle, tmp_path: Path) -> None:  # noqa: ANN001
    path, rows = kaggle
    meta = preprocess_criteo(
        path, tmp_path / "out", num_embeddings_cap=CAP, min_count=8, rows_per_chunk=100, progress=False
    )
    _, _, ids = _expected(rows)
    got = (
        CriteoMemmapDataset(tmp_path / "out", batch_size=250)[0]
        .sparse_features.values()
        .view(26, 250)
        .T.numpy()
    )
    for f in range(26):
        vals, counts = np.unique(ids[:, f], return_counts=True)
        kept = [v for v, c in zip(vals, counts, strict=True) if c >= 8 and v != 0]
        ref = np.array([kept.index(v) + 1 if v in kept else 0 for v in ids[:, f]])  # kept ids renumbered 1..K
        np.testing.assert_array_equal(got[:, f], ref)
        assert meta["num_embeddings_per_feature"][f] == len(kept) + 1


def test_resume_skips_finished_chunks(kaggle, tmp_path: Path) -> None:  # noqa: ANN001
    path, _ = kaggle
    out = tmp_path / "out"
    preprocess_criteo(path, out, num_embeddings_cap=CAP, rows_per_chunk=64, progress=False)
    full = CriteoMemmapDataset(out, batch_size=250)[0]
    # Simulate an interruption during chunk 2: its marker and one array are missing.
    (out / "chunks" / "train-00002.json").unlink()
    (out / "chunks" / "train-00002.labels.npy").unlink()
    marker0 = (out / "chunks" / "train-00000.dense.npy").stat().st_mtime_ns
    preprocess_criteo(path, out, num_embeddings_cap=CAP, rows_per_chunk=64, progress=False)
    assert (out / "chunks" / "train-00000.dense.npy").stat().st_mtime_ns == marker0  # not rewritten
    again = CriteoMemmapDataset(out, batch_size=250)[0]
    assert torch.equal(full.sparse_features.values(), again.sparse_features.values())
    torch.testing.assert_close(full.dense_features, again.dense_features)
    with pytest.raises(ValueError, match="different settings \\(\\['caps'\\]\\)"):
        preprocess_criteo(path, out, num_embeddings_cap=CAP + 1, rows_per_chunk=64, progress=False)


def test_1tb_day_files_gz_and_parts(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    days = [[_row(rng, i) for i in range(40)] for _ in range(3)]
    for d, rows in enumerate(days):
        _write(tmp_path / f"day_{d}.gz", rows, gz=d == 2) if d == 2 else _write(tmp_path / f"day_{d}", rows)
    inputs = [tmp_path / "day_0", tmp_path / "day_1", tmp_path / "day_2.gz"]
    meta = preprocess_criteo(inputs, tmp_path / "out", num_embeddings_cap=CAP, progress=False)
    assert [p["name"] for p in meta["parts"]] == ["day_0", "day_1", "day_2"]
    ds = CriteoMemmapDataset(tmp_path / "out", batch_size=20, parts=["day_2"])
    np.testing.assert_allclose(ds[1].dense_features.numpy(), _expected(days[2])[1][20:40], rtol=1e-6)
    tail = CriteoMemmapDataset(tmp_path / "out", batch_size=10, row_range=(0.5, 1.0))
    assert len(tail) == 6 and tail.start == 60
    with pytest.raises(KeyError, match="day_9"):
        CriteoMemmapDataset(tmp_path / "out", batch_size=10, parts=["day_9"])
    # Rank sharding over the memmapped batches: disjoint, equal step counts.
    all_ds = CriteoMemmapDataset(tmp_path / "out", batch_size=10)
    seen = [list(rank_dataloader(all_ds, r, 2).sampler) for r in range(2)]
    assert seen == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]]


MALFORMED = [
    (lambda r: r[:-3], 3, "wrong column count: expected 40 tab-separated fields, got 37"),
    (lambda r: r[:2] + ["12x"] + r[3:], 3, "non-numeric dense value b'12x' in int_1"),
    (lambda r: r[:20] + ["zzz"] + r[21:], 3, "categorical value b'zzz' in cat_6 is not hex"),
    (lambda r: ["2"] + r[1:], 3, "label must be 0 or 1"),
]


@pytest.mark.parametrize(("corrupt", "line", "reason"), MALFORMED)
def test_malformed_lines_name_file_and_line(kaggle, tmp_path: Path, corrupt, line: int, reason: str) -> None:  # noqa: ANN001
    _, rows = kaggle
    bad = [list(r) for r in rows[:10]]
    bad[line - 1] = corrupt(bad[line - 1])
    path = tmp_path / "bad.txt"
    _write(path, bad)
    with pytest.raises(DataFormatError, match=f"bad.txt:{line}: {reason}") as info:
        preprocess_criteo(path, tmp_path / "o1", num_embeddings_cap=CAP, progress=False)
    assert info.value.line == line and info.value.path == str(path)
    meta = preprocess_criteo(path, tmp_path / "o2", num_embeddings_cap=CAP, on_error="skip", progress=False)
    assert meta["skipped_lines"] == 1 and meta["rows"] == 9


def test_truncated_last_line_and_skip_counts(kaggle, tmp_path: Path) -> None:  # noqa: ANN001
    _, rows = kaggle
    good = "".join("\t".join(r) + "\n" for r in rows[:6])
    cut = "\t".join(rows[6][:25])  # cut mid-line, no newline (an interrupted download)
    (tmp_path / "day_0").write_text(good + cut)
    with pytest.raises(DataFormatError, match="day_0:7: truncated line \\(no newline at end of file\\)"):
        preprocess_criteo(tmp_path / "day_0", tmp_path / "o1", num_embeddings_cap=CAP, progress=False)
    lines = good.split("\n")
    lines[1] = lines[1].replace("\t", "\t\t", 1)  # one extra column on line 2
    (tmp_path / "day_1").write_text("\n".join(lines) + cut)
    with pytest.raises(DataFormatError, match="day_1:2: wrong column count"):
        preprocess_criteo(tmp_path / "day_1", tmp_path / "o2", num_embeddings_cap=CAP, progress=False)
    meta = preprocess_criteo(
        tmp_path / "day_1",
        tmp_path / "o3",
        num_embeddings_cap=CAP,
        on_error="skip",
        rows_per_chunk=3,
        progress=False,
    )
    assert meta["skipped_lines"] == 2 and meta["rows"] == 5
    assert [c["skipped_lines"] for c in meta["parts"][0]["chunks"]] == [1, 0, 1]  # lines 1-3, 4-6, 7
    assert json.loads((tmp_path / "o3" / "meta.json").read_text())["skipped_lines"] == 2


def test_argument_errors(kaggle, tmp_path: Path) -> None:  # noqa: ANN001
    path, _ = kaggle
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        preprocess_criteo(tmp_path / "nope.txt", tmp_path / "o")
    with pytest.raises(ValueError, match="on_error must be"):
        preprocess_criteo(path, tmp_path / "o", on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_embeddings_cap"):
        preprocess_criteo(path, tmp_path / "o2", num_embeddings_cap=[5, 5])
    with pytest.raises(FileNotFoundError, match="preprocess_criteo"):
        CriteoMemmapDataset(tmp_path / "empty", batch_size=4)


def test_vectorised_parser_matches_line_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    import lightrec.data.criteo.parse as criteo
    from lightrec.data.criteo.parse import parse_fast
    from lightrec.data.errors import LineErrors

    rng = np.random.default_rng(5)
    rows = [_row(rng, i) for i in range(300)]
    rows[3][1] = "-17"  # negative count (clipped later, parsed as is here)
    rows[4][14] = "ffffffff"
    rows[5][15] = "AbC"  # upper case hex, short
    lines = [("\t".join(r) + "\n").encode() for r in rows]
    fast = parse_fast(lines)
    assert fast is not None
    monkeypatch.setattr(criteo, "parse_fast", lambda _lines: None)
    slow = criteo.parse_criteo_lines(lines, "x", 1, LineErrors())
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a, b)
    assert fast[1][3, 0] == -17 and fast[2][4, 0] == 0xFFFFFFFF and fast[2][5, 1] == 0xABC
    # Inputs only the line parser handles: fractional dense values, 16-digit hex.
    odd = list(rows[0])
    odd[2], odd[20] = "2.5", "f" * 15 + "0"
    assert parse_fast([("\t".join(odd) + "\n").encode()]) is None
    monkeypatch.undo()
    labels, dense, cats = criteo.parse_criteo_lines([("\t".join(odd) + "\n").encode()], "x", 1, LineErrors())
    assert dense[0, 1] == 2.5 and cats[0, 6] == 0xFFFFFFFFFFFFFFF0 & ((1 << 63) - 1)  # folded to 63 bits
