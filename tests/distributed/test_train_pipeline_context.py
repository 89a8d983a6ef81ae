"""``TrainPipelineContext`` passed through custom pipelines written the way torchrec users write
them, and ``Tracer`` / ``_rewrite_model`` / ``_start_data_dist`` / ``PipelinedForward`` used as
torchrec's pipelines use them.

On 2 gloo ranks a DLRM sharded by ``DistributedModelParallel`` trains to bit-identical losses and
tables under (a) a ``TrainPipelineSparseDist`` subclass that overrides ``progress`` with its own
stage order and a ``context_type`` with an extra field, and (b) a loop composed from
``_rewrite_model`` / ``_start_data_dist`` / ``_wait_for_batch`` with one context per batch. In one
process, a torchrec-style ``ShardedModule`` extension (stages made of ``NoWait`` awaitables) is a
leaf of the tracer and is pipelined through the context.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from lightrec import KeyedJaggedTensor
from tests.distributed.test_train_pipeline import STEPS, _dlrm_dmp, _loader, _plain
from tests.multiprocess import run_ranks

# torchrec's TrainPipelineContext fields and defaults (torchrec/distributed/train_pipeline/pipeline_context.py)
TORCHREC_FIELDS = {
    "input_dist_splits_requests": {}, "input_dist_tensors_requests": {}, "module_contexts": {},
    "module_contexts_next_batch": {}, "fused_splits_awaitables": [], "events": [], "postproc_fwd_results": {},
    "index": None, "version": 0,
}  # fmt: skip
EBC = "model.sparse_arch.embedding_bag_collection"


def test_context_has_torchrecs_fields_and_paths() -> None:
    from lightrec.distributed.train_pipeline import TrainPipelineContext as FromPackage
    from lightrec.distributed.train_pipeline.pipeline_context import In, Out, TrainPipelineContext
    from lightrec.distributed.train_pipeline.utils import Tracer
    from lightrec.distributed.train_pipeline.utils import TrainPipelineContext as FromUtils
    from lightrec.streamable import Pipelineable

    ctx = TrainPipelineContext()
    assert {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)} == TORCHREC_FIELDS
    assert FromPackage is TrainPipelineContext and FromUtils is TrainPipelineContext
    assert In.__bound__ is Pipelineable and Out.__bound__ is None and Tracer.proxy_buffer_attributes is False


# ------------------------------------------------------------------ a torchrec-style extension
class _Ctx:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def record_stream(self, stream: torch.Stream) -> None: ...


class _ShardedScale(nn.Module):
    """A "sharded" module written against torchrec's ShardedModule contract (one process)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(3.0))

    def create_context(self) -> _Ctx:
        return _Ctx()

    def input_dist(self, ctx: _Ctx, features: KeyedJaggedTensor) -> Any:
        from lightrec.distributed.types import NoWait

        ctx.seen.append("input_dist")
        return NoWait(NoWait(features.values().float()))

    def compute(self, ctx: _Ctx, dist_input: torch.Tensor) -> torch.Tensor:
        ctx.seen.append("compute")
        return dist_input * self.weight

    def output_dist(self, ctx: _Ctx, output: torch.Tensor) -> Any:
        from lightrec.distributed.types import LazyNoWait

        return LazyNoWait(output)

    def compute_and_output_dist(self, ctx: _Ctx, input: torch.Tensor) -> Any:
        return self.output_dist(ctx, self.compute(ctx, input))

    def forward(self, features: KeyedJaggedTensor) -> Any:
        ctx = self.create_context()
        return self.compute_and_output_dist(ctx, self.input_dist(ctx, features).wait().wait())


@dataclasses.dataclass
class _Batch:
    kjts: dict[str, KeyedJaggedTensor]
    dense: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> _Batch:
        return self


class _Model(nn.Module):
    def __init__(self, sharded: nn.Module) -> None:
        super().__init__()
        self.sparse = sharded
        self.dense = nn.Linear(2, 1)
        self.other = _ShardedScale()

    def forward(self, batch: _Batch) -> torch.Tensor:
        rebuilt = KeyedJaggedTensor(keys=["f"], values=batch.kjts["ids"].values() + 1, lengths=batch.kjts["ids"].lengths())
        return self.sparse(batch.kjts["ids"]).sum() + self.dense(batch.dense).sum() + self.other(rebuilt).sum()


