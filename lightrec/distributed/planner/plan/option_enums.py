"""torchrec's enums that travel with plans and sharders: the pipeline a plan is for, the id
check of a kernel, and which storage rule a sharder's tables follow.

* :class:`PipelineType` -- the training loop the memory of a plan is sized for: a pipelined loop
  keeps the ids of later batches in memory (``calculate_pipeline_io_cost`` counts them).
* :class:`BoundsCheckMode` -- fbgemm's id check of a lookup kernel, with fbgemm's values, so a
  plan or constraint written for torchrec loads. lightrec checks ids in the collections (its
  ``bounds_check`` policies); :attr:`BoundsCheckMode.bounds_check` names the closest policy.
* :class:`StorageUsageType` -- how the planner sizes a sharder's tables
  (``planner.utils.build_sharder_data``): an embedding sharder, a quantized one, or any other.
"""

from __future__ import annotations

from enum import Enum, IntEnum, unique

__all__ = ["BoundsCheckMode", "PipelineType", "StorageUsageType"]


@unique
class PipelineType(Enum):
    """The training loop a plan is sized for."""

    NONE = "none"
    TRAIN_BASE = "train_base"
    TRAIN_SPARSE_DIST = "train_sparse_dist"
    TRAIN_PREFETCH_SPARSE_DIST = "train_prefetch_sparse_dist"


@unique
class BoundsCheckMode(IntEnum):
    """fbgemm's id-check modes (values as fbgemm's ``BoundsCheckMode``)."""

    FATAL = 0
    WARNING = 1
    IGNORE = 2
    NONE = 3
    V2_IGNORE = 4
    V2_WARNING = 5
    V2_FATAL = 6

    @property
    def bounds_check(self) -> str:
        """The lightrec collection policy closest to this mode: ``"error"`` for the fatal modes
        and for ``NONE`` (lightrec always checks ids), ``"clamp"`` for the modes that replace a
        bad id by a valid row (fbgemm uses row 0, ``"clamp"`` the nearest row)."""
        if self in (BoundsCheckMode.FATAL, BoundsCheckMode.V2_FATAL, BoundsCheckMode.NONE):
            return "error"
        return "clamp"


@unique
class StorageUsageType(Enum):
    """Which storage rule the planner applies to a sharder's tables (torchrec's values)."""

    BASE_QUANT = "BaseQuantEmbeddingSharder"
    BASE = "BaseEmbeddingSharder"
    DEFAULT = "ModuleSharder"
