"""The delta tracker's types, under torchrec 1.8's names (``torchrec.distributed.model_tracker.types``).

==========================  ===========================================================================
name                        what it is
==========================  ===========================================================================
``TrackingMode``            what is kept besides the ids: nothing, the looked-up rows, or optimizer state
``UpdateMode``              which value of a row seen several times is kept (first / last / none);
                            ``EmbdUpdateMode`` is its pre-1.8 name
``IndexedLookup``           the ids (and states) one batch looked up in one table, with the batch index
``UniqueRows``              what a read returns per table: unique ids (and their states); ``DeltaRows``
                            is its pre-1.8 name
``DeltaTrackerConfig``      how ``DistributedModelParallel.init_torchrec_delta_tracker`` builds a
                            tracker; ``ModelTrackerConfig`` is its pre-1.8 name
``Trackers``                the kinds of tracker a ``DistributedModelParallel`` keeps (lightrec has the
                            delta tracker; torchrec's raw-id tracker is not implemented)
==========================  ===========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch

__all__ = ["DeltaRows", "DeltaTrackerConfig", "EmbdUpdateMode", "IndexedLookup", "ModelTrackerConfig", "Trackers",
           "TrackingMode", "UniqueRows", "UnsupportedTrackingError", "UpdateMode"]  # fmt: skip


class UnsupportedTrackingError(ValueError):
    """A tracking mode that a table of the model cannot give (its collection or optimizer lacks the state)."""


@dataclass
class IndexedLookup:
    """The rows one batch looked up in one table.

    Attributes:
        batch_idx: the tracker's batch index when the lookup ran.
        ids: int64 ``[n]`` global row indices of the table (this rank's rows).
        states: ``[n, ...]`` the mode's state of each id, or None (``TrackingMode.ID_ONLY``).
        compact: whether this entry is the result of a compaction (unique ids).
    """

    batch_idx: int
    ids: torch.Tensor
    states: torch.Tensor | None
    compact: bool = False


@dataclass
class UniqueRows:
    """The rows of one table a read returns.

    Attributes:
        ids: int64 ``[n]`` unique global row indices (ascending unless a read asked otherwise).
        states: ``[n, ...]`` their states (see :class:`TrackingMode`), or None for ``ID_ONLY``.
    """

    ids: torch.Tensor
    states: torch.Tensor | None


DeltaRows = UniqueRows
"""torchrec's name of :class:`UniqueRows` before 1.8."""


class TrackingMode(Enum):
    """What the tracker keeps besides the ids of the rows each batch looked up.

    Members:
        ID_ONLY: the ids only (a tensor append per lookup; the cheapest).
        EMBEDDING: also the rows as the batch looked them up, the first time in a read window
            (``UpdateMode.FIRST``: the value before the window's updates). Sequence collections
            (``EmbeddingCollection``) only, as in torchrec: a pooled lookup returns bags, not rows.
        MOMENTUM_LAST: also the L2 norm of each row's first moment (``momentum1``) as it is when
            read (the latest). Fused tables whose optimizer keeps a ``[rows, dim]`` first moment:
            ADAM, LAMB, LARS_SGD, PARTIAL_ROWWISE_ADAM, PARTIAL_ROWWISE_LAMB.
        MOMENTUM_DIFF: also how much each row's per-row accumulator grew over the read window
            (the value when read minus the value at its first lookup in the window). Fused tables
            whose optimizer keeps one value per row: ROWWISE_ADAGRAD (``momentum1``),
            PARTIAL_ROWWISE_ADAM / PARTIAL_ROWWISE_LAMB (``momentum2``).
        ROWWISE_ADAGRAD: the same as ``MOMENTUM_DIFF`` (torchrec keeps both names).

    Every other combination is refused when the tracker is built (``UnsupportedTrackingError``
    naming the table and what would work).
    """

    ID_ONLY = "id_only"
    EMBEDDING = "embedding"
    MOMENTUM_LAST = "momentum_last"
    MOMENTUM_DIFF = "momentum_diff"
    ROWWISE_ADAGRAD = "rowwise_adagrad"


class UpdateMode(Enum):
    """Which state of an id seen in several batches of a read window a read returns.

    Members:
        NONE: no state (``ID_ONLY``).
        FIRST: the state of its first lookup in the window.
        LAST: the state of its last lookup.
    """

    NONE = "none"
    FIRST = "first"
    LAST = "last"


EmbdUpdateMode = UpdateMode
"""torchrec's name of :class:`UpdateMode` before 1.8."""


class Trackers(Enum):
    """The trackers a ``DistributedModelParallel`` keeps in ``model_trackers`` (by member name)."""

    DELTA_TRACKER = "delta_tracker"
    RAW_ID_TRACKER = "raw_id_tracker"


@dataclass
class DeltaTrackerConfig:
    """How ``DistributedModelParallel.init_torchrec_delta_tracker`` builds its tracker.

    Attributes:
        tracking_mode: what is kept besides the ids (:class:`TrackingMode`).
        consumers: names of the readers; each read (``get_unique(consumer)``) returns what changed
            since that consumer's previous read. None: one consumer, ``"default"``.
        delete_on_read: drop what every consumer has read (else it stays until ``clear``).
        auto_compact: merge the recorded lookups into one unique set per table at every step
            (bounded memory between reads, a unique per step); False: only when read.
        fqns_to_skip: module names (one component of a module path, e.g. ``"user_tower"``) whose
            collections are not tracked.
    """

    tracking_mode: TrackingMode = TrackingMode.ID_ONLY
    consumers: list[str] | None = None
    delete_on_read: bool = True
    auto_compact: bool = False
    fqns_to_skip: list[str] = field(default_factory=list)


ModelTrackerConfig = DeltaTrackerConfig
"""torchrec's name of :class:`DeltaTrackerConfig` before 1.8."""
