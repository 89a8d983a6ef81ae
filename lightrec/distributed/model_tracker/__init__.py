"""Which rows of a sharded model changed since a consumer last asked (torchrec's ``model_tracker``).

torchrec 1.8's names and call shapes::

    from lightrec.distributed.model_tracker import DeltaTrackerConfig, TrackingMode

    tracker = dmp.init_torchrec_delta_tracker(DeltaTrackerConfig(consumers=["publish"]))
    ...train...
    tracker.get_unique_ids("publish")     # {"sparse_arch.ebc.embedding_bags.t0": tensor([3, 17, ...]), ...}
    tracker.get_unique("publish")         # {fqn: UniqueRows(ids, states)}

Files, each on top of the one before: ``types.py`` (modes, configs, ``UniqueRows``),
``delta_store.py`` (per-table ids by batch: append, compact, read, delete), ``tables.py`` (the
tables of a sharded model and where this rank holds them), ``row_states.py`` (the optimizer-state
modes, read through the kernels), ``model_delta_tracker.py`` (:class:`ModelDeltaTrackerTrec`,
which the lookups call). Publishing the changed rows: ``lightrec.distributed.deltas.publish_changes``.
"""

from lightrec.distributed.model_tracker.delta_store import DeltaStore, DeltaStoreTrec
from lightrec.distributed.model_tracker.model_delta_tracker import (
    SUPPORTED_MODULES,
    UPDATE_MODE_MAP,
    ModelDeltaTracker,
    ModelDeltaTrackerTrec,
)
from lightrec.distributed.model_tracker.types import (
    DeltaRows,
    DeltaTrackerConfig,
    EmbdUpdateMode,
    IndexedLookup,
    ModelTrackerConfig,
    Trackers,
    TrackingMode,
    UniqueRows,
    UnsupportedTrackingError,
    UpdateMode,
)

__all__ = [
    "SUPPORTED_MODULES",
    "UPDATE_MODE_MAP",
    "DeltaRows",
    "DeltaStore",
    "DeltaStoreTrec",
    "DeltaTrackerConfig",
    "EmbdUpdateMode",
    "IndexedLookup",
    "ModelDeltaTracker",
    "ModelDeltaTrackerTrec",
    "ModelTrackerConfig",
    "Trackers",
    "TrackingMode",
    "UniqueRows",
    "UnsupportedTrackingError",
    "UpdateMode",
]
