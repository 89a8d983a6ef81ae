"""torchrec's ``RandomRecDataset`` (``torchrec.datasets.random`` re-exports it): batches of random
ids, dense features and labels, for benchmarks and smoke tests of a training loop.

One batch of ``B`` samples and keys ``k_0 .. k_{F-1}``::

    sparse_features   KJT, key k_f: ids_per_features[f] ids per sample, uniform in [0, hash_sizes[f])
    dense_features    [B, num_dense]  float32, standard normal
    labels            [B]             int64, 0 or 1

With ``manual_seed`` the draws come from one ``torch.Generator`` in torchrec's order (per key the
ids, then the dense features, then the labels), and the batches are torchrec's for the same seed
and arguments: one batch is drawn when the dataset is built and yielded ``num_generated_batches``
times per cycle (the same object, as torchrec caches it); with a negative ``num_generated_batches``
that first draw is discarded, as torchrec's is, and every batch is drawn afresh. Distinct
reproducible batches: ``num_generated_batches=-1`` with ``num_batches=n`` and a seed.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import IterableDataset

from lightrec.data.batch import Batch
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["RandomRecDataset"]


def _per_key(name: str, single: int | None, per_key: list[int] | None, keys: list[str], default: int) -> list[int]:
    values = per_key if per_key is not None else [single or default] * len(keys)
    if len(values) != len(keys):
        raise ValueError(
            f"RandomRecDataset: {name} has {len(values)} entries for {len(keys)} keys {keys}; give one per key"
        )
    if any(not isinstance(v, int) or v <= 0 for v in values):
        raise ValueError(f"RandomRecDataset: {name} must be positive ints, got {values}")
    return list(values)


class RandomRecDataset(IterableDataset):
    """Random recommendation batches (see the module docstring).

    Args:
        keys: sparse feature names.
        batch_size: samples per batch.
        hash_size: ids of every key are drawn from ``[0, hash_size)`` (default 100).
        hash_sizes: one bound per key (overrides ``hash_size``).
        ids_per_feature: ids per sample of every key (default 2).
        ids_per_features: one count per key (overrides ``ids_per_feature``).
        num_dense: dense features per sample.
        manual_seed: seed of the generator (None: torch's global generator).
        num_batches: batches per iteration (None: endless).
        num_generated_batches: how many times the one batch drawn at construction is yielded
            before the cycle repeats (torchrec's meaning); a negative value draws every batch
            afresh (0, which torchrec cannot iterate, does too).
    """

    def __init__(
        self,
        keys: list[str],
        batch_size: int,
        hash_size: int | None = 100,
        hash_sizes: list[int] | None = None,
        ids_per_feature: int | None = 2,
        ids_per_features: list[int] | None = None,
        num_dense: int = 50,
        manual_seed: int | None = None,
        num_batches: int | None = None,
        num_generated_batches: int = 10,
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
        self.hash_sizes = _per_key("hash_sizes", hash_size, hash_sizes, self.keys, 100)
        self.ids_per_features = _per_key("ids_per_features", ids_per_feature, ids_per_features, self.keys, 2)
        self.num_dense = num_dense
        self.num_batches = num_batches
        self.num_generated_batches = num_generated_batches
        self._generator = torch.Generator().manual_seed(manual_seed) if manual_seed is not None else None
        first = self._draw()  # drawn whatever num_generated_batches is: torchrec's generator state
        self._cached = [first] * max(num_generated_batches, 0)

    def _draw(self) -> Batch:
        g, b = self._generator, self.batch_size
        values = [
            torch.randint(high=h, size=(n * b,), generator=g) for h, n in zip(self.hash_sizes, self.ids_per_features)
        ]
        lengths = torch.tensor([n for n in self.ids_per_features for _ in range(b)], dtype=torch.int32)
        sparse = KeyedJaggedTensor.from_lengths_sync(keys=self.keys, values=torch.cat(values), lengths=lengths)
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
