"""``probabilistic_threshold_filter`` draws each waiting id's chance from a hash of the id and the
iteration, not from torch's global generator: a row-wise shard keeps the waiting ids the unsharded
module keeps, whatever the generator's state, and the keep probability is still
``1 - (1 - p) ** count``."""

from __future__ import annotations

import functools

import pytest
import torch

from lightrec.modules.managed_collision import LFU_EvictionPolicy, MCHManagedCollisionModule
from lightrec.modules.managed_collision.mch_eviction import probabilistic_threshold_filter


def _module() -> MCHManagedCollisionModule:
    # 4 buckets of 4 rows; waiting ids seen 3 times keep a row iff the filter keeps them
    # (keep probability 1 - 0.8 ** 3 ~ 0.49, so about half of them).
    policy = LFU_EvictionPolicy(lambda counts: probabilistic_threshold_filter(counts, 0.2))
    return MCHManagedCollisionModule(16, "cpu", policy, 2, input_hash_size=4000, buckets=4,
                                     immediate_eviction_fraction=0.0)  # fmt: skip


def test_a_shard_keeps_the_waiting_ids_the_whole_table_keeps() -> None:
    full = _module()
    segments = full.output_segments
    shard = full.rebuild_with_output_id_range((segments[2], segments[4]), segments)  # buckets 2 and 3
    residents = torch.tensor([b * 1000 + i for b in range(4) for i in range(4)])
    waiting = torch.tensor([b * 1000 + 100 + i for b in range(4) for i in range(12)]).repeat(3)
    for step in (residents, waiting):
        mine = full.bucket_of(step) >= 2
        torch.manual_seed(0)  # the same generator state for both: only the draws' order differs
        rows = full.remap_values(step)
        torch.manual_seed(0)
        assert torch.equal(rows[mine], shard.remap_values(step[mine]))
    assert torch.equal(full._mch_sorted_raw_ids[8:], shard._mch_sorted_raw_ids)
    admitted = set(full._mch_sorted_raw_ids.tolist()) - set(residents.tolist())
    assert 0 < len(admitted) < 16  # the filter kept some waiting ids and dropped others


def test_the_draw_is_a_function_of_id_iteration_and_seed() -> None:
    ids = torch.arange(10_000, 30_000)
    counts = torch.ones_like(ids)
    keep, _ = probabilistic_threshold_filter(counts, 0.3, ids=ids, iteration=7)
    torch.manual_seed(123)
    again, _ = probabilistic_threshold_filter(counts, 0.3, ids=ids, iteration=7)
    assert torch.equal(keep, again)
    # every shard sees a subset of the ids: each id decides alone
    part, _ = probabilistic_threshold_filter(counts[::7], 0.3, ids=ids[::7], iteration=7)
    assert torch.equal(part, keep[::7])
    next_round, _ = probabilistic_threshold_filter(counts, 0.3, ids=ids, iteration=8)
    other_seed, _ = probabilistic_threshold_filter(counts, 0.3, ids=ids, iteration=7, seed=1)
    assert not torch.equal(keep, next_round) and not torch.equal(keep, other_seed)


@pytest.mark.parametrize(("p", "count"), [(0.3, 1), (0.01, 100), (0.5, 2)])
def test_the_keep_rate_is_one_minus_the_miss_probability_to_the_count(p: float, count: int) -> None:
    ids = torch.arange(40_000)
    keep, _ = probabilistic_threshold_filter(torch.full_like(ids, count), p, ids=ids, iteration=3)
    expected = 1 - (1 - p) ** count
    assert abs(keep.double().mean().item() - expected) < 0.015  # ~6 standard deviations


def test_the_module_hands_ids_to_a_wrapped_filter() -> None:
    # A partial (or lambda) around the filter still gets the ids: the module decides the same
    # whatever torch's generator holds.
    def run(seed: int) -> torch.Tensor:
        policy = LFU_EvictionPolicy(functools.partial(probabilistic_threshold_filter, per_id_probability=0.2))
        module = MCHManagedCollisionModule(8, "cpu", policy, 2, input_hash_size=1000, buckets=1,
                                           immediate_eviction_fraction=0.0)  # fmt: skip
        torch.manual_seed(seed)
        module.remap_values(torch.arange(8))
        module.remap_values(torch.arange(100, 140).repeat(3))
        return module._mch_sorted_raw_ids.clone()

    assert torch.equal(run(0), run(1))


def test_per_id_probability_outside_zero_one_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"per_id_probability=1.5"):
        probabilistic_threshold_filter(torch.ones(3, dtype=torch.int64), 1.5)
