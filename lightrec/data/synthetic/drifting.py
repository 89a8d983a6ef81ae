"""A drifting vocabulary of raw 63-bit ids, for the synthetic data's ``vocabulary="drifting"`` mode.

Production id spaces are not ``[0, n)``: ids are 64-bit hashes, new ones appear every minute and
old ones stop being seen. This models that for one feature of ``n`` live ids at a time:

* ids are *born* at a steady rate (``births_per_sample``) and live for ``n`` births: at time ``t``
  (a sample index) the live ids are the births ``[s, s + n)`` with ``s = floor(t * rate)``;
* popularity belongs to a *position* ``p in [0, n)`` (the planted model's power-law draw picks
  positions); the live id at position ``p`` is the birth ``k = s + ((p - s) mod n)``, so an id
  keeps its position -- and its popularity -- for its whole life, then a new id takes over the
  position (a new id may be popular at once, as in life);
* the raw id of birth ``k`` is a 63-bit hash of ``(seed, feature, k)``: non-negative int64, spread
  over ``[0, 2**63)``, never reused.

Over a run of ``T`` samples a feature sees about ``n + T * rate`` distinct ids; ``rate = drift * n
/ batch_size`` replaces the share ``drift`` of the vocabulary every batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightrec.data.hashing import mix64

__all__ = ["DriftingVocabulary"]

ID_BITS = 63


class DriftingVocabulary:
    """Raw ids of drifting vocabularies, one per feature (see the module docstring).

    Args:
        sizes: live ids per feature ``n_f``.
        births_per_sample: new ids per sample, per feature (or one rate for all).
        seed: fixes the raw ids.

    Raises:
        ValueError: a negative rate or a size below 1.
    """

    def __init__(self, sizes: Sequence[int], births_per_sample: float | Sequence[float], seed: int) -> None:
        self.sizes = [int(n) for n in sizes]
        rates = [births_per_sample] * len(self.sizes) if isinstance(births_per_sample, (int, float)) \
            else list(births_per_sample)  # fmt: skip
        if len(rates) != len(self.sizes) or any(r < 0 for r in rates) or any(n < 1 for n in self.sizes):
            raise ValueError(
                f"DriftingVocabulary needs sizes >= 1 and one rate >= 0 per feature, got sizes {self.sizes} "
                f"and births_per_sample {births_per_sample!r}"
            )
        self.rates = [float(r) for r in rates]
        self.seed = int(seed)

    def first_birth(self, feature: int, time: int) -> int:
        """``s``: the oldest live birth of ``feature`` at sample ``time``."""
        return int(time * self.rates[feature])

    def births(self, feature: int, positions: np.ndarray, time: int) -> np.ndarray:
        """The birth number of the live id at each position (int64)."""
        n, s = self.sizes[feature], self.first_birth(feature, time)
        return s + np.mod(positions.astype(np.int64) - s, n)

    def raw_ids(self, feature: int, births: np.ndarray) -> np.ndarray:
        """The 63-bit raw id of each birth number of ``feature`` (non-negative int64)."""
        salt = np.uint64(((self.seed * 0x9E3779B1) ^ (feature << 48) ^ 0xD1F7) & 0xFFFFFFFFFFFFFFFF)
        return (mix64(births.astype(np.uint64) ^ salt) >> np.uint64(64 - ID_BITS)).astype(np.int64)

    def ids(self, feature: int, positions: np.ndarray, time: int) -> np.ndarray:
        """Raw ids of the live ids at ``positions`` of ``feature`` at sample ``time``."""
        return self.raw_ids(feature, self.births(feature, positions, time))

    def distinct_ids(self, feature: int, samples: int) -> int:
        """Distinct ids ``feature`` can show over ``samples`` samples from time 0."""
        return self.sizes[feature] + self.first_birth(feature, samples)