def test_tracer_keeps_sharded_modules_as_leaves_and_rewrite_pipelines_through_the_context() -> None:
    from lightrec.distributed.train_pipeline import _rewrite_model, _start_data_dist
    from lightrec.distributed.train_pipeline.utils import (
        PipelinedForwardError,
        ShardedModule,
        Tracer,
        TrainPipelineContext,
        _get_leaf_module_names,
        _pipeline_detach_model,
    )

    ShardedModule.register(_ShardedScale)  # what deriving from ShardedModule does
    model = _Model(_ShardedScale())
    assert _get_leaf_module_names(model) == ["dense"]
    graph = Tracer(leaf_modules=["dense"]).trace(model)
    calls = [n.target for n in graph.nodes if n.op == "call_module"]
    assert calls == ["sparse", "dense", "other"]  # sharded modules are leaves, not traced into
    kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
    batch = _Batch({"ids": kjt}, torch.ones(2, 2))
    want = model(batch)

    context = TrainPipelineContext(version=1, index=0)
    modules, same, originals, postprocs, skipped = _rewrite_model(model, context, dist_stream=None, batch=batch)
    assert modules == [model.sparse] and same is model and postprocs == [] and skipped == ["other"]
    args, _ = model.sparse.forward.args.build_args_kwargs(batch)
    assert args[0] is kjt  # read from the batch by batch.kjts["ids"]
    from lightrec.distributed.train_pipeline.utils import _build_args_kwargs, get_h2d_func

    assert _build_args_kwargs(batch, model.sparse.forward.args)[0][0] is kjt
    assert _build_args_kwargs(batch, model.sparse.forward.args.args) == ([kjt], {})  # torchrec's older list form
    assert torch.equal(get_h2d_func(kjt, torch.device("cpu")).values(), kjt.values())
    _start_data_dist(modules, batch, context)
    assert list(context.input_dist_splits_requests) == ["sparse"] and context.module_contexts["sparse"].seen == ["input_dist"]
    for names, awaitable in context.fused_splits_awaitables:  # torchrec's wait_sparse_data_dist
        for name, request in zip(names, awaitable.wait()):
            context.input_dist_tensors_requests[name] = request
    torch.testing.assert_close(model(batch), want)
    assert context.input_dist_tensors_requests == {} and context.module_contexts == {}  # popped by the forward
    with pytest.raises(PipelinedForwardError, match="_start_data_dist"):
        model(batch)  # no input dist in the context any more
    _pipeline_detach_model(modules, originals)
    assert "forward" not in vars(model.sparse)
    torch.testing.assert_close(model(batch), want)


