"""The planted model of the synthetic Criteo-like click data: a hidden, known ground truth.

Every sample has the Criteo schema (13 dense, 26 categorical features with Criteo's cardinalities,
optionally scaled down). Ids follow a power law (Zipf) and labels come from a hidden logistic model::

    z        ~ N(0, I_13)                       dense_features = log1p(exp(mu + sigma * z))
    ids_f    ~ Zipf(exponent) over [0, n_f)      scattered over the table by a fixed permutation
    logit    = bias + w . z + sum_f mean_{id in bag_f} effect_f(id)
    label    ~ Bernoulli(sigmoid(logit))

``effect_f(id) = std_f * U(-sqrt 3, sqrt 3)`` (unit variance) is recomputed from a hash of ``(seed, f, id)``, so no table of
effects exists anywhere. Because the click probabilities are known, the best AUC any model can
reach (the Bayes-optimal AUC) is computed exactly in expectation over labels:
:meth:`PlantedCriteoModel.bayes_optimal_auc`. A model that learns reaches a clearly better AUC
than 0.5; how close it gets to the Bayes AUC measures how well it learns.

``vocabulary="drifting"`` (:mod:`lightrec.data.synthetic.drifting`) replaces the ids ``[0, n_f)`` by raw 63-bit
ids of a vocabulary that drifts over time: each feature keeps ``n_f`` live ids whose popularity
follows the same power law, new ids are born and old ones die at ``drift_per_batch`` of the
vocabulary per batch, and validation/test data come from the time after the training stream. The
tables are then ``n_f`` rows behind managed collisions (``RecModule(managed_collisions=...)``); the
Bayes-optimal AUC is unchanged (effects are hashes of the raw ids, popularity is stationary).

:class:`~lightrec.data.SyntheticCriteoDataset` (:mod:`lightrec.data.synthetic.criteo`) cuts the
samples of this model into batches; :mod:`lightrec.data.synthetic.device` draws them with torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from lightrec.data.criteo.spec import CAT_FEATURE_COUNT, INT_FEATURE_COUNT
from lightrec.data.errors import check_at_least
from lightrec.data.hashing import bounded_zipf, coprime_multiplier, expected_auc, hash_unit
from lightrec.data.synthetic.drifting import DriftingVocabulary

__all__ = ["PlantedCriteoModel", "SPLITS", "SampleBlock", "sigmoid", "split_code"]

SPLITS: dict[str, int] = {"train": 0, "val": 1, "test": 2, "holdout": 3}
_MAX_SEED = 1 << 48
"""Seeds are ints in ``[0, 2**48)``: numpy refuses negative ones, the hashes of larger ones overflow."""


@dataclass
class SampleBlock:
    """``n`` generated samples: ``dense`` [n, 13] float32, ``ids`` 26 int64 arrays (feature-major,
    samples in order), ``lengths`` [26, n] int32, ``logit`` [n] float64, ``labels`` [n] float32."""

    dense: np.ndarray
    ids: list[np.ndarray]
    lengths: np.ndarray
    logit: np.ndarray
    labels: np.ndarray


def split_code(split: str) -> int:
    """The code of a split name (``SPLITS``); a ``ValueError`` names the known splits."""
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
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < _MAX_SEED:
            raise ValueError(f"seed must be an int in [0, 2**48), got {seed!r}; pick another seed")
        self.num_embeddings = [int(n) for n in num_embeddings_per_feature]
        self.vocabulary = vocabulary
        if len(self.num_embeddings) != CAT_FEATURE_COUNT:
            raise ValueError(
                f"num_embeddings_per_feature needs {CAT_FEATURE_COUNT} ints, got {len(self.num_embeddings)}"
            )
        check_at_least(0, zipf_exponent=zipf_exponent)
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
        labels = (rng.random(n) < sigmoid(logit)).astype(np.float32)
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
        p = sigmoid(np.concatenate(logits))
        return expected_auc(p, p)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function of a float array."""
    return 1.0 / (1.0 + np.exp(-x))
