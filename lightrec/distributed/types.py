"""torchrec's ``torchrec.distributed.types`` path: plan types, the sharder interface, the sharding
environment and the awaitables, re-exported.

Nothing is defined here. The plan model -- its types and JSON form, ``ModuleSharder``, the tiered
kernels' parameters, hand-written plans -- lives in :mod:`lightrec.distributed.planner.plan` (every
name of it is re-exported here), ``ShardingEnv`` in :mod:`lightrec.distributed.comm.sharding_env` and
the awaitables in :mod:`lightrec.distributed.comm.awaitable`; lightrec's own files import them from
there.
"""

from lightrec.distributed.comm.awaitable import Awaitable, LazyAwaitable, LazyGetItemMixin, LazyNoWait, NoWait
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs
from lightrec.distributed.comm.sharding_env import ShardingEnv, as_env, resolve_group
from lightrec.distributed.planner import plan
from lightrec.distributed.planner.plan import *  # noqa: F403 - the plan model's names, listed in plan.__all__

__all__ = [
    "Awaitable",
    "LazyAwaitable",
    "LazyGetItemMixin",
    "LazyNoWait",
    "NoWait",
    "QuantizedCommCodecs",
    "ShardingEnv",
    "as_env",
    "resolve_group",
]
__all__ += plan.__all__
