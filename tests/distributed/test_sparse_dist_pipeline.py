"""SparseDistPipeline and the stages of a sharded collection (the one pipelining seam).

* ``find_kjts`` finds the KJTs of a batch (itself, dataclass fields, mappings, sequences, depth-limited).
* On 2 gloo ranks, a mixed-plan sharded EBC:
  - the stages run by hand (``input_dist`` -> ``lookup`` -> ``output_dist``, and
    ``compute_and_output_dist``) give the forward's output;
  - an input dist started for a batch is taken by the forward of any KJT holding the very same
    tensors (a rebuilt KJT, as Lightning's ``batch_to_device`` makes, included) and by no other;
    a forward of other tensors runs its own input dist and leaves the started one waiting;
  - a launched forward is returned to the next forward of its tensors and dropped by any other
    forward; a KJT with other features is neither started nor launched.
  Every pipelined output equals the plain forward's, and the input dist runs exactly where expected.
* A pipeline over two collections fed by two KJTs of one batch starts and launches both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tests.multiprocess import run_ranks


def _kjt(n: int) -> Any:
    from lightrec.sparse import KeyedJaggedTensor

    return KeyedJaggedTensor(["a"], torch.arange(n), lengths=torch.tensor([n]), stride=1)


@dataclass
class _Batch:
    dense: torch.Tensor
    sparse: Any


def test_find_kjts_walks_dataclasses_mappings_and_sequences() -> None:
    from lightrec.distributed.train_pipeline.sparse_dist_pipeline import find_kjts

    a, b, c = _kjt(1), _kjt(2), _kjt(3)
    assert find_kjts(a) == [a]
    assert find_kjts((torch.ones(2), _Batch(torch.ones(1), a))) == [a]
    assert find_kjts({"x": [b, (c,)], "y": "text", "z": torch.ones(1)}) == [b, c]
    assert find_kjts([[[[a]]]]) == []  # deeper than 3 levels: not searched
    assert find_kjts([[[[a]]]], depth=4) == [a]
    assert find_kjts(torch.ones(3)) == [] and find_kjts(None) == []


def _body(rank: int, world_size: int) -> dict[str, Any]:
    from lightrec.distributed import ShardingEnv
    from lightrec.distributed.train_pipeline.sparse_dist_pipeline import SparseDistPipeline
    from lightrec.sparse import KeyedJaggedTensor
    from tests.distributed.test_dmp import _batch, _mixed_plan, _sharders, _slice, _tables

    plan = _mixed_plan(world_size).plan["sparse_arch.embedding_bag_collection"]
    torch.manual_seed(0)
    sharded = _sharders()[0].shard(_tables("cpu"), plan, ShardingEnv.from_process_group(None))
    pipeline = SparseDistPipeline([sharded])
    input_dists: list[int] = []
    for d in sharded._input_dists:
        d.register_forward_hook(lambda m, args, out: input_dists.append(1))

    def local(step: int) -> Any:
        return _slice(_batch(step, 4 * world_size)[1], rank * 4, 4)

    def rebuilt(kjt: Any) -> Any:  # what Lightning's batch_to_device gives: new KJT, same tensors
        return kjt.to(torch.device("cpu"))

    def run(kjt: Any) -> tuple[torch.Tensor, int]:
        """Forward of ``kjt``; how many sharding input dists ran inside it."""
        before = len(input_dists)
        with torch.no_grad():
            values = sharded(kjt).wait().values()
        return values, len(input_dists) - before

    out: dict[str, Any] = {}
    a = local(0)
    out["plain"], n = run(a)
    assert n == len(sharded._input_dists)

    # the stages by hand, and the two stages of the fast path, give the forward's output
    with torch.no_grad():
        started = sharded.input_dist(a)
        out["stages"] = sharded.output_dist(sharded.lookup(started), started).wait().values()
        out["fast_path"] = sharded.compute_and_output_dist(sharded.input_dist(a)).wait().values()

    # started for `a` (inside a batch), taken by the forward of `a` (no input dist inside it)
    assert pipeline.start(_Batch(torch.ones(1), a)) == 1
    assert pipeline.started_for(a) and pipeline.started_for(rebuilt(a))
    pipeline.progress()
    pipeline.prefetch()  # in-memory kernels: nothing to fetch, nothing waited
    out["started"], n = run(a)
    assert n == 0 and not pipeline.started_for()

    # a rebuilt KJT around the same tensors takes it too (Lightning's batch_to_device)
    pipeline.start(a)
    out["rebuilt"], n = run(rebuilt(a))
    assert n == 0 and not pipeline.started_for()

    # a forward of other tensors (same ids, copied) runs its own input dist; the started one waits
    pipeline.start(a)
    copy = KeyedJaggedTensor(a.keys(), a.values().clone(), lengths=a.lengths().clone(), stride=a.stride())
    out["copy"], n = run(copy)
    assert n == len(sharded._input_dists) and pipeline.started_for(a) and not pipeline.started_for(copy)
    assert pipeline.cancel(wait=True) == 1 and not pipeline.started_for()

    # launched (DMP's look-ahead): the next forward of the same tensors returns that very awaitable
    assert pipeline.launch(a) == 1
    (launched,) = [w.output for w in sharded.ahead.entries]
    assert sharded(a) is launched
    # a launched forward is dropped by the next forward of another KJT (it may be stale then)
    c = local(1)
    pipeline.launch(a)
    out["other"], _ = run(c)
    out["relaunched"], n = run(a)
    assert n == len(sharded._input_dists)
    # a KJT with other features is neither started nor launched
    other = KeyedJaggedTensor(["zz"], torch.zeros(1, dtype=torch.long), lengths=torch.tensor([1]), stride=1)
    assert pipeline.start(other) == 0 and pipeline.launch(other) == 0 and not sharded.ahead.entries
    out["c"] = run(c)[0]
    return out


def test_started_work_is_taken_by_the_forward_of_its_tensors_only() -> None:
    for r in run_ranks(_body, 2, timeout=120):
        for key in ("stages", "fast_path", "started", "rebuilt", "copy", "relaunched"):
            assert torch.equal(r[key], r["plain"]), key
        assert torch.equal(r["other"], r["c"])


def _two_collections_body(rank: int, world_size: int) -> dict[str, Any]:
    from lightrec.distributed import DistributedModelParallel
    from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig
    from lightrec.sparse import KeyedJaggedTensor

    class TwoTowers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.user = EmbeddingBagCollection(
                [EmbeddingBagConfig(name="u", embedding_dim=4, num_embeddings=20, feature_names=["user"])]
            )
            self.item = EmbeddingBagCollection(
                [EmbeddingBagConfig(name="i", embedding_dim=4, num_embeddings=30, feature_names=["item"])]
            )

        def forward(self, batch: dict[str, Any]) -> torch.Tensor:
            return (self.user(batch["user"]).values() * self.item(batch["item"]).values()).sum(1)

    torch.manual_seed(0)
    model = DistributedModelParallel(TwoTowers(), device="cpu")
    launched = []
    for name in ("user", "item"):
        sharded = model.module.get_submodule(name)
        original = sharded.compute_and_output_dist
        sharded.compute_and_output_dist = lambda s, name=name, f=original: (launched.append(name), f(s))[1]

    def kjt(key: str, step: int) -> KeyedJaggedTensor:
        ids = (torch.arange(3) + 7 * step + rank) % 20
        return KeyedJaggedTensor([key], ids, lengths=torch.ones(3, dtype=torch.long))

    batches = [{"user": kjt("user", s), "item": kjt("item", s)} for s in range(3)]
    assert model.pipeline.start(batches[1]) == 2 and model.pipeline.started_for(batches[1])
    model.pipeline.progress()
    out = model(batches[0])  # both collections launched before the model ran, from the batch's KJTs
    assert launched == ["user", "item"]
    second = model(batches[1])  # takes the two started input dists
    assert not model.pipeline.started_for()
    return {"out": out.detach(), "second": second.detach()}


def test_one_pipeline_drives_several_collections() -> None:
    run_ranks(_two_collections_body, 2, timeout=120)
