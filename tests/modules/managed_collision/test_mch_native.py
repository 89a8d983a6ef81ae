"""The native managed-collision step (``lightrec.modules.managed_collision.mch_native``) against the torch-op step.

Two twin modules see the same drifting stream, one through ``torch.ops.lightrec_mch.lookup_insert``
and one with ``LIGHTREC_MCH_NATIVE=0``; after every step their rows, evicted rows, waiting ids,
counters, buffers and index must be identical. The streams are built so that rows run short
(more new ids per step than free rows and victims), with every eviction policy, several buckets,
a shard of a bucketed table, admission and each kind of immediate eviction.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from lightrec._native import native_ops
from lightrec.modules.managed_collision import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    MCHEvictionPolicy,
    MCHManagedCollisionModule,
    TTL_EvictionPolicy,
    mch_step,
)
from lightrec.modules.managed_collision.mch_native import native_step_available
from lightrec.modules.managed_collision.ops import uniform_block

pytestmark = pytest.mark.skipif(
    native_ops() is None,
    reason="the native ops could not be built here (a NativeUnavailableWarning says why)",
)

POLICIES = [LFU_EvictionPolicy(), LRU_EvictionPolicy(), DistanceLFU_EvictionPolicy(0.5), TTL_EvictionPolicy(4)]


@contextmanager
def torch_step(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with monkeypatch.context() as patch:
        patch.setenv("LIGHTREC_MCH_NATIVE", "0")
        yield


def twins(**kwargs: object) -> tuple[MCHManagedCollisionModule, MCHManagedCollisionModule]:
    made = []
    for _ in range(2):
        module = MCHManagedCollisionModule(device="cpu", **kwargs)  # type: ignore[arg-type]
        module._name = "t"
        made.append(module.train())
    return made[0], made[1]


def assert_same_state(native: MCHManagedCollisionModule, ref: MCHManagedCollisionModule, index: bool = True) -> None:
    for (name, a), (_, b) in zip(native.named_buffers(), ref.named_buffers(), strict=True):
        assert torch.equal(a, b), name
    assert native.mc_stats() == ref.mc_stats()
    assert native._current_iter == ref._current_iter
    a_index, b_index = native._index, ref._index
    if index:  # (folds the native step's pending entries into its sorted index)
        assert all(torch.equal(a, b) for a, b in zip(a_index.entries(), b_index.entries(), strict=True))
    assert a_index.cursor == b_index.cursor and a_index.free_len == b_index.free_len
    assert torch.equal(a_index.queue_flat, b_index.queue_flat)
    assert len(native._history) == len(ref._history)
    for a_wait, b_wait in zip(native._history, ref._history, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a_wait, b_wait, strict=True))


def run_side_by_side(
    native: MCHManagedCollisionModule,
    ref: MCHManagedCollisionModule,
    monkeypatch: pytest.MonkeyPatch,
    steps: int,
    id_space: int,
    batch: int,
    seed: int = 0,
) -> int:
    """Feed both modules the same drifting batches; returns the rows evicted by new ids."""
    g = torch.Generator().manual_seed(seed)
    evicted = 0
    for s in range(steps):
        # a window of live ids that moves through the id space, with a few ids repeated often
        start = (s * id_space) // (3 * steps)
        ids = start + torch.randint(0, id_space // 6 + 1, (batch,), generator=g)
        ids[: batch // 4] = ids[0]
        ids = ids % id_space
        rows = native.remap_values(ids)
        with torch_step(monkeypatch):
            expected = ref.remap_values(ids)
        assert torch.equal(rows, expected), f"step {s}"
        a, b = native.evict(), ref.evict()
        assert (a is None) == (b is None), f"step {s}"
        if a is not None and b is not None:
            assert torch.equal(a, b), f"step {s}"
            evicted += a.numel()
        assert_same_state(native, ref, index=s % 7 == 6)  # pending entries pile up over several steps
    assert_same_state(native, ref)
    return evicted


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the native steps taken (the torch path must not be what both twins ran)."""
    calls: list[int] = []
    real = mch_step.native_lookup_insert

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mch_step, "native_lookup_insert", counted)
    return calls


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: type(p).__name__)
@pytest.mark.parametrize(
    ("buckets", "admission", "fraction"),
    [(1, 1, 0.25), (3, 2, 0.25), (3, 1, 0.0), (1, 3, 1.0)],
)
def test_native_step_decides_exactly_as_the_torch_step(
    policy: MCHEvictionPolicy, buckets: int, admission: int, fraction: float, monkeypatch: pytest.MonkeyPatch,
    native_calls: list[int],
) -> None:  # fmt: skip
    native, ref = twins(zch_size=40, eviction_policy=policy, eviction_interval=3, input_hash_size=10_000,
                        buckets=buckets, admission_threshold=admission, immediate_eviction_fraction=fraction)  # fmt: skip
    evicted = run_side_by_side(native, ref, monkeypatch, steps=60, id_space=10_000, batch=48)
    assert len(native_calls) == 60
    assert native.mc_stats()["inserted"] > 40 and native.mc_stats()["default_lookups"] > 0  # rows ran short
    if fraction > 0 and admission == 1:
        assert evicted > 0  # new ids took victims' rows between rounds


