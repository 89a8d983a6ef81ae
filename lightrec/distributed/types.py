"""torchrec's ``torchrec.distributed.types`` path: plan types, the sharder interface, the sharding
environment, the awaitables and the sharded-module interface, re-exported.

Nothing is defined here. The plan model -- its types and JSON form, ``ModuleSharder``, the tiered
kernels' parameters, hand-written plans, torchrec's ``PipelineType`` / ``BoundsCheckMode`` /
``StorageUsageType`` -- lives in :mod:`lightrec.distributed.planner.plan` (every name of it is
re-exported here), ``ShardingEnv`` in :mod:`lightrec.distributed.comm.sharding_env`, the
awaitables in :mod:`lightrec.distributed.comm.awaitable`, ``ShardedModule`` in
:mod:`lightrec.distributed.sharding.sharded_module` and ``CommOp`` in
:mod:`lightrec.distributed.fbgemm_qcomm_codec`; lightrec's own files import them from there.

``ShardedTensor`` is lightrec's :class:`~lightrec.distributed.sharding.state_dict.ShardedTableState`
(what a model-parallel table is in a state dict): torchrec code that tests
``isinstance(value, ShardedTensor)`` and then reads ``value.local_shards()`` / ``value.metadata()``
works unchanged; lightrec does not build torch's ``ShardedTensor``. What those two return --
``Shard`` (``tensor``, ``metadata``), ``ShardedTensorMetadata`` (``shards_metadata``, ``size``,
``tensor_properties``) and ``TensorProperties`` -- are importable from here too, as in torchrec.
"""

from lightrec.distributed.comm.awaitable import (
    Awaitable,
    GetItemLazyAwaitable,
    LazyAwaitable,
    LazyGetItemMixin,
    LazyNoWait,
    NoWait,
)
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs
from lightrec.distributed.comm.sharding_env import ShardingEnv, as_env, resolve_group
from lightrec.distributed.fbgemm_qcomm_codec import CommOp
from lightrec.distributed.planner import plan
from lightrec.distributed.planner.plan import *  # noqa: F403 - the plan model's names, listed in plan.__all__
from lightrec.distributed.sharding.sharded_module import ShardedModule
from lightrec.distributed.sharding.state_dict import (
    Shard,
    ShardedTableState,
    ShardedTensorMetadata,
    TensorProperties,
)
from lightrec.distributed.sharding.state_dict import ShardedTableState as ShardedTensor

__all__ = [
    "Awaitable",
    "CommOp",
    "GetItemLazyAwaitable",
    "LazyAwaitable",
    "LazyGetItemMixin",
    "LazyNoWait",
    "NoWait",
    "QuantizedCommCodecs",
    "Shard",
    "ShardedModule",
    "ShardedTableState",
    "ShardedTensor",
    "ShardedTensorMetadata",
    "ShardingEnv",
    "TensorProperties",
    "as_env",
    "resolve_group",
]
__all__ += plan.__all__
