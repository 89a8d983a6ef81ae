"""Collectives for model-parallel embeddings, returned as awaitables (see docs/collectives.md).

Beside them, what every collective path shares: ``sharding_env.py`` (``ShardingEnv``, who this
process is in the sharded world; ``resolve_group``, ``as_env``) and ``streams.py`` (work issued on
a side CUDA stream and consumed on another: pipelined input dists) and ``topology.py`` (ranks per
host, local and host rank, the intra- and cross-host groups: torchrec's ``get_local_size`` ...).
"""

from lightrec.distributed.comm.awaitable import (
    Awaitable,
    AwaitableList,
    LazyAwaitable,
    LazyNoWait,
    NoWait,
    wait_all,
)
from lightrec.distributed.comm.bucketize import (
    IdOutOfRangeError,
    RowWiseBucketized,
    bucketize_kjt_by_rank,
    bucketize_kjt_row_wise,
    row_wise_block_bounds,
    row_wise_block_size,
)
from lightrec.distributed.comm.kjt_all_to_all import (
    KJTAllToAll,
    KJTAllToAllError,
    KJTAllToAllSplitsAwaitable,
    KJTAllToAllTensorsAwaitable,
)
from lightrec.distributed.comm.pooled_all_to_all import (
    PooledEmbeddingsAllToAll,
    PooledEmbeddingsAllToAllError,
    PooledEmbeddingsAwaitable,
)
from lightrec.distributed.comm.reduce_scatter import (
    AllGatherAwaitable,
    PooledEmbeddingsAllGather,
    PooledEmbeddingsReduceScatter,
    ReduceScatterAwaitable,
    exchange_batch_sizes,
)
from lightrec.distributed.comm.sequence_all_to_all import (
    SequenceEmbeddingsAllToAll,
    SequenceEmbeddingsAwaitable,
)
from lightrec.distributed.comm.shm_segments import ShmSpaceError
from lightrec.distributed.comm.shm_transport import ShmMismatchError, ShmPeerError
from lightrec.distributed.comm.topology import (
    get_group_rank,
    get_local_rank,
    get_local_size,
    get_num_groups,
    intra_and_cross_node_pg,
)

__all__ = [
    "AllGatherAwaitable",
    "Awaitable",
    "AwaitableList",
    "IdOutOfRangeError",
    "KJTAllToAll",
    "KJTAllToAllError",
    "KJTAllToAllSplitsAwaitable",
    "KJTAllToAllTensorsAwaitable",
    "LazyAwaitable",
    "LazyNoWait",
    "NoWait",
    "PooledEmbeddingsAllGather",
    "PooledEmbeddingsAllToAll",
    "PooledEmbeddingsAllToAllError",
    "PooledEmbeddingsAwaitable",
    "PooledEmbeddingsReduceScatter",
    "ReduceScatterAwaitable",
    "RowWiseBucketized",
    "SequenceEmbeddingsAllToAll",
    "SequenceEmbeddingsAwaitable",
    "ShmMismatchError",
    "ShmPeerError",
    "ShmSpaceError",
    "bucketize_kjt_by_rank",
    "bucketize_kjt_row_wise",
    "exchange_batch_sizes",
    "get_group_rank",
    "get_local_rank",
    "get_local_size",
    "get_num_groups",
    "intra_and_cross_node_pg",
    "row_wise_block_bounds",
    "row_wise_block_size",
    "wait_all",
]
