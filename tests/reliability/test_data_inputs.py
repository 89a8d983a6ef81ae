"""Deliver 5: data that is never silently wrong -- id dtypes, parser agreement, empty and truncated files, MovieLens.

Each case was silently wrong before: a cap of 2**33 stored id 4294967297 as 1 (int32); a 19-digit
dense value gave 0.0 in the vectorised parser and 43.75 in the line parser (int64 wrap-around);
empty files gave 0 batches; a truncated ``.gz`` raised a bare ``EOFError`` and a truncated ``.npy``
an mmap error naming no file; MovieLens accepted rating ``nan``/99 and user -5 and dropped the
first rating of a ``ratings.csv`` without a header.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrec.data import preprocess_criteo
from lightrec.data.criteo.parse import parse_criteo_lines, parse_criteo_lines_one_by_one, parse_fast
from lightrec.data.errors import DataFormatError, LineErrors


def _line(dense: list[str], cats: list[str], label: str = "1") -> bytes:
    return ("\t".join([label, *dense, *cats]) + "\n").encode()


def _simple(dense0: str = "3", cat0: str = "a") -> bytes:
    return _line([dense0] + ["1"] * 12, [cat0] + ["b"] * 25)


# ------------------------------------------------------------------------------------- Criteo ids
def test_ids_beyond_int32_are_kept_in_int64(tmp_path: Path) -> None:
    from lightrec.data.criteo import CriteoMemmapDataset

    src = tmp_path / "day_0"
    src.write_bytes(b"".join([_simple(cat0="100000000")] * 4))  # raw 2**32
    cap = 2**33
    preprocess_criteo(src, tmp_path / "out", num_embeddings_cap=cap, progress=False)
    stored = np.load(tmp_path / "out" / "chunks" / "day_0-00000.sparse.npy")
    assert stored.dtype == np.int64
    expected = 1 + 2**32 % (cap - 1)
    assert int(stored[0, 0]) == expected == 4294967297
    batch = CriteoMemmapDataset(tmp_path / "out", batch_size=4)[0]
    assert int(batch.sparse_features["cat_0"].values()[0]) == expected


def test_ids_within_int32_stay_int32(tmp_path: Path) -> None:
    src = tmp_path / "day_0"
    src.write_bytes(_simple(cat0="7fffffff"))
    preprocess_criteo(src, tmp_path / "out", num_embeddings_cap=2**31, progress=False)
    assert np.load(tmp_path / "out" / "chunks" / "day_0-00000.sparse.npy").dtype == np.int32


# ----------------------------------------------------------------------------- parsers agree
@pytest.mark.parametrize("value", ["1234567890123456789", "-9999999999999999", "1000000000000000", "1e300"])
def test_dense_overflow_is_an_error_in_both_parsers(value: str) -> None:
    lines = [_simple(), _simple(dense0=value)]
    assert parse_fast(lines) is None  # the vectorised parser hands such blocks to the line parser
    with pytest.raises(DataFormatError, match=r"f.tsv:8: dense value .* in int_0 is out of range"):
        parse_criteo_lines(lines, "f.tsv", 7, LineErrors("raise"))
    errors = LineErrors("skip")
    labels, _, _ = parse_criteo_lines(lines, "f.tsv", 7, errors)
    assert labels.shape == (1,) and errors.skipped == 1


_dense = st.one_of(st.just(""), st.integers(-(10**14), 10**14).map(str))
_cat = st.one_of(st.just(""), st.text("0123456789abcdefABCDEF", min_size=1, max_size=15))
# One field per line may be replaced by a value at or beyond the edges of the fast parser.
_tricky = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.text("0123456789", min_size=14, max_size=20),  # leading zeros, 15-20 characters
    st.sampled_from(["-", "1.5", "+3", "nan", "-0", "999999999999999", "1000000000000000"]),
)
_row = st.tuples(
    st.sampled_from(["0", "1"]),
    st.lists(_dense, min_size=13, max_size=13),
    st.lists(_cat, min_size=26, max_size=26),
    st.one_of(
        st.none(),
        st.tuples(st.integers(0, 12), _tricky),
        st.tuples(st.integers(13, 38), st.text("0123456789abcdef", min_size=15, max_size=17)),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_row, min_size=1, max_size=6))
def test_both_criteo_parsers_agree_on_every_line(rows: list) -> None:  # noqa: ANN001
    for _, dense, cats, tricky in rows:
        if tricky is not None:
            where, value = tricky
            if where < 13:
                dense[where] = value
            else:
                cats[where - 13] = value
    lines = [_line(dense, cats, label) for label, dense, cats, _ in rows]
    fast = parse_fast(lines)
    errors = LineErrors("skip")
    slow = parse_criteo_lines_one_by_one(lines, "g.tsv", 1, errors)
    if fast is not None:  # whatever the fast parser accepts, the line parser accepts identically
        assert errors.skipped == 0, errors.messages
        for a, b in zip(fast, slow, strict=True):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
    for line in lines:  # and every single line on its own
        one_fast = parse_fast([line])
        one_errors = LineErrors("skip")
        one_slow = parse_criteo_lines_one_by_one([line], "g.tsv", 1, one_errors)
        if one_fast is not None:
            assert one_errors.skipped == 0
            for a, b in zip(one_fast, one_slow, strict=True):
                np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------- empty and truncated files
@pytest.mark.parametrize("name", ["day_0", "day_1.gz"])
def test_empty_file_raises_naming_it(tmp_path: Path, name: str) -> None:
    src = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(src, "wb"):
            pass
    else:
        src.write_bytes(b"")
    with pytest.raises(DataFormatError, match=rf"{name}: the file is empty"):
        preprocess_criteo(src, tmp_path / "out", num_embeddings_cap=100, progress=False)


def test_truncated_gz_raises_naming_the_file(tmp_path: Path) -> None:
    src = tmp_path / "day_0.gz"
    with gzip.open(src, "wb") as fh:
        fh.write(b"".join([_simple()] * 2000))
    data = src.read_bytes()
    src.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError, match=r"day_0\.gz: the gzip stream is truncated or corrupt after line \d+"):
        preprocess_criteo(src, tmp_path / "out", num_embeddings_cap=100, progress=False)


def test_truncated_npy_chunk_raises_naming_the_file(tmp_path: Path) -> None:
    from lightrec.data.criteo import CriteoMemmapDataset

    src = tmp_path / "day_0"
    src.write_bytes(b"".join([_simple()] * 64))
    preprocess_criteo(src, tmp_path / "out", num_embeddings_cap=100, progress=False)
    chunk = tmp_path / "out" / "chunks" / "day_0-00000.sparse.npy"
    os.truncate(chunk, chunk.stat().st_size // 2)
    dataset = CriteoMemmapDataset(tmp_path / "out", batch_size=8)
    with pytest.raises(DataFormatError, match=r"day_0-00000\.sparse\.npy: cannot be read as a \.npy array"):
        dataset[0]


# ------------------------------------------------------------------------------------- MovieLens
def _ratings_csv(d: Path, body: str, header: bool = True) -> None:
    d.mkdir(exist_ok=True)
    (d / "ratings.csv").write_text(("userId,movieId,rating,timestamp\n" if header else "") + body)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("1,2,nan,5", "rating must be a number from 0.5 to 5.0, got nan"),
        ("1,2,99,5", "rating must be a number from 0.5 to 5.0, got 99.0"),
        ("-5,2,4.0,5", "user and item ids must be >= 1, got user -5, item 2"),
        ("3,0,4.0,5", "user and item ids must be >= 1, got user 3, item 0"),
    ],
)
def test_movielens_range_checks_follow_on_error(tmp_path: Path, row: str, reason: str) -> None:
    from lightrec.data import read_movielens

    _ratings_csv(tmp_path, f"1,1,4.0,1\n{row}\n2,1,3.5,2\n")
    with pytest.raises(DataFormatError, match=rf"ratings\.csv:3: {reason}"):
        read_movielens(tmp_path)
    data = read_movielens(tmp_path, on_error="skip")
    assert len(data) == 2 and data.skipped_lines == 1


def test_movielens_ratings_without_header_keep_their_first_row(tmp_path: Path) -> None:
    from lightrec.data import read_movielens

    _ratings_csv(tmp_path, "1,1,4.0,1\n2,1,3.5,2\n", header=False)
    assert len(read_movielens(tmp_path)) == 2
    _ratings_csv(tmp_path, "1,1,4.0,1\n2,1,3.5,2\n", header=True)
    assert len(read_movielens(tmp_path)) == 2
