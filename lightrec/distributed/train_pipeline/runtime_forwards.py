"""torchrec's ``torchrec.distributed.train_pipeline.runtime_forwards``: the forwards a pipeline
installs on the sharded modules it pipelines (``_rewrite_model`` in
:mod:`lightrec.distributed.train_pipeline.utils`).

A :class:`PipelinedForward` replaces a sharded module's ``forward`` on the instance. It holds the
context of the batch whose forward comes next (``set_context``, once per batch) and, when called,
pops the module's stage-2 request and module context from it and runs the rest of the forward;
the call's own arguments are not read again (the input dist was started from the batch). For a
lightrec sharded collection the request is its ``StartedInputDist``; for any other
``ShardedModule`` it is what ``input_dist(ctx, ...)`` returned, waited once more.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import torch
from torch import nn

from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.sharded_module import ShardedModule
from lightrec.distributed.train_pipeline.pipeline_context import TrainPipelineContext
from lightrec.distributed.train_pipeline.tracing import CallArgs

__all__ = ["BaseForward", "PipelinedForward", "PipelinedForwardError"]

TForwardContext = TypeVar("TForwardContext", bound=TrainPipelineContext)


class PipelinedForwardError(RuntimeError):
    """A pipelined forward ran without the input dist its context should hold."""


def _record(batch: object, stream: torch.Stream) -> None:
    record = getattr(batch, "record_stream", None)  # Multistreamable is optional for CPU batches
    if callable(record):
        record(stream)


class BaseForward(Generic[TForwardContext]):
    """What replaces a pipelined sharded module's ``forward``.

    Args:
        name: the module's fqn (the key of its entries in the context).
        args: how to get the module's arguments from a batch.
        module: the sharded module.
        context: the context of the batch the next forward belongs to (:meth:`set_context`).
        stream: the side stream the input dist runs on (None: the current stream, e.g. CPU).
    """

    def __init__(self, name: str, args: CallArgs, module: nn.Module, context: TForwardContext,
                 stream: torch.Stream | None = None) -> None:  # fmt: skip
        self._name, self._args, self._module, self._context, self._stream = name, args, module, context, stream

    @property
    def name(self) -> str:
        return self._name

    @property
    def args(self) -> CallArgs:
        return self._args

    @property
    def stream(self) -> torch.Stream | None:
        return self._stream

    def set_context(self, context: TForwardContext) -> None:
        self._context = context

    def get_context(self) -> TForwardContext:
        return self._context


class PipelinedForward(BaseForward[TrainPipelineContext]):
    """Pops the module's stage-2 request and module context from the context and runs the rest of
    the forward (``compute_and_output_dist``); the call's own arguments are not read again."""

    def __call__(self, *input: Any, **kwargs: Any) -> Any:
        ctx = self._context
        request = ctx.input_dist_tensors_requests.pop(self._name, None)
        splits = ctx.input_dist_splits_requests.pop(self._name, None)  # its stage 1: used up either way
        if request is None and splits is not None:
            request = splits.wait()  # stage 2 was not run yet: run it now
        contexts = ctx.module_contexts if self._name in ctx.module_contexts else ctx.module_contexts_next_batch
        if request is None or self._name not in contexts:
            raise PipelinedForwardError(
                f"the pipelined forward of {self._name!r} found no input dist in its context (index "
                f"{ctx.index}); run _start_data_dist(...) for this batch and set_context(context) on the "
                f"module's forward before the model runs, or restore the module's own forward with "
                f"_pipeline_detach_model(...)"
            )
        module_ctx = contexts.pop(self._name)
        if self._stream is not None:
            current = torch.cuda.current_stream(self._stream.device)
            current.wait_stream(self._stream)
        if isinstance(self._module, ShardedCollectionBase):
            return self._module.compute_and_output_dist(request)
        if not isinstance(self._module, ShardedModule):
            raise TypeError(f"{self._name}: a pipelined module must be a ShardedModule, got {type(self._module).__name__}")
        data = request.wait()
        if self._stream is not None:
            _record(data, current)
            _record(module_ctx, current)
        return self._module.compute_and_output_dist(module_ctx, data)
