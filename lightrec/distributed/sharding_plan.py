"""torchrec's ``torchrec.distributed.sharding_plan`` path: hand-written plans and the default
sharders, re-exported.

Nothing is defined here: the generators live in :mod:`lightrec.distributed.planner.plan`
(``builders.py``) and the default sharders in :mod:`lightrec.distributed.sharders`.
"""

from lightrec.distributed.planner.plan import builders
from lightrec.distributed.planner.plan.builders import *  # noqa: F403 - the generators, listed in builders.__all__
from lightrec.distributed.sharders import get_default_sharders

__all__ = ["get_default_sharders"]
__all__ += builders.__all__
