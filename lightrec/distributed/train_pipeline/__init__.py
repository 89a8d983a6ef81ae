"""torchrec's ``torchrec.distributed.train_pipeline``: the pipelined training loop
(:mod:`lightrec.distributed.train_pipeline.train_pipelines`)."""

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
