"""``ShardedModule``: torchrec's interface of a module sharded over ranks, for extensions.

A sharded module's forward is three stages (the seam torchrec's pipelines drive)::

    ctx = module.create_context()                         # per-forward scratch state
    received = module.input_dist(ctx, features).wait().wait()   # inputs sent to the owning ranks
    out = module.compute_and_output_dist(ctx, received)   # local compute, results sent back

An extension writes its own sharded module by deriving from :class:`ShardedModule` and
implementing ``create_context``, ``input_dist``, ``compute`` and ``output_dist``; its sharder's
``shard(...)`` returns it, and ``DistributedModelParallel`` puts it in the model (its parameters are
left out of the data-parallel wrapper, as a sharded module's are). lightrec's own sharded modules
(the collections, the managed-collision collection, the inference-sharded quantized collection)
run their stages their own way (``ShardedCollectionBase``: ``input_dist(kjt, stream)`` ...) and are
registered as virtual subclasses: ``isinstance(m, ShardedModule)`` is true of every sharded module,
which is what torchrec code tests (e.g. a tracer keeping sharded modules as leaves).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from torch import nn

from lightrec.distributed.comm.awaitable import Awaitable, LazyAwaitable
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs
from lightrec.distributed.mc_modules import ShardedManagedCollisionCollection
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.quant.sharded_embedding_bag import ShardedQuantEmbeddingBagCollection
from lightrec.quant.sharded_managed_collision import ShardedQuantManagedCollisionEmbeddingCollection

__all__ = ["ShardedModule"]

CompIn = TypeVar("CompIn")
DistOut = TypeVar("DistOut")
Out = TypeVar("Out")
ShrdCtx = TypeVar("ShrdCtx")


class ShardedModule(nn.Module, abc.ABC, Generic[CompIn, DistOut, Out, ShrdCtx]):
    """A module sharded over ranks (see the module docstring).

    Args:
        qcomm_codecs_registry: ``{comm op: QuantizedCommCodecs}`` of its quantized collectives.
    """

    def __init__(self, qcomm_codecs_registry: Mapping[str, QuantizedCommCodecs] | None = None) -> None:
        super().__init__()
        self._qcomm_codecs_registry = dict(qcomm_codecs_registry) if qcomm_codecs_registry else None

    @property
    def qcomm_codecs_registry(self) -> dict[str, QuantizedCommCodecs] | None:
        return self._qcomm_codecs_registry

    @abc.abstractmethod
    def create_context(self) -> ShrdCtx:
        """Fresh per-forward state the stages share."""

    @abc.abstractmethod
    def input_dist(self, ctx: ShrdCtx, *input: Any, **kwargs: Any) -> Awaitable[Awaitable[CompIn]]:
        """Start sending the inputs to the ranks that own them (two-stage awaitable)."""

    @abc.abstractmethod
    def compute(self, ctx: ShrdCtx, dist_input: CompIn) -> DistOut:
        """This rank's part of the work on the inputs it received."""

    @abc.abstractmethod
    def output_dist(self, ctx: ShrdCtx, output: DistOut) -> LazyAwaitable[Out]:
        """Start sending the results back to the ranks whose inputs they answer."""

    def compute_and_output_dist(self, ctx: ShrdCtx, input: CompIn) -> LazyAwaitable[Out]:
        """:meth:`compute`, then :meth:`output_dist` (override to overlap them)."""
        return self.output_dist(ctx, self.compute(ctx, input))

    def forward(self, *input: Any, **kwargs: Any) -> LazyAwaitable[Out]:
        """The three stages in a row (collective: every rank calls it together)."""
        ctx = self.create_context()
        dist_input = self.input_dist(ctx, *input, **kwargs).wait().wait()
        return self.compute_and_output_dist(ctx, dist_input)

    def sharded_parameter_names(self, prefix: str = "") -> Iterator[str]:
        """Names of this rank's parameters (``prefix.``-qualified)."""
        for name, _ in self.named_parameters(prefix=prefix):
            yield name


for _sharded in (
    ShardedCollectionBase,
    ShardedManagedCollisionCollection,
    ShardedQuantEmbeddingBagCollection,
    ShardedQuantManagedCollisionEmbeddingCollection,
):
    ShardedModule.register(_sharded)
