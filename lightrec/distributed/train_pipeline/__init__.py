"""torchrec's ``torchrec.distributed.train_pipeline``: the pipelined training loop
(:mod:`lightrec.distributed.train_pipeline.train_pipelines`) and the one object every pipelining
caller goes through, ``SparseDistPipeline``
(:mod:`lightrec.distributed.train_pipeline.sparse_dist_pipeline`: sharded collections' stages run
ahead of their forwards, for DMP's look-ahead, the ``SparseDistPrefetch`` callback and the loop)."""

from lightrec.distributed.train_pipeline import train_pipelines as _home
from lightrec.distributed.train_pipeline.train_pipelines import *  # noqa: F403 - the loop's __all__

__all__ = list(_home.__all__)
