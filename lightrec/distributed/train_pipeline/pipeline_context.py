"""torchrec's ``torchrec.distributed.train_pipeline.pipeline_context``: what a training pipeline
carries for one batch between its stages.

A pipelined step works on several batches at once (copy batch ``i + 2``, start the input dist
of batch ``i + 1``, train batch ``i``), so each batch in flight has a :class:`TrainPipelineContext`
beside it. The stages write into it and later stages (and the sharded modules' pipelined
forwards) read from it::

    copy to the device          events: the copy stream's event (CUDA) the main stream waits for
    input dist, stage 1         input_dist_splits_requests[fqn]: the splits exchange in flight
                                module_contexts[fqn]: what the module's later stages need
                                fused_splits_awaitables: the stage-1 requests grouped for one wait
    input dist, stage 2         input_dist_tensors_requests[fqn]: the lengths/values exchange in flight
    forward                     a pipelined forward pops its module's entries and runs
                                ``compute_and_output_dist``

Keys are the sharded modules' fully qualified names in the model (inside a
``DistributedModelParallel``, the names in ``dmp.module``). For a lightrec sharded collection the
stage-1 request is its started input dist (``StartedInputDist``) behind an ``Awaitable`` whose
``wait()`` runs stage 2 and returns the stage-2 request; for any other ``ShardedModule`` (an
extension written the torchrec way) they are what its ``input_dist(ctx, ...)`` returned.

The field names and defaults are torchrec's, so a custom pipeline written against torchrec's
context (or a subclass adding fields, passed as ``context_type``) works unchanged.
``In`` and ``Out`` are the pipelines' batch and output type variables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from lightrec.streamable import Multistreamable, Pipelineable

__all__ = [
    "EmbeddingTrainPipelineContext",
    "In",
    "Out",
    "PrefetchTrainPipelineContext",
    "TrainPipelineContext",
]

In = TypeVar("In", bound=Pipelineable)
Out = TypeVar("Out")


@dataclass
class TrainPipelineContext:
    """The state of one batch in flight in a training pipeline (see the module docstring).

    Attributes:
        input_dist_splits_requests: ``{module fqn: stage-1 request}``, the splits exchange started.
        input_dist_tensors_requests: ``{module fqn: stage-2 request}``, the lengths/values exchange
            started; a pipelined forward pops its entry.
        module_contexts: ``{module fqn: module context}`` of this batch's input dists.
        module_contexts_next_batch: the same for the next batch (``version`` 0 pipelines only).
        fused_splits_awaitables: ``[(module fqns, awaitable)]``; waiting for one yields the stage-2
            requests of its modules, in order.
        events: device events the batch waits for before it is used (the copy stream's).
        postproc_fwd_results: results of post-processing modules run ahead, by fqn.
        index: the batch's position in the stream of batches the pipeline read.
        version: 1: one context per batch carries everything; 0: torchrec's older layout that
            keeps the next batch's module contexts in ``module_contexts_next_batch``.
    """

    input_dist_splits_requests: dict[str, Any] = field(default_factory=dict)
    input_dist_tensors_requests: dict[str, Any] = field(default_factory=dict)
    module_contexts: dict[str, Multistreamable | Any] = field(default_factory=dict)
    module_contexts_next_batch: dict[str, Multistreamable | Any] = field(default_factory=dict)
    fused_splits_awaitables: list[tuple[list[str], Any]] = field(default_factory=list)
    events: list[torch.Event] = field(default_factory=list)
    postproc_fwd_results: dict[str, Any] = field(default_factory=dict)
    index: int | None = None
    version: int = 0

    def has_input_dists(self) -> bool:
        """Whether an input dist started for this batch is still waiting for its forward."""
        return bool(self.input_dist_splits_requests or self.input_dist_tensors_requests)

    def clear_input_dists(self) -> None:
        """Forget the input dists recorded for this batch (after they were completed or dropped)."""
        self.input_dist_splits_requests.clear()
        self.input_dist_tensors_requests.clear()
        self.module_contexts.clear()
        self.module_contexts_next_batch.clear()
        self.fused_splits_awaitables.clear()


@dataclass
class PrefetchTrainPipelineContext(TrainPipelineContext):
    """A context that also carries the inputs and module contexts after a prefetch stage, by fqn."""

    module_input_post_prefetch: dict[str, Any] = field(default_factory=dict)
    module_contexts_post_prefetch: dict[str, Any] = field(default_factory=dict)
    module_input_post_prefetch_next_batch: dict[str, Any] = field(default_factory=dict)
    module_contexts_post_prefetch_next_batch: dict[str, Any] = field(default_factory=dict)


@dataclass
class EmbeddingTrainPipelineContext(TrainPipelineContext):
    """A context that also carries embedding lookups started ahead and the tensors they returned."""

    embedding_a2a_requests: dict[str, Any] = field(default_factory=dict)
    embedding_tensors: list[list[torch.Tensor]] = field(default_factory=list)
    embedding_features: list[list[str | list[str]]] = field(default_factory=list)
    detached_embedding_tensors: list[list[torch.Tensor]] = field(default_factory=list)
