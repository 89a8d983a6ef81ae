"""The built-in synthetic MovieLens set and the MovieLens DataModule's splits (issue 16, items 2 and 9)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lightrec.data import MovieLensDataModule
from lightrec.data.errors import DatasetNotFoundError
from lightrec.data.movielens.reader import MOVIELENS_URL
from lightrec.data.synthetic import synthetic_movielens
from lightrec.metrics import AUC


def test_shape_is_ml100k_and_deterministic() -> None:
    data = synthetic_movielens(seed=3)
    again = synthetic_movielens(seed=3)
    assert len(data) == 100_000
    assert data.num_embeddings == {
        "userId": 944,
        "movieId": 1683,
        "genres": 20,
        "gender": 3,
        "age": 8,
        "occupation": 22,
    }
    assert (
        data.user.min() >= 1 and data.user.max() <= 943 and data.item.min() >= 1 and data.item.max() <= 1682
    )
    assert set(np.unique(data.rating)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert np.all(np.diff(data.timestamp) >= 0)  # a time split is meaningful
    genres_per_movie = np.diff(data.genre_offsets)[1:]
    assert genres_per_movie.min() >= 1 and genres_per_movie.max() <= 3
    np.testing.assert_array_equal(data.rating, again.rating)
    assert not np.array_equal(data.rating, synthetic_movielens(seed=4).rating)


def test_the_planted_signal_is_learnable() -> None:
    """Each movie's mean rating on the first 80% predicts clicks on the last 20% far above chance,
    and the user's taste adds to it (the user x movie structure is what the recipes learn)."""
    data = synthetic_movielens()
    n = int(0.8 * len(data))
    clicks = (data.rating >= 4).astype(np.float32)
    movie_sum = np.bincount(data.item[:n], weights=clicks[:n], minlength=1683)
    movie_count = np.bincount(data.item[:n], minlength=1683)
    movie_rate = (movie_sum + 0.5) / (movie_count + 1)
    auc = AUC()
    import torch

    auc.update(torch.from_numpy(movie_rate[data.item[n:]]).float(), torch.from_numpy(clicks[n:]))
    assert 0.6 < float(auc.compute()) < 0.95
    assert 0.4 < clicks.mean() < 0.75


def test_missing_real_data_names_the_url(tmp_path: Path) -> None:
    dm = MovieLensDataModule(data_dir=str(tmp_path / "ml-100k"))
    with pytest.raises(DatasetNotFoundError, match="holds no MovieLens ratings file") as err:
        dm.check_data()
    assert MOVIELENS_URL in str(err.value) and "leave data_dir unset" in str(err.value)
    with pytest.raises(DatasetNotFoundError):
        dm.setup("fit")
    MovieLensDataModule().check_data()  # synthetic: nothing to check


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("split", ["time", "random"])
def test_val_and_test_score_every_row(ranks: int, split: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dm = MovieLensDataModule(batch_size=512, split=split, synthetic_size=(50, 60, 5003))
    monkeypatch.setattr(dm, "rank_and_world_size", lambda: (0, ranks))
    dm.setup("fit")
    for name in ("val", "test"):
        dataset = dm.datasets[name]
        sizes = [dataset[i].batch_size for i in range(len(dataset))]
        assert sum(sizes) == len(dataset.rows)  # the newest ratings of a time split are scored too
        assert len(sizes) % ranks == 0 and max(sizes) <= 512 and max(sizes) - min(sizes) <= 1
    train = dm.datasets["train"]
    assert len(train) == len(train.rows) // 512  # training keeps whole batches


def test_training_rows_are_reshuffled_every_epoch() -> None:
    dm = MovieLensDataModule(batch_size=64, split="time", synthetic_size=(50, 60, 3000))
    dm.setup("fit")
    train = dm.datasets["train"]
    train.set_epoch(0)
    first = train[0].sparse_features.values().clone()
    train.set_epoch(1)
    second = train[0].sparse_features.values().clone()
    assert not np.array_equal(first.numpy(), second.numpy())
    train.set_epoch(0)
    np.testing.assert_array_equal(train[0].sparse_features.values().numpy(), first.numpy())  # seeded
    # A batch is not a block of consecutive rows: the rows of batch 0 span the whole split.
    rows = train._order[:64]
    assert rows.max() - rows.min() > 10 * 64
    # Without shuffle the order is the split's own.
    plain = MovieLensDataModule(batch_size=64, split="time", shuffle=False, synthetic_size=(50, 60, 3000))
    plain.setup("fit")
    plain.datasets["train"].set_epoch(5)
    np.testing.assert_array_equal(plain.datasets["train"]._order, plain.datasets["train"].rows)


def test_pooling_is_a_choice() -> None:
    from lightrec.modules import PoolingType

    dm = MovieLensDataModule(pooling="MEAN", synthetic_size=(20, 30, 500))
    assert {c.pooling for c in dm.table_configs(8)} == {PoolingType.MEAN}
    assert {c.pooling for c in MovieLensDataModule(synthetic_size=(20, 30, 500)).table_configs(8)} == {
        PoolingType.SUM
    }
    with pytest.raises(ValueError, match="pooling must be 'SUM' or 'MEAN', got 'MAX'"):
        MovieLensDataModule(pooling="MAX")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        MovieLensDataModule(batch_size=0)


def test_the_rank_loader_reshuffles_rows_each_epoch_on_every_rank_alike() -> None:
    """RankDataLoader hands the sampler's epoch to the dataset, so ranks draw the same row order."""
    from lightrec.data import rank_dataloader

    dm = MovieLensDataModule(batch_size=32, synthetic_size=(40, 50, 2000))
    dm.setup("fit")
    firsts = {}
    for rank in (0, 1):
        loader = rank_dataloader(dm.datasets["train"], rank=rank, world_size=2)
        for epoch in (0, 1):
            loader.sampler.set_epoch(epoch)
            firsts[rank, epoch] = next(iter(loader)).labels.clone()
    assert not np.array_equal(firsts[0, 0].numpy(), firsts[0, 1].numpy())  # new rows in epoch 1
    dataset = dm.datasets["train"]
    for epoch in (0, 1):  # rank r's first batch is global batch r of that epoch's order
        dataset.set_epoch(epoch)
        for rank in (0, 1):
            np.testing.assert_array_equal(firsts[rank, epoch].numpy(), dataset[rank].labels.numpy())
