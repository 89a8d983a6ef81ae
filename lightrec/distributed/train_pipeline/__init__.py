"""torchrec's ``torchrec.distributed.train_pipeline``: the pipelined training loop
(:mod:`lightrec.distributed.train_pipeline.train_pipelines`) and the one object every pipelining
caller goes through, ``SparseDistPipeline``
(:mod:`lightrec.distributed.train_pipeline.sparse_dist_pipeline`: sharded collections' stages run
ahead of their forwards, for DMP's look-ahead, the ``SparseDistPrefetch`` callback and the loop)."""

from lightrec.distributed.train_pipeline.train_pipelines import (
    EvalPipelineSparseDist,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineContext,
    TrainPipelineSparseDist,
)

__all__ = [
    "EvalPipelineSparseDist",
    "TrainPipeline",
    "TrainPipelineBase",
    "TrainPipelineContext",
    "TrainPipelineSparseDist",
]
