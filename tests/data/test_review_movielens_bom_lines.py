"""MovieLens files as editors save them: a UTF-8 byte order mark, comment-looking and blank lines,
and latin-1 titles holding bytes that ``str.splitlines`` takes for line breaks. Checked against the
ratings written by hand in each test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lightrec.data import read_movielens
from lightrec.data.errors import DataFormatError

BOM = b"\xef\xbb\xbf"


def _write(tmp_path: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("ratings.csv", b"1,10,4.0,100\n2,20,3.5,200\n"),
        ("ratings.dat", b"1::10::4::100\n2::20::3.5::200\n"),
        ("u.data", b"1\t10\t4\t100\n2\t20\t3.5\t200\n"),
    ],
)
def test_a_bom_before_the_first_rating_keeps_that_rating(tmp_path: Path, name: str, body: bytes) -> None:
    # was: the BOM made the first field non-numeric, the line was taken for a header and dropped
    data = read_movielens(_write(tmp_path, {name: BOM + body}))
    assert data.raw_user_ids.tolist() == [1, 2]
    assert data.raw_item_ids.tolist() == [10, 20]
    np.testing.assert_array_equal(data.rating, np.array([4.0, 3.5], dtype=np.float32))
    np.testing.assert_array_equal(data.timestamp, [100, 200])


def test_a_bom_before_a_header_still_skips_only_the_header(tmp_path: Path) -> None:
    d = _write(tmp_path, {"ratings.csv": BOM + b"userId,movieId,rating,timestamp\n1,10,4.0,100\n2,20,3.5,200\n"})
    data = read_movielens(d)
    assert data.raw_user_ids.tolist() == [1, 2]
    np.testing.assert_array_equal(data.rating, np.array([4.0, 3.5], dtype=np.float32))


def test_bom_in_ml1m_movies_and_users_files(tmp_path: Path) -> None:
    # was: DataFormatError "non-numeric movie id 'ï»¿10'" (the BOM read as latin-1)
    d = _write(
        tmp_path,
        {
            "ratings.dat": b"1::10::4::100\n",
            "movies.dat": BOM + b"10::A (1999)::Comedy|Drama\n",
            "users.dat": BOM + b"1::F::25::7::48067\n",
        },
    )
    data = read_movielens(d)
    assert data.genre_names == ["Comedy", "Drama"]
    lo, hi = data.genre_offsets[1], data.genre_offsets[2]
    assert sorted(data.genre_values[lo:hi].tolist()) == [1, 2]
    assert data.user_features["gender"].tolist() == [0, 1]
    assert data.user_features["age"].tolist() == [0, 1]


@pytest.mark.parametrize("title", [b"Caf\x85 Society", b"Page\x0cBreak", b"Sep\x1cFile"])
def test_a_latin1_title_with_a_unicode_line_break_character_is_one_line(tmp_path: Path, title: bytes) -> None:
    # latin-1 byte 0x85 is U+0085 (NEL): str.splitlines cut the movie line there ("wrong column count")
    d = _write(
        tmp_path,
        {"ratings.dat": b"1::10::4::100\n1::20::5::101\n", "movies.dat": b"10::" + title + b"::Comedy\n20::B::Drama\n"},
    )
    data = read_movielens(d)
    assert data.genre_names == ["Comedy", "Drama"]
    assert data.raw_item_ids.tolist() == [10, 20]


def test_a_comment_looking_rating_line_is_malformed_under_raise_as_under_skip(tmp_path: Path) -> None:
    # was: on_error="raise" dropped the line silently (np.loadtxt's '#' comments) while "skip" counted it
    d = _write(tmp_path, {"ratings.csv": b"1,10,4.0,100\n#2,20,3.5,200\n3,30,3.0,300\n"})
    with pytest.raises(DataFormatError) as info:
        read_movielens(d)
    assert info.value.line == 2 and info.value.path.endswith("ratings.csv")
    skipped = read_movielens(d, on_error="skip")
    assert skipped.raw_user_ids.tolist() == [1, 3] and skipped.skipped_lines == 1


def test_a_blank_rating_line_is_malformed_under_raise_as_under_skip(tmp_path: Path) -> None:
    # was: "raise" read the file (np.loadtxt passes over blank lines) while "skip" counted one bad line
    d = _write(tmp_path, {"ratings.csv": b"1,10,4.0,100\n\n2,20,3.5,200\n"})
    with pytest.raises(DataFormatError) as info:
        read_movielens(d)
    assert info.value.line == 2
    skipped = read_movielens(d, on_error="skip")
    assert skipped.raw_user_ids.tolist() == [1, 2] and skipped.skipped_lines == 1


def test_crlf_files_read_as_lf_files(tmp_path: Path) -> None:
    ratings = b"userId,movieId,rating,timestamp\n1,10,4.0,100\n2,20,3.5,200\n"
    movies = b'movieId,title,genres\n10,"A, The (1999)",Comedy|Drama\n20,B,Action\n'
    (tmp_path / "lf").mkdir()
    (tmp_path / "crlf").mkdir()
    lf = read_movielens(_write(tmp_path / "lf", {"ratings.csv": ratings, "movies.csv": movies}))
    crlf = read_movielens(
        _write(
            tmp_path / "crlf",
            {"ratings.csv": ratings.replace(b"\n", b"\r\n"), "movies.csv": movies.replace(b"\n", b"\r\n")},
        )
    )
    for field in ("user", "item", "rating", "timestamp", "genre_offsets", "genre_values"):
        np.testing.assert_array_equal(getattr(lf, field), getattr(crlf, field))
    assert crlf.genre_names == ["Action", "Comedy", "Drama"]
