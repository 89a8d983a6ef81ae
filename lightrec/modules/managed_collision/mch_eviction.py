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
``average_threshold_filter`` and ``probabilistic_threshold_filter`` are ready-made ones. While the
module calls a filter, :func:`threshold_filter_context` gives the ids behind the counts and the
iteration (torchrec's filters see counts only), so that a random filter can draw per id, the same
on every shard -- ``probabilistic_threshold_filter`` does.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from contextvars import ContextVar
from typing import NamedTuple

import torch

from lightrec.modules.managed_collision.ops import hashed_unit

__all__ = [
    "DistanceLFU_EvictionPolicy",
    "LFU_EvictionPolicy",
    "LRU_EvictionPolicy",
    "MCHEvictionPolicy",
    "MCHEvictionPolicyMetadataInfo",
    "TTL_EvictionPolicy",
    "ThresholdFilterContext",
    "average_threshold_filter",
    "dynamic_threshold_filter",
    "probabilistic_threshold_filter",
    "threshold_filter_context",
]

ThresholdFilter = Callable[[torch.Tensor], tuple[torch.Tensor, float | torch.Tensor]]


class ThresholdFilterContext(NamedTuple):
    """What a threshold filter's counts belong to, while the module calls it.

    Attributes:
        ids: ``[n]`` int64 ids of the waiting ids, aligned with the counts the filter gets.
        iteration: the training iteration of the eviction round.
    """

    ids: torch.Tensor
    iteration: int


# Set by MCHEvictionPolicy.filter_candidates around the user's filter: torchrec's filter signature
# takes counts only, and users wrap filters in lambdas and partials, so the ids travel beside the call.
_FILTER_CONTEXT: ContextVar[ThresholdFilterContext | None] = ContextVar("lightrec_mch_filter_context", default=None)


def threshold_filter_context() -> ThresholdFilterContext | None:
    """The ids and iteration behind the counts of the filter call in progress (None outside one)."""
    return _FILTER_CONTEXT.get()


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

    def filter_candidates(
        self, counts: torch.Tensor, ids: torch.Tensor | None = None, current_iter: int = 0
    ) -> torch.Tensor | None:
        """Keep-mask of waiting ids with these counts (None: keep all).

        Args:
            counts: ``[n]`` lookups of each waiting id.
            ids: ``[n]`` the waiting ids; the filter reads them (and ``current_iter``) from
                :func:`threshold_filter_context` during the call.
            current_iter: the iteration of the round.
        """
        if self._threshold_filtering_func is None:
            return None
        token = _FILTER_CONTEXT.set(ThresholdFilterContext(ids, current_iter) if ids is not None else None)
        try:
            mask, _ = self._threshold_filtering_func(counts)
        finally:
            _FILTER_CONTEXT.reset(token)
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
    id_counts: torch.Tensor,
    per_id_probability: float = 0.01,
    *,
    ids: torch.Tensor | None = None,
    iteration: int | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep each id with probability ``1 - (1 - per_id_probability) ** count`` (torchrec's filter).

    The draw of an id is a hash of the id, the iteration and ``seed``
    (:func:`lightrec.modules.managed_collision.ops.hashed_unit`), not ``torch.rand``: every shard,
    and the unsharded module, decides the same for an id whatever torch's generator holds and
    whichever other ids it filters, so the documented promise that row-wise sharded decisions
    equal the unsharded module's holds with this filter too. Each round draws afresh (the
    iteration changes), and ids draw independently, so the keep probability above is unchanged.

    Called by the module (also through a ``lambda`` or ``functools.partial``), the ids and the
    iteration come from :func:`threshold_filter_context`. Called alone with counts only, there is
    no id to hash: it draws from ``torch.rand`` as torchrec does.

    Args:
        id_counts: ``[n]`` lookups of each id.
        per_id_probability: chance that one lookup admits the id, in ``[0, 1]``.
        ids: ``[n]`` the ids (default: the module's, during its call).
        iteration: the round's iteration (default: the module's, during its call; else 0).
        seed: varies every draw (two seeds: two independent filters).

    Returns:
        ``(keep mask [n], threshold [n])``: an id is kept where its score exceeds its draw.

    Raises:
        ValueError: ``per_id_probability`` outside ``[0, 1]``, or ``ids`` not aligned with the counts.
    """
    if not 0.0 <= per_id_probability <= 1.0:
        raise ValueError(
            f"probabilistic_threshold_filter: per_id_probability={per_id_probability} must be a probability "
            "in [0, 1] (the chance that one lookup admits an id)"
        )
    context = _FILTER_CONTEXT.get()
    if ids is None and context is not None:
        ids = context.ids
        iteration = context.iteration if iteration is None else iteration
    score = 1.0 - torch.pow(torch.full_like(id_counts, 1.0 - per_id_probability, dtype=torch.float64), id_counts)
    if ids is None:
        threshold = torch.rand(id_counts.shape, dtype=torch.float64, device=id_counts.device)
        return score > threshold, threshold
    if ids.shape != id_counts.shape:
        raise ValueError(
            f"probabilistic_threshold_filter: ids of shape {tuple(ids.shape)} (given, or the module's waiting "
            f"ids during its call) must match id_counts of shape {tuple(id_counts.shape)}; pass the counts the "
            "module gave the filter, or ids= aligned with the counts"
        )
    threshold = hashed_unit(ids, 0 if iteration is None else iteration, seed)
    return score > threshold, threshold
