"""A sharded lookup that writes straight into the pooled exchange (``PooledOutputDist.prepare``).

On the shared-memory transport the forward exchange starts before the lookup, the lookup writes each
peer's rows into its shared chunk and its own rows into their columns of the output, and -- where the
torch kernel wrote them itself -- its backward reads the gradient rows where they arrive. Everything
here is checked bit for bit against the same training through gloo, where nothing is placed.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec._native import native_ops
from tests.multiprocess import run_ranks

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or native_ops() is None or not native_ops().shm,  # type: ignore[union-attr]
    reason="the shared-memory transport needs Linux and lightrec's native ops",
)

DIM, ROWS, TABLES = 8, 40, 5


def _groups() -> tuple[Any, Any]:
    """A gloo group and a shared-memory group over every rank (the transport decides per group)."""
    import torch.distributed as dist

    from lightrec.distributed.comm.shm_transport import shm_transport

    os.environ["LIGHTREC_SHM"] = "0"
    gloo = dist.new_group(backend="gloo")
    assert shm_transport(gloo) is None  # decided now, with the switch off
    os.environ["LIGHTREC_SHM"] = "1"
    shm = dist.new_group(backend="gloo")
    assert shm_transport(shm) is not None
    return gloo, shm


def _batch(step: int, rank: int, world_size: int, one_id: bool, weighted: bool) -> Any:
    """This rank's KJT of one step: unequal batch sizes per rank, one id per bag or 0-3."""
    from lightrec.sparse import KeyedJaggedTensor

    batch = [5, 3, 4][rank % 3]
    g = torch.Generator().manual_seed(100 * step + rank)
    lengths = torch.ones(TABLES * batch, dtype=torch.long) if one_id else torch.randint(0, 4, (TABLES * batch,), generator=g)
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
    weights = torch.rand(values.numel(), generator=g) + 0.5 if weighted else None
    return KeyedJaggedTensor([f"f{t}" for t in range(TABLES)], values, weights, lengths=lengths, stride=batch)


