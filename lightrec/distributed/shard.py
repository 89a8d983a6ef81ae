"""torchrec's ``torchrec.distributed.shard._shard_modules`` call shape, for inference sharding.

The TorchRec tutorial shards a *quantized* model for serving with
``_shard_modules(module=qmodel, device=..., env=ShardingEnv.from_local(world_size, 0))``. That is
inference sharding -- spreading the quantized tables over local serving devices -- which lives in
:mod:`lightrec.quant.sharded_embedding_bag`, one floor down; this module gives it torchrec's path
and arguments (:func:`lightrec.distributed.quant_embeddingbag.shard_quantized_modules`: a ``plan``
places tables by its table-wise ranks, otherwise tables are spread by size). Model-parallel *training* sharding is
``DistributedModelParallel`` (``lightrec.distributed``).
"""

from lightrec.distributed.quant_embeddingbag import shard_quantized_modules
from lightrec.quant.sharded_embedding_bag import shard_modules

__all__ = ["_shard_modules", "shard_modules"]

_shard_modules = shard_quantized_modules
