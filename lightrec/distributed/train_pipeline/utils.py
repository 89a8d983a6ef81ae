"""torchrec's ``torchrec.distributed.train_pipeline.utils``: the parts a custom pipeline composes.

torchrec's pipelines find the sharded modules a batch feeds by tracing the model, replace each
one's ``forward`` with a :class:`PipelinedForward` that finishes work started earlier, and start
that work from the batch alone. A custom pipeline does the same with these pieces::

    context = TrainPipelineContext(version=1)
    modules, model, originals, _, _ = _rewrite_model(model, context, dist_stream=None, batch=batch)
    _start_data_dist(modules, batch, context)                      # stage 1 (collective)
    for names, awaitable in context.fused_splits_awaitables:       # stage 2 (collective)
        for name, request in zip(names, awaitable.wait()):
            context.input_dist_tensors_requests[name] = request
    for module in modules:
        module.forward.set_context(context)
    losses, output = model(batch)                                  # the forwards pop their requests
    _pipeline_detach_model(modules, originals)                     # the modules' own forwards again

:func:`_rewrite_model` traces with :class:`Tracer` (sharded modules and the plain siblings of
modules holding them are leaves, so only the path from the batch to the sharded modules is
traced) and pipelines a sharded module only when each argument is reached from the batch by
attribute and item accesses (``batch.sparse_features``, ``batch["kjt"]``); a module whose input
the model computes is left alone and runs its whole forward, as in torchrec with
``pipeline_postproc=False``; so is a sharded module the model calls more than once (one input dist
per batch cannot feed two forwards). A model whose traced path branches on the batch's values
(``if batch.dense.sum() > 0``) cannot be traced: nothing is pipelined, with a warning. lightrec does not script modules (``apply_jit`` is accepted and has
no effect) and does not pipeline post-processing modules (it returns none). The context's fields
are described in :mod:`lightrec.distributed.train_pipeline.pipeline_context`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.fx.proxy import TraceError

from lightrec.distributed.comm.awaitable import Awaitable, AwaitableList
from lightrec.distributed.comm.streams import wait_for_current
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.sharded_module import ShardedModule
from lightrec.distributed.sharding.work_ahead import StartedInputDist
from lightrec.distributed.train_pipeline.pipeline_context import In, Out, TrainPipelineContext
from lightrec.distributed.train_pipeline.runtime_forwards import (
    BaseForward,
    PipelinedForward,
    PipelinedForwardError,
    _record,
)
from lightrec.distributed.train_pipeline.tracing import (
    ArgInfo,
    ArgInfoStep,
    ArgInfoStepFactory,
    CallArgs,
    Tracer,
    _get_leaf_module_names,
    call_args_from_batch,
)
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "ArgInfo",
    "ArgInfoStep",
    "ArgInfoStepFactory",
    "BaseForward",
    "CallArgs",
    "In",
    "Out",
    "PipelinedForward",
    "PipelinedForwardError",
    "ShardedModule",
    "StartedSplits",
    "Tracer",
    "TrainPipelineContext",
    "get_h2d_func",
]

logger = logging.getLogger(__name__)

class StartedSplits(Awaitable[StartedInputDist]):
    """Stage 1 of a lightrec collection's input dist: waiting runs stage 2 (the splits are
    waited, the lengths/values exchange starts) and returns the stage-2 request."""

    def __init__(self, started: StartedInputDist) -> None:
        super().__init__()
        self.started = started

    def _wait_impl(self) -> StartedInputDist:
        self.started.progress()
        return self.started


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside ``DistributedModelParallel`` / DDP wrappers (the names contexts use)."""
    # Imported here: model_parallel imports this package's sparse_dist_pipeline at its own import.
    from lightrec.distributed.model_parallel import get_unwrapped_module

    return get_unwrapped_module(model)