# ------------------------------------------------------------------ custom pipelines on 2 ranks
def _custom_pipelines_body(rank: int, world_size: int) -> dict:
    from lightrec.distributed.train_pipeline import (
        TrainPipelineContext,
        TrainPipelineSparseDist,
        _rewrite_model,
        _start_data_dist,
        _to_device,
        _wait_for_batch,
    )
    from lightrec.distributed.train_pipeline.utils import _pipeline_detach_model

    @dataclasses.dataclass
    class TaggedContext(TrainPipelineContext):
        tag: str = "mine"

    class MyPipeline(TrainPipelineSparseDist):
        """torchrec's progress(), written out by a user, recording what each context carried."""

        seen: list[tuple[int | None, str, list[str], list[str]]] = []

        def progress(self, dataloader_iter: Iterator[Any]) -> Any:
            if not self._model_attached:
                self.attach(self._model)
            self.fill_pipeline(dataloader_iter)
            if not self.batches:
                raise StopIteration
            self._set_module_context(self.contexts[0])
            self._optimizer.zero_grad()
            self._wait_for_batch()
            if len(self.batches) >= 2:
                self.start_sparse_data_dist(self.batches[1], self.contexts[1])
            self.enqueue_batch(dataloader_iter)
            current = self.contexts[0]
            self.seen.append((current.index, current.tag, sorted(current.module_contexts),  # type: ignore[attr-defined]
                              sorted(current.input_dist_tensors_requests)))  # fmt: skip
            losses, output = self._model(self.batches[0])
            if len(self.batches) >= 2:
                self.wait_sparse_data_dist(self.contexts[1])
            self._backward(losses)
            self._optimizer.step()
            self.dequeue_batch()
            return output

    out: dict = {}
    model, opt = _dlrm_dmp(world_size)
    out["plain"] = _plain(model, opt, list(_loader(rank)))

    model, opt = _dlrm_dmp(world_size)
    pipeline = MyPipeline(model, opt, torch.device("cpu"), context_type=TaggedContext)
    it, losses = iter(list(_loader(rank))), []
    while True:
        try:
            losses.append(float(pipeline.progress(it)[0]))
        except StopIteration:
            break
    out["subclass"], out["seen"] = losses, MyPipeline.seen

    # composed from the utils, one context per batch: start batch i+1 before batch i's forward
    model, opt = _dlrm_dmp(world_size)
    batches = [_to_device(b, torch.device("cpu"), non_blocking=False) for b in _loader(rank)]
    contexts = [TrainPipelineContext(index=i, version=1) for i in range(len(batches))]
    modules, model, originals, _, skipped = _rewrite_model(model, contexts[0], dist_stream=None, batch=batches[0])
    out["pipelined"], out["skipped"] = [m.forward.name for m in modules], skipped

    def wait(context: TrainPipelineContext) -> None:
        for names, awaitable in context.fused_splits_awaitables:
            for name, request in zip(names, awaitable.wait()):
                context.input_dist_tensors_requests[name] = request

    _start_data_dist(modules, batches[0], contexts[0])
    wait(contexts[0])
    losses = []
    for i, batch in enumerate(batches):
        _wait_for_batch(batch, None)
        if i + 1 < len(batches):
            _start_data_dist(modules, batches[i + 1], contexts[i + 1])
        for module in modules:
            module.forward.set_context(contexts[i])
        opt.zero_grad()
        loss, _ = model(batch)
        if i + 1 < len(batches):
            wait(contexts[i + 1])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    out["composed"] = losses
    out["left"] = [bool(c.input_dist_tensors_requests or c.module_contexts) for c in contexts]
    # DistributedModelParallel's look-ahead left the pipelined collection alone (no unread exchanges)
    out["ahead"] = [len(m.ahead.entries) for m in modules]
    _pipeline_detach_model(modules, originals)

    # dlrm_main's use (facebookresearch/dlrm torchrec_dlrm): one pipeline reused for every epoch with
    # a fresh iterator (`_connected = False`), and an evaluation pipeline over the same model run in
    # the middle of an epoch, while the training pipeline has the next batch's input dist in flight
    model, opt = _dlrm_dmp(world_size)
    batches = list(_loader(rank))
    train = TrainPipelineSparseDist(model, opt, torch.device("cpu"))
    val = TrainPipelineSparseDist(model, opt, torch.device("cpu"))
    losses, evaluated = [], 0
    for epoch in (batches[:4], batches[4:]):
        model.train()
        train._connected = False  # type: ignore[attr-defined]  # what dlrm_main sets; lightrec needs nothing
        it = iter(epoch)
        while True:
            try:
                losses.append(float(train.progress(it)[0]))
            except StopIteration:
                break
            if len(losses) == 2:
                model.eval()
                with torch.no_grad():
                    val_it = iter(batches[:3])
                    while True:
                        try:
                            val.progress(val_it)
                        except StopIteration:
                            break
                        evaluated += 1
                model.train()
    out["epochs"], out["evaluated"] = losses, evaluated
    return out


def test_custom_pipelines_pass_contexts_and_train_like_the_plain_loop() -> None:
    for res in run_ranks(_custom_pipelines_body, world_size=2, timeout=300):
        assert len(res["plain"]) == STEPS
        assert res["subclass"] == res["plain"] and res["composed"] == res["plain"]  # bit-identical
        # every batch but the first had its input dist started a step ahead and waited (stage 2) in
        # its context before its forward; all carry the subclass's field
        assert [s[0] for s in res["seen"]] == list(range(STEPS)) and {s[1] for s in res["seen"]} == {"mine"}
        assert all(s[2] == [EBC] and s[3] == [EBC] for s in res["seen"])
        assert res["pipelined"] == [EBC] and res["skipped"] == [] and not any(res["left"]) and res["ahead"] == [0]
        assert res["epochs"] == res["plain"] and res["evaluated"] == 3
