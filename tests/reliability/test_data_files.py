"""Data files a new user gets wrong (issue 23): each raises a ``DataFormatError`` naming the file.

Before: the error of a truncated ``.gz`` could not be rebuilt from its message, so where it crossed a
process boundary (pickled, or re-raised by a DataLoader worker) Python raised ``TypeError:
DataFormatError.__init__() missing 2 required positional arguments`` instead; it blamed one line
("after this line", the chunk's first) and suggested ``on_error='skip'``, which cannot help. An
empty MovieLens ``ratings.dat`` gave a data set of 0 ratings (0 batches, no error), and a
``ratings.csv`` whose last line was cut mid-timestamp was read with the wrong timestamp.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import pytest
import torch

from lightrec.data import preprocess_criteo, read_movielens
from lightrec.data.errors import DataFormatError, DatasetNotFoundError


def _criteo_lines(n: int) -> bytes:
    return b"".join(("\t".join(["1"] + [str(i % 7)] * 13 + ["a1b2"] * 26) + "\n").encode() for i in range(n))


def _truncated_gz(tmp_path: Path) -> Path:
    src = tmp_path / "day_0.gz"
    with gzip.open(src, "wb") as fh:
        fh.write(_criteo_lines(20_000))
    data = src.read_bytes()
    src.write_bytes(data[: len(data) // 2])
    return src


def test_truncated_gz_names_the_file_and_how_far_it_reads(tmp_path: Path) -> None:
    src = _truncated_gz(tmp_path)
    with pytest.raises(DataFormatError) as caught:
        preprocess_criteo(src, tmp_path / "out", num_embeddings_cap=100, rows_per_chunk=4096, progress=False)
    message = str(caught.value)
    assert message.startswith(f"{src}: the gzip stream is truncated or corrupt after line ")
    lines_read = int(message.split("after line ")[1].split()[0])
    assert 4096 < lines_read < 20_000  # past the first chunk: the count is the file's, not the chunk's
    assert "download or copy it again" in message and "on_error" not in message
    again = pickle.loads(pickle.dumps(caught.value))  # a worker process or a queue: the same error
    assert type(again) is DataFormatError and str(again) == message and again.path == str(src)


class _Failing(torch.utils.data.Dataset):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> None:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        DataFormatError("day_0.gz", 7, "bad dense value"),
        DataFormatError("day_0.gz", 0, "the file is empty"),
        DatasetNotFoundError("data/ml-1m", "No MovieLens here.", "https://grouplens.org", "unzip it"),
    ],
    ids=["line", "file", "not found"],
)
def test_data_errors_keep_their_type_across_processes(error: Exception) -> None:
    """Pickled (queues, process pools) and re-raised by a DataLoader worker (torch rebuilds it from
    its text): the same type, the same message."""
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    loader = torch.utils.data.DataLoader(_Failing(error), batch_size=None, num_workers=1)
    with pytest.raises(type(error), match="DataLoader worker process 0"):
        next(iter(loader))


def _ratings_dat(folder: Path, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "ratings.dat").write_text(text)
    return folder


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_empty_movielens_ratings_raise(tmp_path: Path, on_error: str) -> None:
    folder = _ratings_dat(tmp_path / "ml-1m", "")
    with pytest.raises(DataFormatError, match=r"ratings\.dat: holds no ratings: the file is empty"):
        read_movielens(folder, on_error=on_error)  # type: ignore[arg-type]


def test_movielens_ratings_that_are_all_malformed_raise_even_when_skipped(tmp_path: Path) -> None:
    folder = _ratings_dat(tmp_path / "ml-1m", "1::2\n3::4\n")
    with pytest.raises(DataFormatError, match=r"holds no ratings: all 2 lines were skipped as malformed"):
        read_movielens(folder, on_error="skip")


def test_ml25m_ratings_csv_with_a_cut_last_line(tmp_path: Path) -> None:
    """The last rating's timestamp is cut ("12596" of "1259671200"): it parses, so only the missing
    newline says the file was cut."""
    folder = tmp_path / "ml-25m"
    folder.mkdir()
    (folder / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n1,296,5.0,1147880044\n1,306,3.5,1147868817\n2,307,5.0,12596"
    )
    with pytest.raises(DataFormatError, match=r"ratings\.csv:4: truncated line \(no newline at end of file\)"):
        read_movielens(folder)
    data = read_movielens(folder, on_error="skip")
    assert len(data) == 2 and data.skipped_lines == 1 and data.timestamp.tolist() == [1147880044, 1147868817]


def test_movielens_data_module_with_an_empty_folder_of_ratings_says_so(tmp_path: Path) -> None:
    from lightrec.data import MovieLensDataModule

    folder = _ratings_dat(tmp_path / "ml-1m", "")
    module = MovieLensDataModule(data_dir=str(folder), batch_size=8)
    with pytest.raises(DataFormatError, match="holds no ratings"):
        module.prepare_data()
        module.setup("fit")