def _to_device(batch: In, device: torch.device, non_blocking: bool) -> In:
    """``batch.to(device, non_blocking=...)`` (torchrec's ``Pipelineable`` contract)."""
    to = getattr(batch, "to", None)
    if not callable(to):
        raise TypeError(f"a pipelined batch needs .to(device, non_blocking=...); got a {type(batch).__name__}")
    return to(device, non_blocking=non_blocking)


def get_h2d_func(batch: In, device: torch.device) -> In:
    """The batch's non-blocking copy to ``device`` (torchrec's host-to-device stage function)."""
    return _to_device(batch, device, non_blocking=True)


def _build_args_kwargs(initial_input: object, fwd_args: CallArgs | list[ArgInfo]) -> tuple[list[Any], dict[str, Any]]:
    """``(args, kwargs)`` of a pipelined module for a batch, from its :class:`CallArgs` (or, in
    torchrec's older form, a list of positional :class:`ArgInfo`)."""
    if isinstance(fwd_args, CallArgs):
        return fwd_args.build_args_kwargs(initial_input)
    return CallArgs(list(fwd_args), {}).build_args_kwargs(initial_input)


def _wait_for_batch(batch: object, stream: torch.Stream | None) -> None:
    """Make the current stream wait for ``stream`` (where ``batch`` was made) and record the batch
    as used on the current stream, so its memory is not reused early. No-op without a stream."""
    if stream is None:
        return
    current = torch.cuda.current_stream(stream.device)
    current.wait_stream(stream)
    _record(batch, current)


def _wait_for_events(batch: object, context: TrainPipelineContext, stream: torch.Stream | None) -> None:
    """Wait for (and clear) ``context.events``; record ``batch`` as used on ``stream`` if given."""
    for event in context.events:
        event.wait()
    context.events.clear()
    if stream is not None:
        _record(batch, stream)


def _first_kjt(args: Sequence[object], kwargs: dict[str, object], name: str) -> KeyedJaggedTensor:
    found = [a for a in [*args, *kwargs.values()] if isinstance(a, KeyedJaggedTensor)]
    if len(found) != 1:
        raise TypeError(f"{name}: a lightrec sharded collection takes one KeyedJaggedTensor, got {len(found)}")
    return found[0]


def _fuse_input_dist_splits(context: TrainPipelineContext) -> None:
    """Group the context's stage-1 requests into one ``(names, awaitable)`` entry of
    ``fused_splits_awaitables``; waiting for it runs stage 2 of each, in order."""
    names = [n for n in context.input_dist_splits_requests if not any(n in ns for ns, _ in context.fused_splits_awaitables)]
    if names:
        requests = [context.input_dist_splits_requests[n] for n in names]
        context.fused_splits_awaitables.append((names, AwaitableList(requests)))


def _start_data_dist(pipelined_modules: Sequence[nn.Module], batch: object, context: TrainPipelineContext) -> None:
    """Stage 1 of the input dist of ``batch`` for every pipelined module (collective), recorded in
    ``context`` (module docstring). ``version`` 0 contexts are cleared first, as torchrec does."""
    if context.version == 0:
        context.input_dist_splits_requests.clear()
        context.module_contexts_next_batch.clear()
        context.fused_splits_awaitables.clear()
    for module in pipelined_modules:
        forward = module.forward
        if not isinstance(forward, BaseForward):
            raise TypeError(
                f"_start_data_dist needs modules whose forward _rewrite_model replaced; "
                f"{type(module).__name__}.forward is {type(forward).__name__}"
            )
        args, kwargs = forward.args.build_args_kwargs(batch)
        module_ctx: Any
        if isinstance(module, ShardedCollectionBase):
            # ids written by kernels still queued on the current stream: the side stream waits for them
            wait_for_current(forward.stream, module.device)
            started = module.input_dist(_first_kjt(args, kwargs, forward.name), forward.stream)
            module_ctx, request = started, StartedSplits(started)
        else:
            module_ctx = module.create_context()
            request = module.input_dist(module_ctx, *args, **kwargs)
        target = context.module_contexts_next_batch if context.version == 0 else context.module_contexts
        target[forward.name] = module_ctx
        context.input_dist_splits_requests[forward.name] = request
    _fuse_input_dist_splits(context)


