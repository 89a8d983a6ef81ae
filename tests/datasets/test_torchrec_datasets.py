"""lightrec.datasets at torchrec's paths: RandomRecDataset, the Criteo readers and binary files,
MovieLens rows -- checked against values computed here from the inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lightrec.data import Batch as DataBatch
from lightrec.datasets.criteo import (
    DEFAULT_CAT_NAMES,
    DEFAULT_COLUMN_NAMES,
    DEFAULT_INT_NAMES,
    BinaryCriteoUtils,
    InMemoryBinaryCriteoIterDataPipe,
    criteo_kaggle,
)
from lightrec.datasets.movielens import DEFAULT_RATINGS_COLUMN_NAMES, movielens_20m
from lightrec.datasets.random import RandomRecDataset
from lightrec.datasets.utils import Batch, safe_cast


def test_batch_is_lightrecs_batch() -> None:
    assert Batch is DataBatch
    assert safe_cast("x", int, 7) == 7 and safe_cast("3", int, 0) == 3


def _torchrec_draw(g: torch.Generator, batch: int, hashes: list[int], fewest: list[int], most: list[int],
                   num_dense: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """torchrec 1.8's draw order for one batch: per key the lengths, then its ids; dense; labels."""
    lengths, values = [], []
    for h, low, high in zip(hashes, fewest, most):
        length = torch.randint(low, high + 1, (batch,), dtype=torch.int32, generator=g)
        values.append(torch.randint(0, h, (int(length.sum()),), generator=g))
        lengths.append(length)
    dense = torch.randn(batch, num_dense, generator=g)
    labels = torch.randint(low=0, high=2, size=(batch,), generator=g)
    return torch.cat(lengths), torch.cat(values), dense, labels


def _equal(batch: Batch, drawn: tuple[torch.Tensor, ...]) -> bool:
    lengths, values, dense, labels = drawn
    kjt = batch.sparse_features
    return (torch.equal(kjt.lengths(), lengths) and torch.equal(kjt.values(), values)
            and torch.equal(batch.dense_features, dense) and torch.equal(batch.labels, labels))  # fmt: skip


def test_random_rec_dataset_draws_torchrecs_batches() -> None:
    """torchrec 1.8's rules: ids_per_features alone gives lengths from 0 to it (min_ids_per_feature
    defaults to ids_per_feature, which is not given); num_generated_batches distinct batches, cycled."""
    ds = RandomRecDataset(keys=["a", "b"], batch_size=4, hash_sizes=[5, 1000], ids_per_features=[1, 3],
                          num_dense=2, manual_seed=1, num_batches=5, num_generated_batches=2)  # fmt: skip
    batches = list(ds)
    assert len(batches) == 5 == len(ds)
    g = torch.Generator().manual_seed(1)
    first, second = (_torchrec_draw(g, 4, [5, 1000], [0, 0], [1, 3], 2) for _ in range(2))
    assert _equal(batches[0], first) and _equal(batches[1], second)
    assert [id(b) for b in batches] == [id(batches[0]), id(batches[1])] * 2 + [id(batches[0])]  # cycled
    assert batches[0].sparse_features["a"].lengths().max() <= 1 and batches[0].sparse_features["b"].lengths().max() <= 3
    assert batches[0].sparse_features.keys() == ["a", "b"] and batches[0].dense_features.shape == (4, 2)
    assert next(iter(ds)) is batches[0]  # every iteration starts again at the first batch


def test_random_rec_dataset_fixed_and_bounded_lengths() -> None:
    fixed = next(iter(RandomRecDataset(keys=["a", "b"], batch_size=3, hash_size=7, ids_per_feature=2, num_dense=1,
                                       manual_seed=5, num_generated_batches=1)))  # fmt: skip
    assert fixed.sparse_features.lengths().tolist() == [2] * 6  # min defaults to ids_per_feature
    assert _equal(fixed, _torchrec_draw(torch.Generator().manual_seed(5), 3, [7, 7], [2, 2], [2, 2], 1))
    bounded = list(RandomRecDataset(keys=["a", "b"], batch_size=6, hash_size=9, ids_per_features=[2, 5],
                                    min_ids_per_features=[1, 2], num_dense=1, manual_seed=4, num_batches=3,
                                    num_generated_batches=-1))  # fmt: skip
    g = torch.Generator().manual_seed(4)  # negative: nothing drawn at construction, each batch afresh
    for batch in bounded:
        assert _equal(batch, _torchrec_draw(g, 6, [9, 9], [1, 2], [2, 5], 1))
    one_min = next(iter(RandomRecDataset(keys=["a"], batch_size=8, ids_per_feature=4, min_ids_per_feature=3,
                                         manual_seed=0, num_generated_batches=1)))  # fmt: skip
    assert set(one_min.sparse_features.lengths().tolist()) <= {3, 4}
    assert int(one_min.sparse_features.values().max()) < 100  # hash_size defaults to 100


