"""Vectorised randomness without tables: integer hashing, power-law ids, id scrambling, exact AUC.

The synthetic data attaches a hidden effect to every id of up to 48M-row features. Storing those
effects would cost gigabytes per worker, so an effect is recomputed from a 64-bit hash of
``(seed, feature, id)`` instead (splitmix64 finaliser: cheap, well mixed, identical everywhere).
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = [
    "bounded_zipf",
    "coprime_multiplier",
    "exact_auc",
    "expected_auc",
    "hash_unit",
    "hash_uniform",
    "mix64",
    "stream_key",
    "zipf_tables",
]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser of a uint64 array (wrapping arithmetic is intended)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x += _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def stream_key(seed: int, stream: int) -> np.uint64:
    """The 64-bit key of hash stream ``stream`` under ``seed`` (xor-ed into the ids before mixing)."""
    return mix64(np.array([(seed * 1_000_003 + stream) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]


def hash_uniform(ids: np.ndarray, seed: int, stream: int) -> np.ndarray:
    """A float64 in ``[0, 1)`` per id, a pure function of ``(seed, stream, id)``."""
    h = mix64(ids.astype(np.uint64) ^ stream_key(seed, stream))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def hash_unit(ids: np.ndarray, seed: int, stream: int) -> np.ndarray:
    """A zero-mean, unit-variance value per id: uniform on ``[-sqrt(3), sqrt(3))`` (one hash, no transcendentals)."""
    return (hash_uniform(ids, seed, stream) - 0.5) * (2.0 * math.sqrt(3.0))


_HEAD = 1024


@functools.lru_cache(maxsize=256)
def zipf_tables(n: int, exponent: float) -> tuple[np.ndarray, float, float, float]:
    """Exact CDF of the ``head`` most popular ranks, and the tail's interval and mass."""
    head = min(n, _HEAD)
    weights = np.arange(1, head + 1, dtype=np.float64) ** -exponent
    lo, hi = head + 0.5, n + 0.5
    if exponent == 1.0:
        tail = math.log(hi / lo)
    else:
        tail = (hi ** (1.0 - exponent) - lo ** (1.0 - exponent)) / (1.0 - exponent)
    total = weights.sum() + tail
    return np.cumsum(weights) / total, lo, hi, tail / total


def bounded_zipf(u: np.ndarray, n: int, exponent: float) -> np.ndarray:
    """Map uniforms ``u`` in ``[0, 1)`` to popularity ranks in ``[0, n)`` with ``P(rank r) ~ (r+1)^-exponent``.

    The 1024 most popular ranks are drawn exactly (CDF lookup); the long tail by the inverse CDF
    of the continuous power law on ``[1024.5, n + 0.5)``, rounded (midpoint rule, accurate to
    ~1e-6 relative there). A few vectorised operations per id; ``exponent == 0`` is uniform.
    """
    cdf, lo, hi, tail_mass = zipf_tables(int(n), float(exponent))
    ranks = np.searchsorted(cdf, u, side="right").astype(np.int64)
    in_tail = ranks >= cdf.shape[0]
    if tail_mass > 0 and in_tail.any():
        v = (u[in_tail] - (1.0 - tail_mass)) / tail_mass  # uniform in [0, 1) within the tail
        if exponent == 1.0:
            x = lo * np.exp(v * math.log(hi / lo))
        else:
            a = 1.0 - exponent
            x = (lo**a + v * (hi**a - lo**a)) ** (1.0 / a)
        ranks[in_tail] = np.rint(x).astype(np.int64) - 1
    return np.clip(ranks, 0, n - 1)


def coprime_multiplier(n: int, seed: int, stream: int) -> tuple[int, int]:
    """``(a, b)`` such that ``r -> (a * r + b) % n`` is a permutation of ``[0, n)``.

    Used to scatter popularity ranks over the id space, so the hot ids of a feature are not all
    in the first rows of its table (which would put them all on one rank under row-wise sharding).
    """
    h = int(mix64(np.array([seed * 7919 + stream], dtype=np.uint64))[0])
    if n == 1:
        return 1, 0
    a = 1 + h % (n - 1)
    while math.gcd(a, n) != 1:
        a = a + 1 if a + 1 < n else 1
    b = (h >> 32) % n
    return a, b


def exact_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC of ``scores`` for binary ``labels`` (ties count one half); ``nan`` without both classes."""
    return expected_auc(scores, labels.astype(np.float64))


def expected_auc(scores: np.ndarray, p: np.ndarray) -> float:
    """Expected AUC of ``scores`` when sample ``i`` is positive with probability ``p[i]``.

    ``AUC = sum_{i != j} p_i (1 - p_j) [s_i > s_j] / sum_{i != j} p_i (1 - p_j)`` with ties counting
    one half. With 0/1 ``p`` this is the ordinary AUC; with the true click probabilities as both
    scores and ``p`` it is the Bayes-optimal AUC, free of the label-sampling noise.
    O(n log n): sort, group ties, prefix sums.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    order = np.argsort(scores, kind="stable")
    s, pos = scores[order], p[order]
    neg = 1.0 - pos
    _, starts = np.unique(s, return_index=True)
    pos_g = np.add.reduceat(pos, starts)
    neg_g = np.add.reduceat(neg, starts)
    neg_below = np.cumsum(neg_g) - neg_g
    # Pairs within a tie group (including i == j, removed below) count one half.
    num = float(np.sum(pos_g * neg_below) + 0.5 * np.sum(pos_g * neg_g) - 0.5 * np.sum(pos * neg))
    den = float(pos.sum() * neg.sum() - np.sum(pos * neg))
    return num / den if den > 0 else float("nan")
