"""The dense gradients' all-reduce through shared memory (``comm/shm_allreduce.py``) on real gloo ranks.

One spawn of 2 ranks checks, in order:

* ``shm_allreduce_`` gives gloo's bytes bit for bit (mean = divide by the world, then sum) for
  float32 and float64, odd sizes (1, 7, a chunk per rank of different lengths) and a tensor larger
  than the transport's first arena (a new generation);
* a DLRM under ``DistributedModelParallel`` trains bit for bit the same with the hook (asked for with
  ``shm_allreduce=True``) as with DDP's own all-reduce (the default): the dense gradients after
  every backward, the losses, and the final parameters;
* the default, ``LIGHTREC_SHM_ALLREDUCE=0`` and a ``/dev/shm`` too small on one rank keep gloo on
  every rank, with the reason in ``dmp.dense_allreduce``.

Then 3 ranks (the same mean on every rank, summed in rank order; gloo's ring may differ in the last
bit), and a dead peer's error reaching DDP through the bucket's future.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any

import pytest
import torch

from lightrec._native import native_ops
from tests.distributed.test_dmp import _dlrm, _mixed_plan, _rank_loss, _sharders
from tests.multiprocess import run_ranks

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or native_ops() is None or not native_ops().shm,  # type: ignore[union-attr]
    reason="the shared-memory transport needs Linux and lightrec's native ops",
)


def _raw_allreduce(rank: int, world_size: int) -> list[bool]:
    """``shm_allreduce_`` against gloo's ``all_reduce`` of the tensor divided by the world size."""
    import torch.distributed as dist

    from lightrec.distributed.comm.shm_allreduce import shm_allreduce_
    from lightrec.distributed.comm.shm_transport import shm_transport

    transport = shm_transport(dist.new_group(backend="gloo"))
    assert transport is not None
    gloo = dist.new_group(backend="gloo")
    same = []
    for numel, dtype in [(1, torch.float32), (7, torch.float32), (1001, torch.float64), (5_000_003, torch.float32)]:
        g = torch.Generator().manual_seed(1000 * rank + numel)
        x = torch.randn(numel, generator=g, dtype=dtype) * 10 ** torch.randint(-3, 4, (numel,), generator=g)
        expected = x / world_size
        dist.all_reduce(expected, group=gloo)
        same.append(torch.equal(shm_allreduce_(transport, x.clone()), expected))
    return same


def _train(rank: int, world_size: int, shm: bool) -> dict[str, Any]:
    """Three SGD steps of a DLRM (mixed sharding) on this rank's slice; dense grads after each backward."""
    from lightrec.distributed import DistributedModelParallel
    from lightrec.distributed.model_parallel import DefaultDataParallelWrapper
    from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter

    batch = 4
    model = DistributedModelParallel(
        copy.deepcopy(_dlrm("cpu")), device="cpu", plan=_mixed_plan(world_size), sharders=_sharders(),
        data_parallel_wrapper=DefaultDataParallelWrapper(shm_allreduce=shm),
    )  # fmt: skip
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    optimizer = CombinedOptimizer(
        [model.fused_optimizer, KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=0.1))]
    )
    losses, grads = [], []
    for step in range(3):
        loss, _ = _rank_loss(model, step, rank, world_size, batch)
        optimizer.zero_grad()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in dense.items() if p.grad is not None})
        optimizer.step()
        losses.append(loss.item())
    return {"how": model.dense_allreduce, "losses": losses, "grads": grads,
            "state": {k: v.clone() for k, v in model.gather_full_state_dict().items()}}  # fmt: skip


def _fallback(rank: int, world_size: int) -> list[str]:
    """``dense_allreduce`` asked for, with the switch off, then with too little /dev/shm on rank 1 only."""
    from lightrec.distributed import DistributedModelParallel
    from lightrec.distributed.comm import shm_allreduce

    def build(shm: bool = True) -> str:
        from lightrec.distributed.model_parallel import DefaultDataParallelWrapper

        dmp = DistributedModelParallel(_dlrm("cpu"), device="cpu", plan=_mixed_plan(world_size), sharders=_sharders(),
                                       data_parallel_wrapper=DefaultDataParallelWrapper(shm_allreduce=shm))  # fmt: skip
        return dmp.dense_allreduce

    default = DistributedModelParallel(_dlrm("cpu"), device="cpu", plan=_mixed_plan(world_size), sharders=_sharders())

    os.environ["LIGHTREC_SHM_ALLREDUCE"] = "0"
    switched_off = build()
    del os.environ["LIGHTREC_SHM_ALLREDUCE"]
    if rank == 1:
        shm_allreduce.shm_space_needed = lambda grad_bytes, world: 1 << 62  # type: ignore[assignment]
    return [default.dense_allreduce, switched_off, build()]