def test_random_rec_dataset_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="hash_sizes has 1 entries for 2 keys"):
        RandomRecDataset(keys=["a", "b"], batch_size=2, hash_sizes=[3])
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        RandomRecDataset(keys=["a"], batch_size=0)
    with pytest.raises(ValueError, match="key 'a' has min_ids_per_features 3 above its ids_per_features 2"):
        RandomRecDataset(keys=["a"], batch_size=2, ids_per_feature=2, min_ids_per_feature=3)
    with pytest.raises(ValueError, match="min_ids_per_features has 1 entries for 2 keys"):
        RandomRecDataset(keys=["a", "b"], batch_size=2, min_ids_per_features=[1])


def _write_tsv(path: Path, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, rows)
    dense = rng.integers(0, 50, (rows, 13))
    cats = rng.integers(1, 2**31, (rows, 26))
    lines = []
    for i in range(rows):
        fields = [str(labels[i])] + [str(v) for v in dense[i]] + [f"{v:x}" for v in cats[i]]
        fields[4] = ""  # an empty count (int_3) and an empty categorical (cat_2)
        fields[1 + 13 + 2] = ""
        lines.append("\t".join(fields))
    path.write_text("\n".join(lines) + "\n")
    dense[:, 3] = 0
    cats[:, 2] = 0
    return labels, dense, cats


def test_criteo_kaggle_rows(tmp_path: Path) -> None:
    labels, dense, cats = _write_tsv(tmp_path / "train.txt", 3, 0)
    rows = list(criteo_kaggle(str(tmp_path / "train.txt")))
    assert len(rows) == 3 and list(rows[0]) == list(reversed(DEFAULT_COLUMN_NAMES))
    assert rows[1]["label"] == labels[1] and rows[1]["int_0"] == dense[1, 0] and rows[1]["int_3"] == 0
    assert rows[2]["cat_0"] == f"{cats[2, 0]:x}" and rows[2]["cat_2"] == ""


def test_binary_criteo_round_trip_over_two_ranks(tmp_path: Path) -> None:
    files = []
    truth = []
    for day, rows in enumerate([7, 4]):
        labels, dense, cats = _write_tsv(tmp_path / f"day_{day}.tsv", rows, day)
        names = [str(tmp_path / f"day_{day}_{kind}.npy") for kind in ("dense", "sparse", "labels")]
        BinaryCriteoUtils.tsv_to_npys(str(tmp_path / f"day_{day}.tsv"), *names)
        files.append(names)
        truth.append((labels, dense, cats))
    assert BinaryCriteoUtils.get_shape_from_npy(files[0][0]) == (7, 13)
    labels = np.concatenate([t[0] for t in truth])
    dense = np.log(np.concatenate([t[1] for t in truth]) + 3.0).astype(np.float32)
    cats = np.concatenate([t[2] for t in truth])
    hashes = [97 + i for i in range(26)]
    seen = []
    for rank in range(2):
        pipe = InMemoryBinaryCriteoIterDataPipe(
            "train", [f[0] for f in files], [f[1] for f in files], [f[2] for f in files],
            batch_size=4, rank=rank, world_size=2, hashes=hashes,
        )  # fmt: skip
        batches = list(pipe)
        assert len(batches) == len(pipe) == 2  # 6 and 5 rows
        seen += batches
    all_dense = torch.cat([b.dense_features for b in seen])
    np.testing.assert_allclose(all_dense.numpy(), dense, rtol=1e-6)
    assert torch.cat([b.labels for b in seen]).tolist() == labels.tolist()
    first = seen[0].sparse_features
    assert first.keys() == DEFAULT_CAT_NAMES and first.stride() == 4
    assert first["cat_5"].values().tolist() == (cats[:4, 5] % hashes[5]).tolist()
    val = InMemoryBinaryCriteoIterDataPipe("val", [files[0][0]], [files[0][1]], [files[0][2]], 8, 0, 1)
    test = InMemoryBinaryCriteoIterDataPipe("test", [files[0][0]], [files[0][1]], [files[0][2]], 8, 0, 1)
    assert [b.batch_size for b in val] == [4] and [b.batch_size for b in test] == [3]
    assert len(DEFAULT_INT_NAMES) == 13


