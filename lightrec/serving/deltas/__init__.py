"""Apply the versions of a publish folder to a loaded serving artifact, live.

``find_targets`` locates what a version changes in a ``Predictor``'s module (``targets.py``);
``PendingUpdate`` prepares the writes and applies them in place, all or nothing (``apply.py``);
``DeltaFollower`` polls a folder and picks the next update (``follower.py``); ``open_updater`` is
that follower behind ``lightrec serve``'s updater seam (``updater.py``). The format and its
writer/reader are :mod:`lightrec.distributed.deltas`; ``docs/deltas.md`` describes both.
"""

from lightrec.distributed.deltas.errors import DeltaApplyError, DeltaError
from lightrec.serving.deltas.apply import PendingUpdate, UpdateListener, artifact_rows
from lightrec.serving.deltas.follower import GAPS, DeltaFollower
from lightrec.serving.deltas.targets import ArtifactTargets, RemapperTarget, TableTarget, find_targets
from lightrec.serving.deltas.updater import (
    DeltaModelUpdate,
    DeltaRefused,
    DeltaUpdater,
    ServedLike,
    open_updater,
)

__all__ = [
    "GAPS",
    "ArtifactTargets",
    "DeltaApplyError",
    "DeltaError",
    "DeltaFollower",
    "DeltaModelUpdate",
    "DeltaRefused",
    "DeltaUpdater",
    "PendingUpdate",
    "RemapperTarget",
    "ServedLike",
    "TableTarget",
    "UpdateListener",
    "artifact_rows",
    "find_targets",
    "open_updater",
]
