"""Review of torchrec's MovieLens rows and of ``collate_samples``: references written out here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lightrec.data.batch import Batch, collate_samples
from lightrec.datasets.movielens import DEFAULT_COLUMN_NAMES, movielens_20m, movielens_25m

RATINGS = b"userId,movieId,rating,timestamp\r\n1,31,2.5,1260759144\r\n2,10,4.0,835355493\r\n"
MOVIES = (
    b'movieId,title,genres\r\n31,"Minds, Dangerous (1995)",Drama|Romance\r\n10,"Say ""Hi"", now",Comedy\r\n'
)


@pytest.fixture
def ml_root(tmp_path: Path) -> str:
    (tmp_path / "ratings.csv").write_bytes(RATINGS)
    (tmp_path / "movies.csv").write_bytes(MOVIES)
    return str(tmp_path)


@pytest.mark.parametrize("reader", [movielens_20m, movielens_25m])
def test_movielens_row_mapper_none_yields_the_raw_fields(ml_root: str, reader: object) -> None:
    assert list(reader(ml_root, row_mapper=None)) == [  # type: ignore[operator]
        ["1", "31", "2.5", "1260759144"],
        ["2", "10", "4.0", "835355493"],
    ]
    joined = list(reader(ml_root, include_movies_data=True, row_mapper=None))  # type: ignore[operator]
    assert joined[0] == ["1", "31", "2.5", "1260759144", "Minds, Dangerous (1995)", "Drama|Romance"]
    assert joined[1][4:] == ['Say "Hi", now', "Comedy"]


def test_movielens_default_rows_are_typed_dicts_with_quoted_titles(ml_root: str) -> None:
    assert DEFAULT_COLUMN_NAMES == ["userId", "movieId", "rating", "timestamp", "title", "genres"]
    rows = list(movielens_20m(ml_root, include_movies_data=True))
    assert rows[0] == dict(
        zip(DEFAULT_COLUMN_NAMES, [1, 31, 2.5, 1260759144, "Minds, Dangerous (1995)", "Drama|Romance"])
    )
    assert list(movielens_20m(ml_root))[1] == {
        "userId": 2,
        "movieId": 10,
        "rating": 4.0,
        "timestamp": 835355493,
    }
    assert list(movielens_20m(ml_root, row_mapper=len)) == [4, 4]


def test_collate_samples_takes_numpy_ids() -> None:
    samples = [
        {
            "dense": np.array([1.0, 2.0]),
            "sparse": {"a": np.int64(7), "b": np.array([3, 4])},
            "label": np.float32(1),
        },
        {"dense": [3.0, 4.0], "sparse": {"a": np.array([], dtype=np.int64), "b": np.int32(5)}, "label": 0.0},
    ]
    batch = collate_samples(samples)
    kjt = batch.sparse_features
    assert kjt["a"].values().tolist() == [7] and kjt["a"].lengths().tolist() == [1, 0]
    assert kjt["b"].values().tolist() == [3, 4, 5] and kjt["b"].lengths().tolist() == [2, 1]
    assert batch.labels.tolist() == [1.0, 0.0] and batch.dense_features.dtype == torch.float32
    with pytest.raises(ValueError, match=r"feature 'b' must be 1-D ids, got shape \[1, 2\]"):
        collate_samples([{"dense": [1.0], "sparse": {"b": np.array([[1, 2]])}, "label": 1.0}])


def test_batch_to_keeps_types_and_values() -> None:
    batch = collate_samples([{"dense": [1.0], "sparse": {"a": [1, 2]}, "label": 1.0}])
    for moved in (batch.to("cpu"), batch.to(torch.device("cpu"), non_blocking=True)):
        assert isinstance(moved, Batch) and moved.labels.dtype == torch.float32
        assert moved.sparse_features.values().dtype == torch.int64
        assert moved.sparse_features.lengths().dtype == torch.int32
        assert moved.sparse_features["a"].values().tolist() == [1, 2]
