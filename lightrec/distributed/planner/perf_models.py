"""torchrec's ``torchrec.distributed.planner.perf_models`` path: how a partitioned plan is rated.

Nothing is defined here: :class:`NoopPerfModel` (the busiest rank's cost, lightrec's own rating)
lives with the search that rates proposals, :mod:`lightrec.distributed.planner.search`; the
interface, ``PerfModel``, in :mod:`lightrec.distributed.planner.types`.
"""

from lightrec.distributed.planner.search import NoopPerfModel
from lightrec.distributed.planner.types import PerfModel

__all__ = ["NoopPerfModel", "PerfModel"]