def _body(rank: int, world_size: int) -> dict[str, Any]:
    return {"raw": _raw_allreduce(rank, world_size), "shm": _train(rank, world_size, True),
            "gloo": _train(rank, world_size, False), "fallback": _fallback(rank, world_size)}  # fmt: skip


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_body, 2, timeout=300)


def test_the_shared_memory_mean_is_gloos_bit_for_bit(results: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(results):
        assert r["raw"] == [True] * 4, f"rank {rank}: {r['raw']}"


def test_dlrm_trains_bit_for_bit_the_same_with_the_hook(results: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(results):
        shm, gloo = r["shm"], r["gloo"]
        assert shm["how"] == "shared memory" and gloo["how"] == "DDP's own (shm_allreduce=False)"
        assert shm["losses"] == gloo["losses"], f"rank {rank}"
        for step, (a, b) in enumerate(zip(shm["grads"], gloo["grads"], strict=True)):
            assert a.keys() == b.keys() and a, f"rank {rank} step {step}"
            assert all(torch.equal(a[n], b[n]) for n in a), f"rank {rank} step {step}: dense gradients differ"
        assert all(torch.equal(shm["state"][k], gloo["state"][k]) for k in gloo["state"]), f"rank {rank}"
    assert results[0]["shm"]["losses"] != results[1]["shm"]["losses"]  # the ranks saw different samples
    for step in range(3):  # every rank holds the same (averaged) dense gradients
        a, b = results[0]["shm"]["grads"][step], results[1]["shm"]["grads"][step]
        assert all(torch.equal(a[n], b[n]) for n in a)


def test_gloo_stays_where_the_hook_must_not_run(results: list[dict[str, Any]]) -> None:
    for r in results:
        default, switched_off, no_room = r["fallback"]
        assert default == "DDP's own (shm_allreduce=False)"
        assert switched_off == "DDP's own (rank 0: disabled by LIGHTREC_SHM_ALLREDUCE=0)"
        assert no_room.startswith("DDP's own (rank 1: /dev/shm has ") and "MiB free" in no_room, no_room
        assert "--shm-size" in no_room


def _three_ranks(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """On 3 ranks: the shared-memory mean (summed in rank order) and gloo's."""
    import torch.distributed as dist

    from lightrec.distributed.comm.shm_allreduce import shm_allreduce_
    from lightrec.distributed.comm.shm_transport import shm_transport

    transport = shm_transport(dist.new_group(backend="gloo"))
    assert transport is not None
    x = torch.randn(100_003, generator=torch.Generator().manual_seed(rank))
    expected = x / world_size
    dist.all_reduce(expected)
    return shm_allreduce_(transport, x), expected


@pytest.mark.slow  # a second spawn, of 3 ranks (the 2-rank checks above cover the default suite)
def test_on_three_ranks_every_rank_holds_the_same_mean() -> None:
    """Gloo's ring may add three values in another order: equal to a float's last bits, and the
    same bytes on every rank (each chunk is summed once, in rank order, and copied to the others)."""
    results = run_ranks(_three_ranks, 3, timeout=180)
    for mine, gloo in results:
        torch.testing.assert_close(mine, gloo, rtol=1e-6, atol=1e-7)
        assert torch.equal(mine, results[0][0])
    inputs = [torch.randn(100_003, generator=torch.Generator().manual_seed(r)) / 3 for r in range(3)]
    assert torch.equal(results[0][0], inputs[0] + inputs[1] + inputs[2])  # the fixed order


class _DeadPeer:
    """A transport whose peer is gone: every exchange raises as ``ShmTransport`` does then."""

    world, rank = 2, 0

    def start(self, send_bytes: list[int]) -> None:
        from lightrec.distributed.comm import ShmPeerError

        raise ShmPeerError("rank 1 (pid 123) of the shared-memory transport died")


def test_an_exchange_error_reaches_ddp_through_the_future() -> None:
    """The hook's thread hands a dead peer's error to the bucket's future (DDP raises it in the
    backward), and keeps serving later buckets in order."""
    from lightrec.distributed.comm import ShmPeerError
    from lightrec.distributed.comm.shm_allreduce import ShmAllReduceState

    state = ShmAllReduceState(_DeadPeer())  # type: ignore[arg-type]
    futures = [state.submit(torch.ones(4)) for _ in range(2)]
    for future in futures:
        with pytest.raises(ShmPeerError, match="rank 1 .* died"):
            future.wait()
