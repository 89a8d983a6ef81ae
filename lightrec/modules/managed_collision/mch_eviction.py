"""Eviction policies of ``MCHManagedCollisionModule``: which ids keep a row when rows run out.

A policy turns per-slot metadata into a *score*; at every eviction round the ids of a bucket --
residents and the ids that waited for a row since the last round -- are ranked by score, the top
ones keep (or get) a row and the rest are evicted (or keep waiting). Between rounds, a new id takes
a free row at once, or the row of the resident that ranked lowest at the last round and has not
been seen since (``MCHManagedCollisionModule(immediate_eviction_fraction=...)``).

================================  ===========================================  =====================
policy                            score (higher keeps the row)                 metadata per slot
================================  ===========================================  =====================
``LFU_EvictionPolicy``            ``counts``                                   counts
``LRU_EvictionPolicy``            ``last_access`` (the order of                 last_access_iter
                                  ``-(iter - last_access + 1) ** decay``)
``DistanceLFU_EvictionPolicy``    ``counts / (iter - last_access + 1) ** decay``  both
``TTL_EvictionPolicy(ttl)``       like LRU, and ids unseen for more than       last_access_iter
                                  ``ttl`` iterations are evicted every round
================================  ===========================================  =====================

``counts`` of a resident are the lookups since it got its row; of a waiting id, its lookups since
the last round. The names, arguments and metadata buffers (``_mch_counts``,
``_mch_last_access_iter``) are torchrec's, so torchrec code and state dicts work unchanged.
``threshold_filtering_func`` (torchrec's, experimental there too) filters the waiting ids by their
counts before a round, each bucket's on their own (so that a shard keeps the ids the whole table
keeps): ``func(counts) -> (keep mask, threshold)``; ``dynamic_threshold_filter``,
``average_threshold_filter`` and ``probabilistic_threshold_filter`` are ready-made ones.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import NamedTuple

import torch

__all__ = [
    "DistanceLFU_EvictionPolicy",
    "LFU_EvictionPolicy",
    "LRU_EvictionPolicy",
    "MCHEvictionPolicy",
    "MCHEvictionPolicyMetadataInfo",
    "TTL_EvictionPolicy",
    "average_threshold_filter",
    "dynamic_threshold_filter",
    "probabilistic_threshold_filter",
]

ThresholdFilter = Callable[[torch.Tensor], tuple[torch.Tensor, float | torch.Tensor]]


class MCHEvictionPolicyMetadataInfo(NamedTuple):
    """One metadata field of a policy (torchrec's record).

    Attributes:
        metadata_name: ``"counts"`` or ``"last_access_iter"``; the slot buffer is ``_mch_<name>``.
        is_mch_metadata: kept per slot (and saved).
        is_history_metadata: also tracked for ids waiting for a row.
    """

    metadata_name: str
    is_mch_metadata: bool
    is_history_metadata: bool


_COUNTS = MCHEvictionPolicyMetadataInfo("counts", True, False)
_LAST_ACCESS = MCHEvictionPolicyMetadataInfo("last_access_iter", True, True)


class MCHEvictionPolicy(abc.ABC):
    """Base class of eviction policies (see the module docstring).

    Args:
        metadata_info: the slot metadata this policy reads.
        threshold_filtering_func: optional filter of waiting ids by their counts before a round.
    """

    def __init__(
        self,
        metadata_info: list[MCHEvictionPolicyMetadataInfo],
        threshold_filtering_func: ThresholdFilter | None = None,
    ) -> None:
        if threshold_filtering_func is not None and not callable(threshold_filtering_func):
            raise TypeError(f"threshold_filtering_func must be callable, got {threshold_filtering_func!r}")
        self._metadata_info = list(metadata_info)
        self._threshold_filtering_func = threshold_filtering_func

    @property
    def metadata_info(self) -> list[MCHEvictionPolicyMetadataInfo]:
        return list(self._metadata_info)

    @property
    def metadata_names(self) -> list[str]:
        return [m.metadata_name for m in self._metadata_info if m.is_mch_metadata]

    @abc.abstractmethod
    def scores(self, counts: torch.Tensor, last_access: torch.Tensor, current_iter: int) -> torch.Tensor:
        """``[n]`` float64 scores (higher keeps the row) of ids with these ``[n]`` counts and last accesses."""

    def expired(self, last_access: torch.Tensor, current_iter: int) -> torch.Tensor | None:
        """``[n]`` bool: residents to evict at a round whatever their rank (None: none)."""
        return None

    def filter_candidates(self, counts: torch.Tensor) -> torch.Tensor | None:
        """Keep-mask of waiting ids with these counts (None: keep all)."""
        if self._threshold_filtering_func is None:
            return None
        mask, _ = self._threshold_filtering_func(counts)
        if mask.dtype != torch.bool:  # an index array, as torchrec allows
            keep = torch.zeros(counts.numel(), dtype=torch.bool, device=counts.device)
            keep[mask] = True
            return keep
        return mask

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _distance(last_access: torch.Tensor, current_iter: int, decay_exponent: float) -> torch.Tensor:
    return torch.pow((current_iter - last_access + 1).to(torch.float64).clamp_(min=1.0), decay_exponent)


class LFU_EvictionPolicy(MCHEvictionPolicy):  # noqa: N801 - torchrec's public name
    """Least frequently used: keep the ids looked up most often."""

    def __init__(self, threshold_filtering_func: ThresholdFilter | None = None) -> None:
        super().__init__([_COUNTS], threshold_filtering_func)

    def scores(self, counts: torch.Tensor, last_access: torch.Tensor, current_iter: int) -> torch.Tensor:
        return counts.to(torch.float64)


class LRU_EvictionPolicy(MCHEvictionPolicy):  # noqa: N801 - torchrec's public name
    """Least recently used: keep the ids seen last.

    Args:
        decay_exponent: exponent of the distance ``iter - last_access + 1`` (any positive value
            gives the same order; kept for torchrec's signature).
    """

    def __init__(self, decay_exponent: float = 1.0, threshold_filtering_func: ThresholdFilter | None = None) -> None:
        super().__init__([_LAST_ACCESS], threshold_filtering_func)
        self._decay_exponent = float(decay_exponent)

    def scores(self, counts: torch.Tensor, last_access: torch.Tensor, current_iter: int) -> torch.Tensor:
        # -(iter - last_access + 1) ** decay orders ids exactly as last_access does: rank by it
        # (no power over every slot at each round)
        return last_access.to(torch.float64)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(decay_exponent={self._decay_exponent})"


class DistanceLFU_EvictionPolicy(MCHEvictionPolicy):  # noqa: N801 - torchrec's public name
    """Frequency discounted by age: ``counts / (iter - last_access + 1) ** decay_exponent``."""

    def __init__(self, decay_exponent: float = 1.0, threshold_filtering_func: ThresholdFilter | None = None) -> None:
        super().__init__([_COUNTS, _LAST_ACCESS], threshold_filtering_func)
        self._decay_exponent = float(decay_exponent)

    def scores(self, counts: torch.Tensor, last_access: torch.Tensor, current_iter: int) -> torch.Tensor:
        return counts.to(torch.float64) / _distance(last_access, current_iter, self._decay_exponent)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(decay_exponent={self._decay_exponent})"


class TTL_EvictionPolicy(MCHEvictionPolicy):  # noqa: N801 - named like torchrec's policies
    """Time to live: an id unseen for more than ``ttl`` training iterations loses its row at the
    next round, whether or not another id waits for it (free rows then go to new ids at once).

    Args:
        ttl: iterations an id keeps its row without being looked up (``>= 1``).
    """

    def __init__(self, ttl: int, threshold_filtering_func: ThresholdFilter | None = None) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise ValueError(f"TTL_EvictionPolicy(ttl=...) must be a positive int (iterations), got {ttl!r}")
        super().__init__([_LAST_ACCESS], threshold_filtering_func)
        self._ttl = ttl

    @property
    def ttl(self) -> int:
        return self._ttl

    def scores(self, counts: torch.Tensor, last_access: torch.Tensor, current_iter: int) -> torch.Tensor:
        return last_access.to(torch.float64)

    def expired(self, last_access: torch.Tensor, current_iter: int) -> torch.Tensor | None:
        return (current_iter - last_access) > self._ttl

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ttl={self._ttl})"


@torch.no_grad()
def dynamic_threshold_filter(
    id_counts: torch.Tensor, threshold_skew_multiplier: float = 10.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep ids seen more than ``threshold_skew_multiplier`` times the mean count.

    Returns:
        ``(mask [n], threshold)``.
    """
    counts = id_counts.to(torch.float64)
    threshold = counts.sum() / max(counts.numel(), 1) * threshold_skew_multiplier
    return counts > threshold, threshold


@torch.no_grad()
def average_threshold_filter(id_counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep ids seen more often than the mean count."""
    counts = id_counts.to(torch.float64)
    threshold = counts.mean()
    return counts > threshold, threshold


@torch.no_grad()
def probabilistic_threshold_filter(
    id_counts: torch.Tensor, per_id_probability: float = 0.01
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep each id with probability ``1 - (1 - per_id_probability) ** count`` (a fresh draw per call)."""
    score = 1.0 - torch.pow(torch.full_like(id_counts, 1.0 - per_id_probability, dtype=torch.float64), id_counts)
    threshold = torch.rand(id_counts.shape, dtype=torch.float64, device=id_counts.device)
    return score > threshold, threshold
