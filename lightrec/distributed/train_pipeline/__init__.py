"""torchrec's ``torchrec.distributed.train_pipeline``: the pipelined training loop
(:mod:`lightrec.distributed.train_pipeline.train_pipelines`), the per-batch state it carries
(:mod:`lightrec.distributed.train_pipeline.pipeline_context`), the pieces a custom pipeline composes
(:mod:`lightrec.distributed.train_pipeline.utils`, tracing in
:mod:`lightrec.distributed.train_pipeline.tracing`) and the one object every pipelining caller goes
through, ``SparseDistPipeline`` (:mod:`lightrec.distributed.train_pipeline.sparse_dist_pipeline`:
sharded collections' stages run ahead of their forwards, for DMP's look-ahead, the
``SparseDistPrefetch`` callback and the loop)."""

from lightrec.distributed.train_pipeline import train_pipelines as _home
from lightrec.distributed.train_pipeline.pipeline_context import In, Out
from lightrec.distributed.train_pipeline.tracing import ArgInfo, Tracer
from lightrec.distributed.train_pipeline.train_pipelines import *  # noqa: F403 - the loop's __all__
from lightrec.distributed.train_pipeline.utils import (
    _override_input_dist_forwards,
    _rewrite_model,
    _start_data_dist,
    _to_device,
    _wait_for_batch,
)

__all__ = [*_home.__all__, "ArgInfo", "In", "Out", "Tracer", "_override_input_dist_forwards", "_rewrite_model",
           "_start_data_dist", "_to_device", "_wait_for_batch"]  # fmt: skip
