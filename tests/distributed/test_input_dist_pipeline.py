"""InputDistPipeline: work started ahead of a sharded collection's forward, keyed by the forward's KJT.

* ``find_kjts`` finds the KJTs of a batch (itself, dataclass fields, mappings, sequences, depth-limited).
* On 2 gloo ranks, a mixed-plan sharded EBC: an input dist started for one KJT object is consumed
  only by the forward of that object, or of the KJT it was explicitly handed over to (a rebuilt
  KJT around the same tensors); a KJT with other tensors is refused; a launched forward is
  returned to the next forward of its KJT and dropped by any other forward. Every pipelined
  output equals the plain forward's, and the input dist runs exactly where expected.
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
    from lightrec.distributed.input_dist_pipeline import find_kjts

    a, b, c = _kjt(1), _kjt(2), _kjt(3)
    assert find_kjts(a) == [a]
    assert find_kjts((torch.ones(2), _Batch(torch.ones(1), a))) == [a]
    assert find_kjts({"x": [b, (c,)], "y": "text", "z": torch.ones(1)}) == [b, c]
    assert find_kjts([[[[a]]]]) == []  # deeper than 3 levels: not searched
    assert find_kjts([[[[a]]]], depth=4) == [a]
    assert find_kjts(torch.ones(3)) == [] and find_kjts(None) == []


def _body(rank: int, world_size: int) -> dict[str, Any]:
    from lightrec.distributed import ShardingEnv
    from lightrec.sparse import KeyedJaggedTensor
    from tests.distributed.test_dmp import _batch, _mixed_plan, _sharders, _slice, _tables

    plan = _mixed_plan(world_size).plan["sparse_arch.embedding_bag_collection"]
    torch.manual_seed(0)
    sharded = _sharders()[0].shard(_tables("cpu"), plan, ShardingEnv.from_process_group(None))
    pipeline = sharded.lookahead
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

    # started for `a`, consumed by the forward of `a` (no input dist inside that forward)
    assert pipeline.start(a) and pipeline.pending(a) and not pipeline.pending(rebuilt(a))
    pipeline.progress()
    out["started"], n = run(a)
    assert n == 0 and not pipeline.pending()

    # a rebuilt KJT is not the key: it runs its own input dist, the started one keeps waiting
    pipeline.start(a)
    out["not_handed"], n = run(rebuilt(a))
    assert n == len(sharded._input_dists) and pipeline.pending(a)
    # handed over explicitly, the rebuilt KJT's forward consumes it
    b = rebuilt(a)
    assert pipeline.hand_over(a, b) and pipeline.pending(b) and not pipeline.pending(a)
    out["handed"], n = run(b)
    assert n == 0 and not pipeline.pending()

    # a KJT around other tensors (same ids, copied) is refused; the entry stays with `a`
    pipeline.start(a)
    copy = KeyedJaggedTensor(a.keys(), a.values().clone(), lengths=a.lengths().clone(), stride=a.stride())
    assert not pipeline.hand_over(a, copy) and pipeline.pending(a)
    assert pipeline.cancel(wait=True) == 1 and not pipeline.pending()

    # launched (DMP's prefetch): the next forward of the same KJT returns that very awaitable
    assert pipeline.launch(a)
    launched = pipeline._ahead[id(a)].output
    assert sharded(a) is launched
    # a launched forward is dropped by the next forward of another KJT (it may be stale then)
    c = local(1)
    pipeline.launch(a)
    out["other"], _ = run(c)
    out["relaunched"], n = run(a)
    assert n == len(sharded._input_dists)
    # a KJT with other features is neither started nor launched
    other = KeyedJaggedTensor(["zz"], torch.zeros(1, dtype=torch.long), lengths=torch.tensor([1]), stride=1)
    assert not pipeline.start(other) and not pipeline.launch(other) and not pipeline.pending()
    out["c"] = run(c)[0]
    return out


def test_started_work_is_consumed_by_the_forward_of_its_kjt_only() -> None:
    for r in run_ranks(_body, 2, timeout=120):
        for key in ("started", "not_handed", "handed", "relaunched"):
            assert torch.equal(r[key], r["plain"]), key
        assert torch.equal(r["other"], r["c"])