def _train(
    group: Any, world_size: int, kernel: str, one_id: bool, weighted: bool, one_owner: bool = False,
    fail_at: int | None = None,
) -> tuple[list[torch.Tensor], dict[str, int]]:
    """Four fused row-wise Adagrad steps of a table-wise sharded collection on ``group``: the outputs
    and the full tables, and how often the forward was placed (by the kernel, or by a copy).
    ``one_owner``: every table on rank 0 (the other ranks own no columns and place nothing).
    ``fail_at``: the lookups of that step raise on every rank, and training goes on after the error."""
    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv, gather_full_state_dict
    from lightrec.distributed.planner import construct_module_sharding_plan, table_wise
    from lightrec.distributed.sharding.lookups import GroupedPooledEmbeddingsLookup
    from lightrec.kernels.kernel_interface import OutRows
    from lightrec.modules.embedding_configs import EmbeddingBagConfig
    from lightrec.modules.embedding_modules import EmbeddingBagCollection
    from lightrec.optim import EmbOptimType

    os.environ["LIGHTREC_CPU_KERNEL"] = kernel
    torch.manual_seed(3)
    configs = [EmbeddingBagConfig(num_embeddings=ROWS, embedding_dim=DIM, name=f"t{t}", feature_names=[f"f{t}"])
               for t in range(TABLES)]  # fmt: skip
    ref = EmbeddingBagCollection(configs, is_weighted=weighted)
    # Tables dealt to ranks in runs, so that each rank's columns are one block of the output.
    per = TABLES if one_owner else -(-TABLES // world_size)
    plan = construct_module_sharding_plan(
        ref, {f"t{t}": table_wise(rank=t // per) for t in range(TABLES)}, world_size=world_size
    )
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1, "eps": 1e-8}
    sharded = EmbeddingBagCollectionSharder(fused_params=fused).shard(
        ref, plan, ShardingEnv.from_process_group(group), torch.device("cpu")
    )
    counts = {"placed": 0, "copied": 0}
    written = OutRows.written

    def spy(self: OutRows, placed: bool) -> None:
        counts["placed" if placed else "copied"] += 1
        written(self, placed)

    OutRows.written = spy  # type: ignore[method-assign]
    lookup_forward = GroupedPooledEmbeddingsLookup.forward

    def failing(self: Any, *args: Any) -> Any:
        raise RuntimeError("injected lookup failure")

    try:
        seen = []
        rank = torch.distributed.get_rank(group)
        for step in range(4):
            GroupedPooledEmbeddingsLookup.forward = failing if step == fail_at else lookup_forward  # type: ignore[method-assign,assignment]
            try:
                out = sharded(_batch(step, rank, world_size, one_id, weighted)).wait()
            except RuntimeError as exc:
                assert step == fail_at and "injected" in str(exc)
                continue
            values = out.values()
            (values * torch.linspace(-1, 1, values.numel()).view_as(values)).sum().backward()
            seen.append(values.detach().clone())
    finally:
        OutRows.written = written  # type: ignore[method-assign]
        GroupedPooledEmbeddingsLookup.forward = lookup_forward  # type: ignore[method-assign]
    full = gather_full_state_dict(sharded.state_dict())
    return seen + [full[k].detach().clone() for k in sorted(full)], counts


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _equality_body(rank: int, world_size: int, kernels: list[str]) -> dict[str, Any]:
    gloo, shm = _groups()
    results: dict[str, Any] = {}
    for kernel in kernels:
        for one_id in (True, False):
            for weighted in (False, True):
                a, gloo_counts = _train(gloo, world_size, kernel, one_id, weighted)
                b, shm_counts = _train(shm, world_size, kernel, one_id, weighted)
                results[f"{kernel}/one_id={one_id}/weighted={weighted}"] = (_same(a, b), gloo_counts, shm_counts)
    # Nothing of the placed exchanges outlives its step (the output's autograd graph holds the
    # exchange; a reference back to the output would be a cycle Python cannot collect).
    from lightrec.distributed.comm.pooled_all_to_all import PlacedExchange

    gc.collect()
    results["alive"] = sum(isinstance(o, PlacedExchange) for o in gc.get_objects())
    return results


@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3 ranks: slow suite (CI budget)
def test_lookup_into_the_exchange_trains_bit_for_bit_like_gloo(world_size: int) -> None:
    kernels = ["torch", "fbgemm"] if fbgemm_available() else ["torch"]
    per_rank = run_ranks(_equality_body, world_size, args=(kernels,), timeout=400)
    for rank, results in enumerate(per_rank):
        assert results.pop("alive") == 0, f"rank {rank}: placed exchanges outlived their steps"
        for case, (same, gloo_counts, shm_counts) in results.items():
            assert same, f"rank {rank}, {case}: the placed exchange trains otherwise than gloo"
            assert gloo_counts == {"placed": 0, "copied": 0}, f"rank {rank}, {case}: gloo placed {gloo_counts}"
            # Every forward on shared memory was placed: by the torch kernel itself where every bag
            # holds one id, by a copy in the lookup otherwise (fbgemm, bags of several ids).
            kernel_places = case.startswith("torch/one_id=True")
            assert shm_counts == ({"placed": 4, "copied": 0} if kernel_places else {"placed": 0, "copied": 4}), (
                f"rank {rank}, {case}: {shm_counts}"
            )


def _mixed_body(rank: int, world_size: int) -> dict[int | None, dict[str, int]]:
    """Every table on rank 0: it places, the others (no columns) take the plain path -- the same bytes.
    Then the same with the lookups of step 1 failing on every rank and training going on after it:
    rank 0 had started its exchange before the lookup, the others had not; it takes it back."""
    os.environ["LIGHTREC_SHM_TIMEOUT"] = "30"  # a regression fails in seconds, not after 30 minutes
    gloo, shm = _groups()
    counts: dict[int | None, dict[str, int]] = {}
    for fail_at in (None, 1):
        a, _ = _train(gloo, world_size, "torch", True, False, one_owner=True, fail_at=fail_at)
        b, counts[fail_at] = _train(shm, world_size, "torch", True, False, one_owner=True, fail_at=fail_at)
        assert _same(a, b), f"fail_at={fail_at}: the placed exchange trains otherwise than gloo"
    return counts


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_without_columns_and_a_failed_lookup_keep_the_exchanges_in_step(world_size: int) -> None:
    for rank, counts in enumerate(run_ranks(_mixed_body, world_size, timeout=240)):
        placed = 4 if rank == 0 else 0
        assert counts == {None: {"placed": placed, "copied": 0}, 1: {"placed": placed - placed // 4, "copied": 0}}, (
            f"rank {rank}: {counts}"
        )


def _fallback_body(rank: int, world_size: int) -> list[bool]:
    """Where the exchange cannot take the rows in place, ``prepare`` says None and starts nothing."""
    from lightrec.distributed.comm.pooled_all_to_all import PooledEmbeddingsAllToAll
    from lightrec.distributed.comm.qcomm import QuantizedCommCodecs, row_codec

    gloo, shm = _groups()
    cpu = torch.device("cpu")
    fp16 = QuantizedCommCodecs(row_codec("fp16"), row_codec("fp16"))
    # Each rank's columns land in two places of the output: not one block.
    split = [0, 1, 4, 5, 2, 3, 6, 7]
    # A prepared exchange called with other batch sizes than it was prepared for: a clear error, and the
    # exchange taken back (the ranks stay in step).
    a2a = PooledEmbeddingsAllToAll(shm, [4, 4])
    placed = a2a.prepare([2, 2], torch.float32, cpu)
    assert placed is not None
    try:
        a2a(torch.zeros(4, 4), [3, 1], placed=placed)
        mismatch = "no error"
    except ValueError as exc:
        mismatch = str(exc)
    placed.cancel()
    assert "prepared for batch sizes [2, 2], called with [3, 1]" in mismatch, mismatch
    return [
        PooledEmbeddingsAllToAll(gloo, [4, 4]).prepare([2, 2], torch.float32, cpu) is None,  # no shared segment
        PooledEmbeddingsAllToAll(shm, [4, 4], codecs=fp16).prepare([2, 2], torch.float32, cpu) is None,
        PooledEmbeddingsAllToAll(shm, [4, 4], column_order=split).prepare([2, 2], torch.float32, cpu) is None,
    ]


def test_prepare_declines_what_it_cannot_place() -> None:
    for rank, checks in enumerate(run_ranks(_fallback_body, 2, timeout=120)):
        assert checks == [True, True, True], f"rank {rank}: {checks}"


def _cancel_body(rank: int, world_size: int) -> list[str]:
    """``ShmExchange.cancel`` takes back only the newest, unpublished exchange; after it the ranks'
    exchanges still pair up."""
    from lightrec.distributed.comm.shm_transport import shm_transport

    _, group = _groups()
    shm = shm_transport(group)
    assert shm is not None
    peer = 1 - rank
    refused = []
    first = shm.start([0 if d == rank else 8 for d in range(2)])
    first.send_view(peer, torch.float32, 2).copy_(torch.tensor([rank, 1.0]))
    first.publish()
    try:
        first.cancel()
    except RuntimeError as exc:
        refused.append(str(exc))
    first.recv_view(peer, torch.float32, 2).clone()
    first.finish()
    second = shm.start([0 if d == rank else 8 for d in range(2)])
    third = shm.start([0 if d == rank else 8 for d in range(2)])
    try:
        second.cancel()
    except RuntimeError as exc:
        refused.append(str(exc))
    third.cancel()  # the newest: taken back; the next start gets its number again
    again = shm.start([0 if d == rank else 8 for d in range(2)])
    assert again.seq == third.seq
    for ex, value in ((second, 2.0), (again, 3.0)):
        ex.send_view(peer, torch.float32, 2).copy_(torch.tensor([rank, value]))
        ex.publish()
    got = [ex.recv_view(peer, torch.float32, 2).tolist() for ex in (second, again)]
    second.finish()
    again.finish()
    assert got == [[float(peer), 2.0], [float(peer), 3.0]], got
    return refused


def test_only_the_newest_unpublished_exchange_can_be_taken_back() -> None:
    for refused in run_ranks(_cancel_body, 2, timeout=120):
        assert len(refused) == 2 and all("cannot be taken back" in r for r in refused), refused
