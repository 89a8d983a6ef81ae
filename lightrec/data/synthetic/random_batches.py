"""torchrec's ``RandomRecDataset`` (``torchrec.datasets.random`` re-exports it): batches of random
ids, dense features and labels, for benchmarks and smoke tests of a training loop.

One batch of ``B`` samples and keys ``k_0 .. k_{F-1}``::

    sparse_features   KJT, key k_f: per sample a length uniform in [min_ids_per_features[f],
                      ids_per_features[f]], then that many ids uniform in [0, hash_sizes[f])
    dense_features    [B, num_dense]  float32, standard normal
    labels            [B]             int64, 0 or 1

torchrec's rules (1.8), so a script gets the batches it got from torchrec for the same seed and
arguments: ``min_ids_per_feature(s)`` default to ``ids_per_feature`` (fixed lengths) and, when
that is not given either, to 0 (lengths from 0 to ``ids_per_features[f]``, 2 by default). With
``manual_seed`` every draw comes from one ``torch.Generator`` in torchrec's order (per key the
lengths, then its ids; then the dense features, then the labels). ``num_generated_batches`` batches
are drawn when the dataset is built and yielded in turn (each iteration starts again at the first);
a negative value draws every batch afresh while iterating (0, which torchrec cannot iterate, does too).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import IterableDataset

from lightrec.data.batch import Batch
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["RandomRecDataset"]


def _per_key(name: str, values: list[int], keys: list[str], smallest: int) -> list[int]:
    if len(values) != len(keys):
        raise ValueError(
            f"RandomRecDataset: {name} has {len(values)} entries for {len(keys)} keys {keys}; give one per key"
        )
    if any(isinstance(v, bool) or not isinstance(v, int) or v < smallest for v in values):
        raise ValueError(f"RandomRecDataset: {name} must be ints >= {smallest}, got {values}")
    return list(values)


class RandomRecDataset(IterableDataset):
    """Random recommendation batches (see the module docstring).

    Args:
        keys: sparse feature names.
        batch_size: samples per batch.
        hash_size: ids of every key are drawn from ``[0, hash_size)`` (default 100).
        hash_sizes: one bound per key (overrides ``hash_size``).
        ids_per_feature: the most ids per sample of every key (default 2).
        ids_per_features: one most per key (overrides ``ids_per_feature``).
        num_dense: dense features per sample.
        manual_seed: seed of the generator (None: torch's global generator).
        num_batches: batches per iteration (None: endless).
        num_generated_batches: batches drawn at construction and yielded in turn; a negative
            value draws every batch afresh (0, which torchrec cannot iterate, does too).
        min_ids_per_feature: the fewest ids per sample of every key (default: ``ids_per_feature``,
            or 0 when that is not given).
        min_ids_per_features: one fewest per key (overrides ``min_ids_per_feature``).

    Raises:
        ValueError: a list whose length is not the number of keys, a negative count, a most below
            its fewest, sizes that are not positive.
    """

    def __init__(
        self,
        keys: list[str],
        batch_size: int,
        hash_size: int | None = None,
        hash_sizes: list[int] | None = None,
        ids_per_feature: int | None = None,
        ids_per_features: list[int] | None = None,
        num_dense: int = 50,
        manual_seed: int | None = None,
        num_batches: int | None = None,
        num_generated_batches: int = 10,
        min_ids_per_feature: int | None = None,
        min_ids_per_features: list[int] | None = None,
    ) -> None:
        super().__init__()
        if not keys or not all(isinstance(k, str) for k in keys):
            raise ValueError(f"RandomRecDataset: keys must be a non-empty list of feature names, got {keys!r}")
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"RandomRecDataset: batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(num_dense, int) or num_dense < 0:
            raise ValueError(f"RandomRecDataset: num_dense must be an int >= 0, got {num_dense!r}")
        if num_batches is not None and (not isinstance(num_batches, int) or num_batches < 0):
            raise ValueError(f"RandomRecDataset: num_batches must be None or an int >= 0, got {num_batches!r}")
        self.keys = list(keys)
        self.batch_size = batch_size
        n = len(self.keys)
        self.hash_sizes = _per_key("hash_sizes", hash_sizes or [hash_size or 100] * n, self.keys, 1)
        self.ids_per_features = _per_key("ids_per_features", ids_per_features or [ids_per_feature or 2] * n, self.keys, 0)
        # torchrec: the fewest default to ids_per_feature (not ids_per_features), else 0
        fewest = min_ids_per_feature if min_ids_per_feature is not None else ids_per_feature
        self.min_ids_per_features = _per_key(
            "min_ids_per_features", min_ids_per_features or [fewest or 0] * n, self.keys, 0
        )
        for key, low, high in zip(self.keys, self.min_ids_per_features, self.ids_per_features, strict=True):
            if low > high:
                raise ValueError(
                    f"RandomRecDataset: key {key!r} has min_ids_per_features {low} above its ids_per_features "
                    f"{high}; the fewest ids per sample cannot exceed the most"
                )
        self.num_dense = num_dense
        self.num_batches = num_batches
        self.num_generated_batches = num_generated_batches
        self._generator = torch.Generator().manual_seed(manual_seed) if manual_seed is not None else None
        self._cached = [self._draw() for _ in range(num_generated_batches)]

    def _draw(self) -> Batch:
        g, b = self._generator, self.batch_size
        values, lengths = [], []
        for h, low, high in zip(self.hash_sizes, self.min_ids_per_features, self.ids_per_features, strict=True):
            length = torch.randint(low, high + 1, (b,), dtype=torch.int32, generator=g)
            values.append(torch.randint(0, h, (int(length.sum()),), generator=g))
            lengths.append(length)
        sparse = KeyedJaggedTensor.from_lengths_sync(keys=self.keys, values=torch.cat(values), lengths=torch.cat(lengths))
        dense = torch.randn(b, self.num_dense, generator=g)
        labels = torch.randint(low=0, high=2, size=(b,), generator=g)
        return Batch(dense_features=dense, sparse_features=sparse, labels=labels)

    def __iter__(self) -> Iterator[Batch]:
        index = 0
        while self.num_batches is None or index < self.num_batches:
            yield self._cached[index % len(self._cached)] if self._cached else self._draw()
            index += 1

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("RandomRecDataset(num_batches=None) is endless and has no len()")
        return self.num_batches
