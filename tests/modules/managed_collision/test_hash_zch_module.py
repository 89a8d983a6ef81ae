"""``HashZchManagedCollisionModule`` in plain torch: torchrec's arguments, positions fbgemm's
read-only op finds, insertion without collisions, TTL / LRU eviction on a moved clock, opt-in,
per-feature TTL, the frozen lookup and state dicts."""

from __future__ import annotations

import pytest
import torch

import lightrec.modules.managed_collision.hash_zch_module as hash_zch_module
from lightrec._fbgemm import fbgemm_available
from lightrec.modules.managed_collision import (
    HashZchEvictionConfig,
    HashZchEvictionPolicyName,
    HashZchManagedCollisionModule,
)


def hzch(zch: int = 40, buckets: int = 2, **kwargs: object) -> HashZchManagedCollisionModule:
    module = HashZchManagedCollisionModule(zch_size=zch, device=torch.device("cpu"), total_num_buckets=buckets,
                                           max_probe=8, input_hash_size=1000, **kwargs)  # type: ignore[arg-type]
    module._name = "h"
    return module.train()


def test_new_ids_get_distinct_rows_in_their_bucket_and_keep_them() -> None:
    module = hzch()
    ids = torch.tensor([3, 250, 499, 500, 777, 999, 3])
    rows = module.remap_values(ids)
    assert rows[0] == rows[-1] and len(set(rows.tolist())) == 6
    assert bool((rows[:3] < 20).all()) and bool((rows[3:6] >= 20).all())  # bucket 0: rows 0-19, bucket 1: 20-39
    assert torch.equal(module.remap_values(ids), rows)
    assert torch.equal(module.eval().remap_values(ids), rows)
    assert set(module.state_dict()) == {"_hash_zch_identities", "_current_iter_tensor"}
    assert module.state_dict()["_hash_zch_identities"].shape == (40, 1)


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm_gpu is unavailable")
def test_fbgemm_read_only_op_finds_our_insertions() -> None:
    module = hzch()
    ids = torch.arange(0, 1000, 29)
    rows = module.remap_values(ids)
    local = torch.full_like(ids, 20)
    offsets = torch.div(ids, 500, rounding_mode="floor") * 20
    out, _ = torch.ops.fbgemm.zero_collision_hash(ids, module._hash_zch_identities.data, 8, True, -1, True, local,
                                                  offsets)  # fmt: skip
    assert torch.equal(out, rows)


def test_unknown_ids_fall_back_to_their_first_probe_in_eval() -> None:
    module = hzch()
    module.remap_values(torch.tensor([1, 2, 3]))
    frozen = module.frozen_remapper()
    probe = torch.tensor([1, 2, 3, 4, 600])
    assert torch.equal(frozen(probe), module.eval().remap_values(probe))
    state = module._hash_zch_identities.clone()
    module.remap_values(torch.tensor([5, 6]))
    assert torch.equal(module._hash_zch_identities, state)  # eval never inserts


def test_single_ttl_eviction_on_a_moved_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000]
    monkeypatch.setattr(hash_zch_module, "now_hours", lambda: now[0])
    config = HashZchEvictionConfig(features=["f"], single_ttl=2)
    module = hzch(zch=8, buckets=1, eviction_policy_name=HashZchEvictionPolicyName.SINGLE_TTL_EVICTION,
                  eviction_config=config)  # fmt: skip
    old = module.remap_values(torch.arange(0, 800, 100))  # 8 ids, 8 rows (probing finds the free ones)
    assert len(set(old.tolist())) == 8 and module.evict() is None
    assert len(set(module.remap_values(torch.tensor([5, 6])).tolist()) & set(old.tolist())) > 0  # full: collide
    now[0] += 5  # every slot expired
    new = module.remap_values(torch.tensor([5, 6]))
    evicted = module.evict()
    assert evicted is not None and set(new.tolist()) <= set(evicted.tolist())
    assert torch.equal(module.remap_values(torch.tensor([5, 6])), new)


def test_lru_evicts_the_oldest_probed_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [50]
    monkeypatch.setattr(hash_zch_module, "now_hours", lambda: now[0])
    config = HashZchEvictionConfig(features=["f"], single_ttl=1)
    module = HashZchManagedCollisionModule(zch_size=4, device="cpu", total_num_buckets=1, max_probe=4,
                                           input_hash_size=1000, eviction_policy_name=HashZchEvictionPolicyName.LRU_EVICTION,
                                           eviction_config=config)  # fmt: skip
    module.remap_values(torch.tensor([1, 2]))
    now[0] += 1
    module.remap_values(torch.tensor([3, 4]))  # full now; 1 and 2 are the oldest
    rows_12 = module.eval().remap_values(torch.tensor([1, 2]))
    module.train()
    got = module.remap_values(torch.tensor([9]))
    assert int(got) in rows_12.tolist() and module.evict().tolist() == got.tolist()


def test_per_feature_ttl_reads_feature_splits() -> None:
    config = HashZchEvictionConfig(features=["a", "b"], per_feature_ttl=[1, 10])
    module = hzch(zch=8, buckets=1, eviction_policy_name=HashZchEvictionPolicyName.PER_FEATURE_TTL_EVICTION,
                  eviction_config=config)  # fmt: skip
    rows = module.remap_values(torch.tensor([1, 2, 3]), feature_splits=[1, 2])
    meta = module._hash_zch_metadata.view(-1)[rows]
    assert int(meta[1] - meta[0]) == 9 and int(meta[2]) == int(meta[1])
    with pytest.raises(ValueError, match="per_feature_ttl"):
        HashZchManagedCollisionModule(8, "cpu", 1, eviction_policy_name=HashZchEvictionPolicyName.PER_FEATURE_TTL_EVICTION,
                                      eviction_config=HashZchEvictionConfig(features=["a"], per_feature_ttl=[1, 2]))  # fmt: skip


def test_opt_in_admits_a_fixed_share_of_ids() -> None:
    module = hzch(zch=100, buckets=1, opt_in_prob=50, percent_reserved_slots=10)
    rows = module.remap_values(torch.arange(0, 1000, 7))
    admitted = module.frozen_remapper()(torch.arange(0, 1000, 7))
    assert torch.equal(rows, admitted)
    reserved = (rows >= 90).float().mean()
    assert 0.3 < float(reserved) < 0.7  # about half the ids share the 10 reserved rows


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="multiple of total_num_buckets"):
        HashZchManagedCollisionModule(10, "cpu", total_num_buckets=3)
    with pytest.raises(ValueError, match="single_ttl"):
        HashZchManagedCollisionModule(10, "cpu", 1, eviction_policy_name=HashZchEvictionPolicyName.SINGLE_TTL_EVICTION,
                                      eviction_config=HashZchEvictionConfig(features=["f"]))  # fmt: skip
    with pytest.raises(ValueError, match="whole buckets"):
        hzch(zch=40, buckets=4).rebuild_with_output_id_range((0, 15), None)
