"""Side-stream plumbing of pipelined input dists (``lightrec.distributed.comm.streams``).

On CPU: ``record_stream_all`` reaches every tensor holder of an input dist's result (KJTs inside
dataclasses, containers and awaitables, each once) and the helpers do nothing without a stream.
With ``-m gpu``: an input dist started on a side stream (NCCL group of size 1) gives the very
lookups of the ordinary forward, through the training steps of a fused optimizer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from lightrec.distributed.comm.awaitable import Awaitable
from lightrec.distributed.comm.streams import handoff, on_stream, record_stream_all
from tests.multiprocess import run_nccl


class _Holder:
    """Stands for a KJT / Batch: has ``record_stream`` (and no CPU tensors to skip it for)."""

    def __init__(self) -> None:
        self.recorded: list[Any] = []

    def record_stream(self, stream: Any) -> None:
        self.recorded.append(stream)


@dataclasses.dataclass
class _Context:
    sent: Any
    splits: Any
    unbucketize: Any = None


class _Done(Awaitable[Any]):
    def __init__(self, result: Any, buffer: Any) -> None:
        super().__init__()
        self._buffer = buffer
        self._value = result

    def _wait_impl(self) -> Any:
        return self._value


def test_record_stream_all_reaches_every_holder_once() -> None:
    sent, received, buffer, shared = _Holder(), _Holder(), _Holder(), _Holder()
    context = _Context(sent=sent, splits=_Done(received, buffer), unbucketize=shared)
    stream = object()
    record_stream_all(([shared, context], {"again": shared}), stream)
    for holder in (sent, received, buffer, shared):
        assert holder.recorded == [stream]


def test_cpu_tensors_and_no_stream_are_left_alone() -> None:
    record_stream_all([torch.ones(2), {"x": torch.zeros(1)}], stream=object())  # CPU: nothing to record
    with on_stream(None):
        x = torch.ones(3) * 2
    handoff([x], None, torch.device("cpu"))  # no stream: no CUDA call at all
    assert x.sum() == 6


# ---------------------------------------------------------------------------------------------
# GPU: an input dist issued on a side stream


def _side_stream_body(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv
    from lightrec.distributed.planner import construct_module_sharding_plan
    from lightrec.distributed.train_pipeline.sparse_dist_pipeline import SparseDistPipeline
    from lightrec.modules.embedding_modules import EmbeddingBagCollection
    from tests.distributed.test_sharded_embeddings import (
        fused_params,
        global_batch,
        plan_generators,
        table_configs,
    )

    device = torch.device("cuda", torch.cuda.current_device())
    out: dict[str, Any] = {}
    for piped in (False, True):
        torch.manual_seed(5)
        ref = EmbeddingBagCollection(table_configs(True, world_size))
        plan = construct_module_sharding_plan(
            ref, plan_generators("mixed", world_size, True), world_size=world_size
        )
        sharded = EmbeddingBagCollectionSharder(fused_params=fused_params("rowwise_adagrad")).shard(
            ref, plan, ShardingEnv.from_process_group(dist.group.WORLD), device
        )
        side = torch.cuda.Stream(device)
        pipeline = SparseDistPipeline([sharded])
        batches = [global_batch(step, world_size, True, False)[rank].to(device) for step in range(4)]
        outputs = []
        if piped:
            with torch.cuda.stream(side):  # batch 0 copied on the side stream as the callback does
                batches[0] = global_batch(0, world_size, True, False)[rank].to(device, non_blocking=True)
            pipeline.start(batches[0], stream=side)
            pipeline.progress()
        for step in range(3):
            if piped:
                pipeline.start(batches[step + 1], stream=side)
            values = sharded(batches[step]).wait().values()
            if piped:
                pipeline.progress()
            (values.square().sum() * 0.1).backward()  # the fused update runs in backward
            outputs.append(values.detach().cpu())
        if piped:
            assert pipeline.cancel(wait=True) == 1
        torch.cuda.synchronize()
        out["piped" if piped else "plain"] = outputs
    return out


@pytest.mark.gpu
def test_input_dist_on_a_side_stream_gives_the_same_lookups() -> None:
    result = run_nccl(_side_stream_body)
    for plain, piped in zip(result["plain"], result["piped"], strict=True):
        torch.testing.assert_close(piped, plain, rtol=1e-6, atol=1e-6)


def test_pipeline_start_orders_the_side_stream_after_the_current_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SparseDistPipeline.start(batch, stream=side)`` makes ``side`` wait for the current stream
    before stage 1 is issued on it (the ids may be written by kernels still queued there). Spy
    streams on CPU; the GPU twin is in tests/lightning/callbacks/test_sparse_dist_prefetch.py."""
    from lightrec.distributed.sharding.work_ahead import AheadQueue
    from lightrec.distributed.train_pipeline.sparse_dist_pipeline import SparseDistPipeline
    from lightrec.sparse import KeyedJaggedTensor

    log: list[str] = []

    class Spy:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_stream(self, other: Spy) -> None:
            log.append(f"{self.name}.wait_stream({other.name})")

    main, side = Spy("main"), Spy("side")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)

    class Collection:  # the stages a pipeline calls, spied
        device = torch.device("cuda", 0)
        ahead = AheadQueue()

        def accepts(self, features: KeyedJaggedTensor) -> bool:
            return True

        def input_dist(self, features: KeyedJaggedTensor, stream: Any) -> Any:
            log.append(f"begin on {stream.name}")
            return None

    pipeline = SparseDistPipeline([Collection()])  # type: ignore[list-item]
    kjt = KeyedJaggedTensor(["f"], torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
    assert pipeline.start(kjt, stream=side)
    assert log == ["side.wait_stream(main)", "begin on side"]