def test_file_idx_to_row_range_splits_evenly() -> None:
    ranges = [BinaryCriteoUtils.get_file_idx_to_row_range([5, 6], r, 3) for r in range(3)]
    assert ranges == [{0: (0, 3)}, {0: (4, 4), 1: (0, 2)}, {1: (3, 5)}]


def test_movielens_rows(tmp_path: Path) -> None:
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n2,10,4.0,835355493\n")
    (tmp_path / "movies.csv").write_text('movieId,title,genres\n31,"Dangerous Minds (1995)",Drama\n')
    rows = list(movielens_20m(str(tmp_path)))
    assert rows[0] == dict(zip(DEFAULT_RATINGS_COLUMN_NAMES, [1, 31, 2.5, 1260759144]))
    joined = list(movielens_20m(str(tmp_path), include_movies_data=True))
    assert joined[0]["title"] == "Dangerous Minds (1995)" and joined[0]["genres"] == "Drama" and joined[1]["title"] == ""
    with pytest.raises(FileNotFoundError, match="ratings.csv"):
        movielens_20m(str(tmp_path / "missing"))


@pytest.mark.parametrize("newline_at_end", [True, False])
def test_tsv_to_npys_in_small_chunks_equals_the_whole_file_parsed_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, newline_at_end: bool
) -> None:
    import lightrec.data.criteo.torchrec_readers as readers

    labels, dense, cats = _write_tsv(tmp_path / "day.tsv", 37, 5)
    if not newline_at_end:
        (tmp_path / "day.tsv").write_bytes((tmp_path / "day.tsv").read_bytes()[:-1])
    monkeypatch.setattr(readers, "TSV_CHUNK_BYTES", 500)  # ~3 lines a chunk: many chunk boundaries
    names = [str(tmp_path / f"day_{kind}.npy") for kind in ("dense", "sparse", "labels")]
    BinaryCriteoUtils.tsv_to_npys(str(tmp_path / "day.tsv"), *names)
    got = [np.load(n) for n in names]
    assert [a.dtype for a in got] == [np.float32, np.int64, np.int32]
    np.testing.assert_array_equal(got[0], np.log(dense.astype(np.float32) + 3.0))
    np.testing.assert_array_equal(got[1], cats)
    np.testing.assert_array_equal(got[2], labels.reshape(-1, 1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["day.tsv", *sorted(Path(n).name for n in names)]


def test_tsv_to_npys_leaves_no_output_for_a_bad_line_and_converts_an_empty_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightrec.data.criteo.torchrec_readers as readers
    from lightrec.data.errors import DataFormatError

    _write_tsv(tmp_path / "day.tsv", 20, 1)
    lines = (tmp_path / "day.tsv").read_text().splitlines()
    lines[13] = "2\t" + lines[13].split("\t", 1)[1]  # label 2 in a late chunk
    (tmp_path / "day.tsv").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(readers, "TSV_CHUNK_BYTES", 500)
    names = [str(tmp_path / f"day_{kind}.npy") for kind in ("dense", "sparse", "labels")]
    with pytest.raises(DataFormatError, match=r"day.tsv:14: label must be 0 or 1"):
        BinaryCriteoUtils.tsv_to_npys(str(tmp_path / "day.tsv"), *names)
    assert [p.name for p in tmp_path.iterdir()] == ["day.tsv"]
    (tmp_path / "empty.tsv").write_bytes(b"")
    BinaryCriteoUtils.tsv_to_npys(str(tmp_path / "empty.tsv"), *names)
    assert [np.load(n).shape for n in names] == [(0, 13), (0, 26), (0, 1)]
