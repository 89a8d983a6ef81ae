"""Batches of MovieLens interactions: :class:`MovieLensDataset` over a :class:`MovieLensData`.

Sparse features of a batch: ``userId``, the user side features when the release has a user file
(``gender``, ``age``, ``occupation``), ``movieId`` and ``genres`` (multi-hot: all genres of the
movie); dense features are ``[B, 0]``. Ids are the reader's dense ids (``0`` = unknown/padding).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from lightrec.data.batch import Batch
from lightrec.data.movielens.reader import MovieLensData
from lightrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["MovieLensDataset"]


class MovieLensDataset(Dataset):
    """Map-style dataset: item ``g`` is the ``Batch`` of interactions ``rows[g*B:(g+1)*B]``.

    Sparse keys: ``userId``, the user side features (if read), ``movieId``, ``genres``; dense
    features are ``[B, 0]``. Labels: ``rating >= label_threshold`` as 0./1. (CTR), or the raw rating
    when ``label_threshold`` is ``None`` (retrieval pairs, regression).

    Training splits (``cover_all=False``) are cut into ``len(rows) // batch_size`` whole batches
    (a last partial batch is dropped); with ``shuffle_seed`` set, :meth:`set_epoch` (called by
    :class:`~lightrec.data.RankDataLoader` every epoch) draws a new permutation of *all rows*
    before they are cut, so a batch is not the same block of consecutive rows every epoch
    (DataLoader workers get the new order when they start: with ``persistent_workers`` they keep
    the first epoch's).
    Evaluation splits (``cover_all=True``) score every row: they are cut into a multiple of
    ``ranks`` batches of at most ``batch_size`` rows (sizes differ by at most one), so each of
    ``ranks`` ranks runs the same number of steps and no row -- e.g. the newest ratings of a time
    split -- is left out.

    Args:
        data: the output of :func:`read_movielens`.
        rows: interaction indices of this split, in reading order.
        batch_size: samples per batch (at most, for ``cover_all``).
        label_threshold: click threshold on the rating (``4.0``: 4 and 5 stars are clicks).
        cover_all: keep every row (evaluation), see above.
        ranks: number of ranks the batches are shared by (``cover_all`` only).
        shuffle_seed: reshuffle the rows every epoch (training), see above.
        pooling: pooling of every table in :meth:`table_configs` (``genres`` is the multi-hot one).
    """

    def __init__(
        self,
        data: MovieLensData,
        rows: np.ndarray,
        batch_size: int,
        label_threshold: float | None = 4.0,
        cover_all: bool = False,
        ranks: int = 1,
        shuffle_seed: int | None = None,
        pooling: PoolingType = PoolingType.SUM,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if ranks < 1:
            raise ValueError(f"ranks must be a positive int, got {ranks!r}")
        self.data = data
        self.rows = np.asarray(rows, dtype=np.int64)
        self._order = self.rows
        self.batch_size = int(batch_size)
        self.label_threshold = label_threshold
        self.shuffle_seed = shuffle_seed
        self.pooling = PoolingType(pooling)
        n = len(self.rows)
        if cover_all:
            count = -(-n // (self.batch_size * ranks)) * ranks if n else 0
            self._bounds = np.linspace(0, n, count + 1).round().astype(np.int64) if count else np.zeros(1, np.int64)
        else:
            self._bounds = np.arange(n // self.batch_size + 1, dtype=np.int64) * self.batch_size
        self.user_keys = ["userId", *data.user_features]
        self.item_keys = ["movieId", "genres"]
        self.keys = self.user_keys + self.item_keys

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s order of the rows (only with ``shuffle_seed``; same on every rank)."""
        if self.shuffle_seed is not None:
            self._order = self.rows[np.random.default_rng((self.shuffle_seed, epoch)).permutation(len(self.rows))]

    def __getitem__(self, index: int) -> Batch:
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} is out of range for {len(self)} batches")
        r = self._order[self._bounds[index] : self._bounds[index + 1]]
        b = len(r)
        d = self.data
        users, items = d.user[r], d.item[r]
        starts, ends = d.genre_offsets[items], d.genre_offsets[items + 1]
        glen = ends - starts
        gidx = np.repeat(starts - np.cumsum(glen) + glen, glen) + np.arange(int(glen.sum()))
        values = (
            [users] + [d.user_features[k][users] for k in self.user_keys[1:]] + [items, d.genre_values[gidx]]
        )
        lengths = np.concatenate([np.ones(b * (len(self.keys) - 1), dtype=np.int32), glen.astype(np.int32)])
        kjt = KeyedJaggedTensor(
            keys=self.keys,
            values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
            lengths=torch.from_numpy(lengths),
            stride=b,
            length_per_key=[b] * (len(self.keys) - 1) + [int(glen.sum())],  # host-known: no sync later
        )
        rating = d.rating[r]
        labels = (
            (rating >= self.label_threshold).astype(np.float32)
            if self.label_threshold is not None
            else rating.astype(np.float32)
        )
        return Batch(torch.zeros(b, 0), kjt, torch.from_numpy(labels))

    def table_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """One table per sparse feature (``t_<feature>``), sized from the data."""
        return [
            EmbeddingBagConfig(
                num_embeddings=self.data.num_embeddings[k],
                embedding_dim=embedding_dim,
                name=f"t_{k}",
                feature_names=[k],
                pooling=self.pooling,
            )
            for k in self.keys
        ]
