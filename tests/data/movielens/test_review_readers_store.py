"""Review: a ``movies.csv`` without a header row keeps its first movie (the header is detected)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightrec.data import read_movielens

RATINGS = "userId,movieId,rating,timestamp\n1,10,4.0,100\n2,20,3.5,200\n1,30,5.0,300\n"


def _genres(data, raw: int) -> list[str]:  # noqa: ANN001
    k = data.raw_item_ids.tolist().index(raw) + 1
    return [data.genre_names[g - 1] for g in data.genre_values[data.genre_offsets[k] : data.genre_offsets[k + 1]]]


@pytest.mark.parametrize("header", ["", "movieId,title,genres\n", "\ufeffmovieId,title,genres\n"])
def test_movies_csv_with_and_without_header(tmp_path: Path, header: str) -> None:
    (tmp_path / "ratings.csv").write_text(RATINGS)
    movies = '10,"Heat (1995)",Action|Crime\n20,Toy Story (1995),Animation\n30,Up (2009),(no genres listed)\n'
    (tmp_path / "movies.csv").write_text(header + movies, encoding="utf-8")
    data = read_movielens(tmp_path)
    assert data.skipped_lines == 0
    assert data.raw_item_ids.tolist() == [10, 20, 30]
    assert _genres(data, 10) == ["Action", "Crime"] and _genres(data, 20) == ["Animation"] and _genres(data, 30) == []
    assert data.genre_names == ["Action", "Animation", "Crime"]


def test_movies_csv_bad_first_line_is_still_a_bad_line(tmp_path: Path) -> None:
    """A first line that is neither a header nor a movie row is reported, not silently dropped."""
    from lightrec.data import DataFormatError

    (tmp_path / "ratings.csv").write_text(RATINGS)
    (tmp_path / "movies.csv").write_text("x10,Heat (1995),Action\n20,Toy Story (1995),Animation\n")
    with pytest.raises(DataFormatError, match=r"movies.csv:1: non-numeric movie id 'x10'"):
        read_movielens(tmp_path)