def test_native_step_on_a_shard_of_a_bucketed_table(
    monkeypatch: pytest.MonkeyPatch, native_calls: list[int]
) -> None:
    """A row-wise shard: global row offset, local buckets that start at bucket 2 of 4."""
    whole = MCHManagedCollisionModule(40, "cpu", LRU_EvictionPolicy(), 2, input_hash_size=4_000, buckets=4)
    shard = whole.rebuild_with_output_id_range((20, 40), whole.output_segments)
    native, ref = shard, whole.rebuild_with_output_id_range((20, 40), whole.output_segments)
    for module in (native, ref):
        module._name = "t"
        module.train()
    evicted = run_side_by_side(native, ref, monkeypatch, steps=40, id_space=4_000, batch=40, seed=3)
    assert native_calls and evicted > 0
    rows = native.remap_values(torch.tensor([0, 1999, 2000, 3999]))
    assert rows[0] == rows[1] == 29  # ids of other ranks' buckets: the first local bucket's default row
    assert 20 <= rows[2] <= 29 and 30 <= rows[3] <= 39


def test_native_step_matches_after_a_state_dict_round_trip(
    monkeypatch: pytest.MonkeyPatch, native_calls: list[int]
) -> None:
    """A module resumed from a state dict rebuilds its index and queues; both paths continue alike."""
    native, ref = twins(zch_size=30, eviction_policy=LFU_EvictionPolicy(), eviction_interval=4)
    run_side_by_side(native, ref, monkeypatch, steps=10, id_space=1_000, batch=30)
    resumed, ref_resumed = twins(zch_size=30, eviction_policy=LFU_EvictionPolicy(), eviction_interval=4)
    resumed.load_state_dict(native.state_dict())
    ref_resumed.load_state_dict(ref.state_dict())
    run_side_by_side(resumed, ref_resumed, monkeypatch, steps=20, id_space=1_000, batch=30, seed=1)
    assert len(native_calls) == 30


def test_native_step_serves_cpu_state_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert native_step_available(torch.device("cpu"))
    assert not native_step_available(torch.device("meta"))
    monkeypatch.setenv("LIGHTREC_MCH_NATIVE", "0")
    assert not native_step_available(torch.device("cpu"))


def test_ids_not_admitted_yet_go_to_the_default_row_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """An id admitted in a step beside one that is not: the other waits in the default row (not row -1)."""
    for forced_torch in (False, True):
        with monkeypatch.context() as patch:
            if forced_torch:
                patch.setenv("LIGHTREC_MCH_NATIVE", "0")
            module = MCHManagedCollisionModule(8, "cpu", LRU_EvictionPolicy(), 100, admission_threshold=3).train()
            assert module.remap_values(torch.tensor([42, 43, 43, 43])).tolist() == [7, 0, 0, 0]
            assert module.mc_stats()["default_lookups"] == 1


def test_without_the_native_library_the_torch_step_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """No compiler (``native_ops()`` is None): the torch step serves, with the native step's rows."""
    batches = [torch.tensor(ids) for ids in ([1, 2, 3], [4, 5, 6, 1], [7, 8], [9, 1, 10])]
    native = MCHManagedCollisionModule(6, "cpu", LRU_EvictionPolicy(), 2).train()
    expected = [native.remap_values(batch) for batch in batches]
    monkeypatch.setattr("lightrec.modules.managed_collision.mch_native.native_ops", lambda: None)
    assert not native_step_available(torch.device("cpu"))
    calls: list[int] = []
    monkeypatch.setattr(mch_step, "native_lookup_insert", lambda *a, **k: calls.append(1))
    module = MCHManagedCollisionModule(6, "cpu", LRU_EvictionPolicy(), 2).train()
    assert all(torch.equal(module.remap_values(b), e) for b, e in zip(batches, expected, strict=True))
    assert not calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_native_uniform_rows_equal_the_torch_draw(dtype: torch.dtype) -> None:
    """Fresh values of evicted rows: the native draw and ``managed_collision.ops.uniform_block`` agree bit for bit."""
    for rows, dim, seed, low, high in [(7, 5, 0, -0.01, 0.01), (300, 16, 2**63 - 1, -1.0, 3.0), (1, 1, 12345, 0.0, 1e-3),
                                       (0, 8, 3, -1.0, 1.0)]:  # fmt: skip
        native = torch.ops.lightrec_mch.uniform_rows(rows, dim, seed, low, high - low, dtype)
        reference = uniform_block(rows, dim, seed, low, high, dtype)
        assert native.dtype == dtype and native.shape == (rows, dim) and torch.equal(native, reference)
        assert bool((native >= low).all()) and bool((native <= high).all())
    many = uniform_block(1000, 10, 99, -1.0, 1.0, dtype)
    assert abs(float(many.mean())) < 0.02 and abs(float(many.std()) - 3**-0.5) < 0.02
    assert not torch.equal(uniform_block(4, 4, 1, 0.0, 1.0, dtype), uniform_block(4, 4, 2, 0.0, 1.0, dtype))


def test_batches_larger_than_the_table(monkeypatch: pytest.MonkeyPatch, native_calls: list[int]) -> None:
    """The hash grows with the batch (a step may place as many ids as it looks up)."""
    native, ref = twins(zch_size=6, eviction_policy=LRU_EvictionPolicy(), eviction_interval=2)
    run_side_by_side(native, ref, monkeypatch, steps=8, id_space=500, batch=16)
    run_side_by_side(native, ref, monkeypatch, steps=8, id_space=500, batch=200, seed=2)
    assert len(native_calls) == 16 and native._index.hash is not None and native._index.hash.shape[0] >= 2 * 206
