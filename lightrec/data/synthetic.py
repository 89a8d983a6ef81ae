"""Synthetic Criteo-like click data with a planted, known ground truth.

Every sample has the Criteo schema (13 dense, 26 categorical features with Criteo's cardinalities,
optionally scaled down). Ids follow a power law (Zipf) and labels come from a hidden logistic model::

    z        ~ N(0, I_13)                       dense_features = log1p(exp(mu + sigma * z))
    ids_f    ~ Zipf(exponent) over [0, n_f)      scattered over the table by a fixed permutation
    logit    = bias + w . z + sum_f mean_{id in bag_f} effect_f(id)
    label    ~ Bernoulli(sigmoid(logit))

``effect_f(id) = std_f * U(-sqrt 3, sqrt 3)`` (unit variance) is recomputed from a hash of ``(seed, f, id)``, so no table of
effects exists anywhere. Because the click probabilities are known, the best AUC any model can
reach (the Bayes-optimal AUC) is computed exactly in expectation over labels:
:meth:`SyntheticCriteoDataset.bayes_optimal_auc`. A model that learns reaches a clearly better AUC
than 0.5; how close it gets to the Bayes AUC measures how well it learns.

``vocabulary="drifting"`` (:mod:`lightrec.data.drifting`) replaces the ids ``[0, n_f)`` by raw 63-bit
ids of a vocabulary that drifts over time: each feature keeps ``n_f`` live ids whose popularity
follows the same power law, new ids are born and old ones die at ``drift_per_batch`` of the
vocabulary per batch, and validation/test data come from the time after the training stream. The
tables are then ``n_f`` rows behind managed collisions (``RecModule(managed_collisions=...)``); the
Bayes-optimal AUC is unchanged (effects are hashes of the raw ids, popularity is stationary).

Determinism: samples are generated in blocks of ``block_size`` samples; block ``k`` of split ``s``
has its own generator seeded by ``(seed, s, k)``. A batch is ``batch_size / block_size`` consecutive
blocks, so a batch depends only on ``(seed, split, batch index)`` — not on workers, ranks or order —
and two ranks' batches of size ``B`` at one step equal one batch of size ``2B`` on one rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from lightrec.data._random import bounded_zipf, coprime_multiplier, expected_auc, hash_unit
from lightrec.data.batch import Batch
from lightrec.data.criteo_spec import (
    CAT_FEATURE_COUNT,
    DEFAULT_CAT_NAMES,
    INT_FEATURE_COUNT,
    resolve_cardinalities,
    table_configs,
)
from lightrec.data.device_synthetic import TorchPlantedSampler
from lightrec.data.drifting import DriftingVocabulary
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["PlantedCriteoModel", "SPLITS", "SyntheticCriteoDataset"]

SPLITS: dict[str, int] = {"train": 0, "val": 1, "test": 2, "holdout": 3}


@dataclass
class SampleBlock:
    """``n`` generated samples: ``dense`` [n, 13] float32, ``ids`` 26 int64 arrays (feature-major,
    samples in order), ``lengths`` [26, n] int32, ``logit`` [n] float64, ``labels`` [n] float32."""

    dense: np.ndarray
    ids: list[np.ndarray]
    lengths: np.ndarray
    logit: np.ndarray
    labels: np.ndarray


def _check_split(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    return SPLITS[split]


class PlantedCriteoModel:
    """The hidden generator: id distributions and the logistic model that draws the labels.

    Args:
        seed: fixes every hidden parameter (and, with split and block, every sample).
        num_embeddings_per_feature: 26 table sizes ``n_f``; ids of feature ``f`` lie in ``[0, n_f)``.
        zipf_exponent: power-law exponent of id popularity (0 = uniform; Criteo is ~1.0-1.3).
        ids_per_feature: ids per sample per feature (one int for all features, or 26 ints).
        ids_distribution: ``"fixed"`` (exactly that many) or ``"poisson"`` (Poisson with that mean;
            empty bags happen).
        dense_signal: standard deviation of the dense part ``w . z`` of the logit.
        sparse_signal: root of the summed variances of the 26 per-feature effects.
        base_ctr: ``sigmoid(bias)``; the realised click rate is somewhat closer to 0.5.
        vocabulary: None (ids ``[0, n_f)``) or a :class:`DriftingVocabulary` turning each drawn
            position into the raw id live there at the block's time.
    """

    def __init__(
        self,
        seed: int,
        num_embeddings_per_feature: Sequence[int],
        zipf_exponent: float = 1.1,
        ids_per_feature: int | Sequence[int] = 1,
        ids_distribution: Literal["fixed", "poisson"] = "fixed",
        dense_signal: float = 0.8,
        sparse_signal: float = 1.6,
        base_ctr: float = 0.25,
        vocabulary: DriftingVocabulary | None = None,
    ) -> None:
        self.num_embeddings = [int(n) for n in num_embeddings_per_feature]
        self.vocabulary = vocabulary
        if len(self.num_embeddings) != CAT_FEATURE_COUNT:
            raise ValueError(
                f"num_embeddings_per_feature needs {CAT_FEATURE_COUNT} ints, got {len(self.num_embeddings)}"
            )
        if zipf_exponent < 0:
            raise ValueError(f"zipf_exponent must be >= 0, got {zipf_exponent!r}")
        counts = (
            [ids_per_feature] * CAT_FEATURE_COUNT
            if isinstance(ids_per_feature, int)
            else list(ids_per_feature)
        )
        if len(counts) != CAT_FEATURE_COUNT or any(int(c) < 0 for c in counts):
            raise ValueError(
                f"ids_per_feature must be an int >= 0 or {CAT_FEATURE_COUNT} such ints, got {ids_per_feature!r}"
            )
        if ids_distribution not in ("fixed", "poisson"):
            raise ValueError(f"ids_distribution must be 'fixed' or 'poisson', got {ids_distribution!r}")
        if not 0.0 < base_ctr < 1.0:
            raise ValueError(f"base_ctr must be in (0, 1), got {base_ctr!r}")
        if dense_signal < 0 or sparse_signal < 0:
            raise ValueError(
                f"dense_signal and sparse_signal must be >= 0, got {dense_signal!r}, {sparse_signal!r}"
            )
        self.seed = int(seed)
        self.zipf_exponent = float(zipf_exponent)
        self.ids_per_feature = [int(c) for c in counts]
        self.ids_distribution = ids_distribution
        rng = np.random.default_rng([self.seed, 0x5EED])
        self.dense_mu = rng.uniform(0.5, 3.0, INT_FEATURE_COUNT)
        self.dense_sigma = rng.uniform(0.5, 1.5, INT_FEATURE_COUNT)
        g = rng.standard_normal(INT_FEATURE_COUNT)
        self.dense_weight = dense_signal * g / np.linalg.norm(g)
        u = rng.uniform(0.2, 1.0, CAT_FEATURE_COUNT)
        self.effect_std = sparse_signal * u / np.linalg.norm(u)
        self.bias = math.log(base_ctr / (1.0 - base_ctr))
        self.scatter = [coprime_multiplier(n, self.seed, f) for f, n in enumerate(self.num_embeddings)]

    def id_effect(self, feature: int, ids: np.ndarray) -> np.ndarray:
        """Hidden logit contribution of each id of ``feature`` (float64, same shape as ``ids``)."""
        return self.effect_std[feature] * hash_unit(ids, self.seed, 1000 + feature)

    def generate_block(self, split: int, block: int, n: int, time: int = 0) -> SampleBlock:
        """Draw the ``n`` samples of block ``block`` of split code ``split`` (see ``SampleBlock``);
        ``time``: the sample index the block starts at (where a drifting vocabulary stands)."""
        rng = np.random.default_rng([self.seed, split, block])
        z = rng.standard_normal((n, INT_FEATURE_COUNT))
        dense = np.log1p(np.exp(self.dense_mu + self.dense_sigma * z)).astype(np.float32)
        logit = self.bias + z @ self.dense_weight
        ids_out: list[np.ndarray] = []
        lengths = np.empty((CAT_FEATURE_COUNT, n), dtype=np.int32)
        for f, size in enumerate(self.num_embeddings):
            k = self.ids_per_feature[f]
            if self.ids_distribution == "poisson":
                counts = rng.poisson(k, n).astype(np.int32)
            else:
                counts = np.full(n, k, dtype=np.int32)
            ranks = bounded_zipf(rng.random(int(counts.sum())), size, self.zipf_exponent)
            a, b = self.scatter[f]
            ids = (ranks * a + b) % size
            if self.vocabulary is not None:
                ids = self.vocabulary.ids(f, ids, time)
            effects = self.id_effect(f, ids)
            if self.ids_distribution == "fixed" and k == 1:
                logit += effects
            elif effects.size:
                bag = np.repeat(np.arange(n), counts)
                sums = np.bincount(bag, weights=effects, minlength=n)
                logit += sums / np.maximum(counts, 1)
            ids_out.append(ids)
            lengths[f] = counts
        labels = (rng.random(n) < _sigmoid(logit)).astype(np.float32)
        return SampleBlock(dense, ids_out, lengths, logit, labels)

    def bayes_optimal_auc(self, num_samples: int = 1 << 18, block_size: int = 4096) -> float:
        """Best achievable AUC: expected AUC of the true probabilities on a held-out sample.

        Computed from the true probabilities on ``num_samples`` fresh samples (split ``holdout``)
        with :func:`expected_auc`, i.e. averaged exactly over the Bernoulli label draws; the
        remaining error is the sampling error of the features (~1e-3 at the default size).
        """
        logits = [
            self.generate_block(SPLITS["holdout"], k, min(block_size, num_samples - k * block_size)).logit
            for k in range(math.ceil(num_samples / block_size))
        ]
        p = _sigmoid(np.concatenate(logits))
        return expected_auc(p, p)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class SyntheticCriteoDataset(Dataset):
    """Map-style dataset whose item ``i`` is the whole :class:`Batch` number ``i`` of a split.

    Read it with ``DataLoader(ds, batch_size=None, sampler=RankBatchSampler(...))`` (or
    :func:`lightrec.data.rank_dataloader`); each worker builds whole batches with numpy.

    Args:
        batch_size: samples per batch ``B``.
        num_batches: batches in this split (over all ranks).
        split: ``"train"``, ``"val"``, ``"test"`` (disjoint sample streams).
        seed: fixes the hidden model and every sample.
        cardinalities: ``"kaggle"``, ``"1tb"`` or 26 ints.
        scale / num_embeddings_cap: shrink the tables (see :func:`resolve_cardinalities`).
        block_size: samples per generator seed; must divide ``batch_size`` (default: ``batch_size``).
            Keep it fixed to get identical samples under different per-rank batch sizes.
        vocabulary: ``"fixed"`` (ids ``[0, n_f)``) or ``"drifting"`` (raw 63-bit ids of a vocabulary
            that drifts; see the module docstring). Host batches only (``device=None``).
        drift_per_batch: with ``"drifting"``, the share of each feature's live ids replaced per
            batch of ``batch_size`` samples.
        time_offset_batches: with ``"drifting"``, batches of time before this split's first batch
            (validation and test data come after the training stream).
        device: None (default) draws batches with numpy on the host; a device (``"cuda"``,
            ``"cpu"``) draws them with torch right there (:mod:`lightrec.data.device_synthetic`):
            same hidden model and Bayes AUC, another sample stream, no host-to-device copy, every
            size host-known. Read a CUDA dataset in the main process (``num_workers=0``).
        **model_kwargs: ``zipf_exponent``, ``ids_per_feature``, ``ids_distribution``,
            ``dense_signal``, ``sparse_signal``, ``base_ctr`` of :class:`PlantedCriteoModel`.
    """

    def __init__(
        self,
        batch_size: int = 512,
        num_batches: int = 100,
        split: str = "train",
        seed: int = 0,
        cardinalities: str | Sequence[int] = "kaggle",
        scale: float = 1.0,
        num_embeddings_cap: int | None = None,
        block_size: int | None = None,
        device: torch.device | str | None = None,
        vocabulary: Literal["fixed", "drifting"] = "fixed",
        drift_per_batch: float = 0.02,
        time_offset_batches: int = 0,
        **model_kwargs: object,
    ) -> None:
        if vocabulary not in ("fixed", "drifting"):
            raise ValueError(f"vocabulary must be 'fixed' or 'drifting', got {vocabulary!r}")
        if vocabulary == "drifting" and device is not None:
            raise ValueError(
                f"vocabulary='drifting' draws its batches on the host; use device=None, got device={device!r}"
            )
        if drift_per_batch < 0 or time_offset_batches < 0:
            raise ValueError(
                f"drift_per_batch and time_offset_batches must be >= 0, got {drift_per_batch!r}, {time_offset_batches!r}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if num_batches < 0:
            raise ValueError(f"num_batches must be >= 0, got {num_batches!r}")
        block = batch_size if block_size is None else int(block_size)
        if block < 1 or batch_size % block != 0:
            raise ValueError(f"block_size must divide batch_size={batch_size}, got block_size={block_size!r}")
        self.batch_size = int(batch_size)
        self.num_batches = int(num_batches)
        self.split = split
        self._split_code = _check_split(split)
        self.block_size = block
        self.num_embeddings_per_feature = resolve_cardinalities(cardinalities, scale, num_embeddings_cap)
        self.vocabulary = vocabulary
        drifting = None
        if vocabulary == "drifting":
            rates = [drift_per_batch * n / batch_size for n in self.num_embeddings_per_feature]
            drifting = DriftingVocabulary(self.num_embeddings_per_feature, rates, seed)
        self.time_offset = int(time_offset_batches) * self.batch_size  # samples
        self.model = PlantedCriteoModel(
            seed, self.num_embeddings_per_feature, vocabulary=drifting, **model_kwargs  # type: ignore[arg-type]
        )
        self.keys = list(DEFAULT_CAT_NAMES)
        self.device = torch.device(device) if device is not None else None
        self._sampler: TorchPlantedSampler | None = None  # built on first use (device tensors)

    def __len__(self) -> int:
        return self.num_batches

    def _blocks(self, index: int) -> list[SampleBlock]:
        if not 0 <= index < self.num_batches:
            raise IndexError(
                f"batch index {index} is out of range for {self.num_batches} batches of split {self.split!r}"
            )
        per, size = self.batch_size // self.block_size, self.block_size
        return [
            self.model.generate_block(self._split_code, k, size, self.time_offset + k * size)
            for k in range(index * per, index * per + per)
        ]

    def __getitem__(self, index: int) -> Batch:
        if self.device is not None:
            return self._device_batch(index)[0]
        return self._to_batch(self._blocks(index))

    def batch_with_probabilities(self, index: int) -> tuple[Batch, torch.Tensor]:
        """Batch ``index`` and the true click probability of each of its samples ``[B]`` (float64)."""
        if self.device is not None:
            batch, device_logit = self._device_batch(index)
            return batch, torch.sigmoid(device_logit)
        blocks = self._blocks(index)
        logit = np.concatenate([b.logit for b in blocks])
        return self._to_batch(blocks), torch.from_numpy(_sigmoid(logit))

    def _device_batch(self, index: int) -> tuple[Batch, torch.Tensor]:
        """Batch ``index`` drawn on ``self.device`` and its logits ``[B]`` (see ``device``)."""
        if not 0 <= index < self.num_batches:
            raise IndexError(
                f"batch index {index} is out of range for {self.num_batches} batches of split {self.split!r}"
            )
        if self._sampler is None:
            assert self.device is not None
            self._sampler = TorchPlantedSampler(self.model, self.device)
        per = self.batch_size // self.block_size
        blocks = [self._sampler.generate(self._split_code, index * per + j, self.block_size) for j in range(per)]
        if len(blocks) == 1:
            values, ids_per_key = blocks[0].values, blocks[0].ids_per_key
        else:  # key-major over the whole batch: each key's ids of block 0, then block 1, ...
            pieces = [b.values.split(b.ids_per_key) for b in blocks]
            values = torch.cat([p[f] for f in range(CAT_FEATURE_COUNT) for p in pieces])
            ids_per_key = [sum(b.ids_per_key[f] for b in blocks) for f in range(CAT_FEATURE_COUNT)]
        kjt = KeyedJaggedTensor(
            keys=self.keys,
            values=values,
            lengths=torch.cat([b.lengths for b in blocks], dim=1).reshape(-1),
            stride=self.batch_size,
            length_per_key=ids_per_key,
        )
        batch = Batch(torch.cat([b.dense for b in blocks]), kjt, torch.cat([b.labels for b in blocks]))
        return batch, torch.cat([b.logit for b in blocks])

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_sampler"] = None  # rebuilt where the dataset is used (e.g. in a loader worker)
        return state

    def _to_batch(self, blocks: list[SampleBlock]) -> Batch:
        dense = np.concatenate([b.dense for b in blocks])
        labels = np.concatenate([b.labels for b in blocks])
        # Key-major KJT: all ids of cat_0 (block 0, block 1, ...), then cat_1, ...
        values = np.concatenate([b.ids[f] for f in range(CAT_FEATURE_COUNT) for b in blocks])
        lengths = np.concatenate([b.lengths for b in blocks], axis=1)
        kjt = KeyedJaggedTensor(
            keys=self.keys,
            values=torch.from_numpy(values.astype(np.int64, copy=False)),
            lengths=torch.from_numpy(lengths.reshape(-1)),
            stride=self.batch_size,
            # Ids per key, known here on the host: lookups that need them then read no device value.
            length_per_key=[int(n) for n in lengths.sum(axis=1)],
        )
        return Batch(torch.from_numpy(dense), kjt, torch.from_numpy(labels))

    def bayes_optimal_auc(self, num_samples: int = 1 << 18) -> float:
        """See :meth:`PlantedCriteoModel.bayes_optimal_auc` (same for every split)."""
        return self.model.bayes_optimal_auc(num_samples)

    def table_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """One table per categorical feature sized for this dataset's ids."""
        return table_configs(embedding_dim, self.num_embeddings_per_feature)