# ---------------------------------------------------------------------------- model rewriting
def _rewrite_model(
    model: nn.Module,
    context: TrainPipelineContext,
    dist_stream: torch.Stream | None,
    batch: object | None = None,
    apply_jit: bool = False,
    pipelined_forward: type[BaseForward[Any]] = PipelinedForward,
    pipeline_postproc: bool = False,
    default_stream: torch.Stream | None = None,
) -> tuple[list[nn.Module], nn.Module, list[Callable[..., Any]], list[nn.Module], list[str]]:
    """Replace the forward of every sharded module the batch feeds directly (module docstring).

    Args:
        model: the model (a ``DistributedModelParallel`` is unwrapped; names are relative to it).
        context: the context the new forwards read first (``set_context`` changes it per batch).
        dist_stream: the side stream of the input dists (None on CPU).
        batch, apply_jit, pipeline_postproc, default_stream: torchrec's arguments; lightrec traces
            without the batch and neither scripts nor pipelines post-processing modules.
        pipelined_forward: the forward class to install.

    Returns:
        ``(pipelined modules, model, their original forwards, [], fqns of sharded modules not pipelined)``:
        a module called more than once is not pipelined, and none is when tracing fails on
        control flow over the batch (a warning says why).
    """
    root = unwrap_model(model)
    sharded = {name: m for name, m in root.named_modules() if isinstance(m, ShardedModule)}
    try:
        graph = Tracer(leaf_modules=_get_leaf_module_names(root)).trace(root)
    except TraceError as error:  # control flow on the batch's values: nothing is rewritten
        logger.warning(
            "no sharded module is pipelined: tracing %s failed (%s); they run their whole forwards. To "
            "pipeline them, move the branch into a child module that holds no sharded module (a leaf)",
            type(root).__name__, error,
        )  # fmt: skip
        return [], model, [], [], sorted(sharded)
    calls = Counter(n.target for n in graph.nodes if n.op == "call_module" and n.target in sharded)
    pipelined: list[nn.Module] = []
    originals: list[Callable[..., Any]] = []
    skipped: list[str] = []
    for node in graph.nodes:
        if node.op != "call_module" or node.target not in sharded or not (node.args or node.kwargs):
            continue
        name, module = str(node.target), sharded[str(node.target)]
        if calls[name] > 1:  # one input dist per batch cannot feed two forwards
            if name not in skipped:
                logger.warning("sharded module %r is not pipelined: the model calls it %d times", name, calls[name])
                skipped.append(name)
            continue
        call_args = call_args_from_batch(node)
        if call_args is None:
            logger.warning("sharded module %r is not pipelined: the model computes its input", name)
            skipped.append(name)
            continue
        originals.append(module.forward)
        module.forward = pipelined_forward(name, call_args, module, context, dist_stream)  # type: ignore[method-assign,assignment]
        pipelined.append(module)
    return pipelined, model, originals, [], skipped


def _pipeline_detach_model(
    pipelined_modules: Sequence[nn.Module],
    original_forwards: Sequence[Callable[..., Any]],
    original_kjt_dist_forwards: Sequence[Callable[..., Any]] | None = None,
) -> None:
    """Give every pipelined module its own forward back (``original_kjt_dist_forwards``: lightrec
    does not replace its input dists' forwards, so there are none to restore)."""
    for module, original in zip(pipelined_modules, original_forwards, strict=True):
        if getattr(original, "__func__", None) is type(module).forward:
            del module.forward  # the class's forward again (no bound-method cycle left behind)
        else:
            module.forward = original


def _override_input_dist_forwards(pipelined_modules: Sequence[nn.Module]) -> list[Callable[..., Any]]:
    """torchrec replaces its KJT all-to-alls' forwards to fuse the splits exchanges of several
    modules; lightrec's input dists are not replaced (their stage 2 is grouped per context by
    :func:`_start_data_dist`), so there is nothing to override: returns ``[]``."""
    return []
