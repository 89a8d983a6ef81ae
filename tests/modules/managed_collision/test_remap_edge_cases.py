"""Regression tests of managed-collision bugs found in review: bucket routing of the hash module's
divided ids, the threshold filter's reach over buckets, ids that reach torchrec's dict interface
unadmitted, ``uint64`` ids, and the sharded routing of hashed ``int32`` ids."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightrec.distributed.sharding.managed_collision import McRoutes
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.managed_collision import (
    HashZchManagedCollisionModule,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)
from lightrec.modules.managed_collision.mch_eviction import average_threshold_filter
from lightrec.modules.managed_collision.ops import mix64_hash
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor


def _jt(values: list[int]) -> dict[str, JaggedTensor]:
    return {"f": JaggedTensor(values=torch.tensor(values), lengths=torch.tensor([len(values)]))}


@pytest.mark.parametrize("input_hash_size", [0, 1000])
def test_hash_module_divided_ids_of_two_buckets_keep_their_own_buckets(input_hash_size: int) -> None:
    # With inference_dispatch_div_train_world_size the table stores id // B (or id % block): two raw
    # ids of different buckets can store the same value, yet each must live in its own bucket's rows.
    module = HashZchManagedCollisionModule(20, "cpu", total_num_buckets=2, max_probe=4, input_hash_size=input_hash_size,
                                           inference_dispatch_div_train_world_size=True).train()  # fmt: skip
    ids = torch.tensor([10, 11]) if input_hash_size == 0 else torch.tensor([5, 505])  # stored: 5 and 5
    stored, buckets = module.input_mapper(ids)
    assert stored[0] == stored[1] and buckets.tolist() == [0, 1]
    rows = module.remap_values(ids)
    assert rows[0] < 10 <= rows[1]  # bucket 0: rows 0-9, bucket 1: rows 10-19
    assert torch.equal(module.eval().remap_values(ids), rows)
    assert torch.equal(module.frozen_remapper()(ids), rows)


def test_threshold_filter_decides_per_bucket_so_a_shard_decides_as_the_whole_table() -> None:
    # 4 buckets of 1 row; the shard holds buckets 0 and 1. At the round (step 2) bucket 0's waiting
    # ids are seen 1 and 3 times, bucket 2's 5 and 5 times: a filter over all the module's waiting ids
    # (mean 3.5) drops id 3 in the whole table, but the shard alone (mean 2) keeps it.
    def module() -> MCHManagedCollisionModule:
        return MCHManagedCollisionModule(8, "cpu", LFU_EvictionPolicy(average_threshold_filter), 2,
                                         input_hash_size=400, buckets=4, immediate_eviction_fraction=0.0)  # fmt: skip

    full = module()
    segments = full.output_segments
    shard = full.rebuild_with_output_id_range((segments[0], segments[2]), segments)
    for step in (torch.tensor([1, 101, 201, 301]), torch.tensor([2] + [3] * 3 + [202] * 5 + [203] * 5)):
        mine = full.bucket_of(step) < 2
        assert torch.equal(full.remap_values(step)[mine], shard.remap_values(step[mine]))
    assert torch.equal(full._mch_sorted_raw_ids[:4], shard._mch_sorted_raw_ids)


def test_mch_dict_interface_admits_ids_so_the_state_reloads() -> None:
    # torchrec's forward(dict) must fold ids outside [0, input_hash_size) like the collection does:
    # a negative id parked in bucket 0 made the saved state refuse to load.
    module = MCHManagedCollisionModule(10, "cpu", LRU_EvictionPolicy(), 5, input_hash_size=1000, buckets=2)
    with pytest.warns(UserWarning, match="folded"):
        rows = module(_jt([-5, 3, 700]))["f"].values()
    assert rows.tolist() == module.eval().remap_values(torch.tensor([995, 3, 700])).tolist()
    twin = MCHManagedCollisionModule(10, "cpu", LRU_EvictionPolicy(), 5, input_hash_size=1000, buckets=2)
    twin.load_state_dict(module.state_dict())
    assert torch.equal(twin._mch_sorted_raw_ids, module._mch_sorted_raw_ids)


def test_mch_dict_interface_folds_the_free_slot_marker() -> None:
    module = MCHManagedCollisionModule(10, "cpu", LRU_EvictionPolicy(), 5)
    with pytest.warns(UserWarning, match="folded"):
        rows = module(_jt([2**63 - 1, 4]))["f"].values()  # 2**63 - 1 is outside [0, 2**63 - 1): id 0
    assert rows[0] != rows[1] and int(module.open_slots()) == 7


def test_hash_dict_interface_admits_negative_ids() -> None:
    # raw id -1 is the hash module's empty-slot marker: unadmitted it "found" every empty slot
    module = HashZchManagedCollisionModule(20, "cpu", total_num_buckets=1, max_probe=4).train()
    with pytest.warns(UserWarning, match="folded"):
        rows = module.remap(_jt([-1, 7]))["f"].values()
    assert torch.equal(rows, module.eval().remap_values(torch.tensor([2**63 - 2, 7])))
    assert int(module.open_slots()) == 18


def test_collection_takes_uint64_ids_as_their_int64_bits() -> None:
    config = EmbeddingBagConfig(num_embeddings=100, embedding_dim=4, name="t", feature_names=["f"])

    def collection() -> ManagedCollisionCollection:
        return ManagedCollisionCollection(
            {"t": MCHManagedCollisionModule(100, "cpu", LRU_EvictionPolicy(), 5, buckets=2)}, [config]
        )

    raw = [2**64 - 1, 2**63, 5, 2**63 - 2]
    unsigned = KeyedJaggedTensor(keys=["f"], values=torch.tensor(raw, dtype=torch.uint64), lengths=torch.tensor([2, 2]))
    bits = KeyedJaggedTensor(keys=["f"], values=torch.tensor(raw, dtype=torch.uint64).view(torch.int64),
                             lengths=torch.tensor([2, 2]))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ids above 2**63 - 1 are folded (one warning)
        expected = collection()(bits).values()
        assert torch.equal(collection()(unsigned).values(), expected)


def test_sharded_routing_keeps_hashed_ids_of_an_int32_kjt_whole() -> None:
    # the routing hashes ids (input_hash_func) before sending them: writing 63-bit hashes back into
    # an int32 KJT truncated them (other ids, negative owner ranks) where the unsharded module keeps them
    module = MCHManagedCollisionModule(10, "cpu", LRU_EvictionPolicy(), 5, input_hash_func=mix64_hash, buckets=2, name="t")
    routes = McRoutes({"t": module}, {"t": ["f"]}, need_preprocess=True)
    ids = torch.tensor([1, 2, 3])
    kjt = KeyedJaggedTensor(keys=["f"], values=ids.int(), lengths=torch.tensor([3]))
    prepared = routes.prepare(kjt)
    hashed = module.preprocess_values(ids)
    assert torch.equal(prepared.values().long(), hashed)
    assert torch.equal(routes.owners(prepared, ["t"], {"t": 1}), module.bucket_of(hashed))


def test_sharded_routing_sends_uint64_ids_as_their_int64_bits() -> None:
    module = MCHManagedCollisionModule(10, "cpu", LRU_EvictionPolicy(), 5, buckets=2, name="t")
    routes = McRoutes({"t": module}, {"t": ["f"]}, need_preprocess=True)
    raw = torch.tensor([2**64 - 1, 5, 2**63 - 2], dtype=torch.uint64)
    kjt = KeyedJaggedTensor(keys=["f"], values=raw, lengths=torch.tensor([3]))
    with pytest.warns(UserWarning, match="folded"):
        prepared = routes.prepare(kjt)
    assert prepared.values().dtype == torch.int64
    assert prepared.values().tolist() == [2**63 - 2, 5, 2**63 - 2]  # -1 folded into [0, 2**63 - 1)


def test_hash_table_rows_evicted_at_different_steps_get_different_fresh_values(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fresh values of evicted rows are seeded by the module's iteration: the hash module's was
    # always 0, so every step's evicted rows were re-initialised with the very same values
    from lightrec import EmbeddingBagCollection
    from lightrec.modules.managed_collision import (
        HashZchEvictionConfig,
        HashZchEvictionPolicyName,
        ManagedCollisionEmbeddingBagCollection,
        hash_zch_module,
    )

    clock = [1000]
    monkeypatch.setattr(hash_zch_module, "now_hours", lambda: clock[0])
    configs = [EmbeddingBagConfig(num_embeddings=4, embedding_dim=3, name="t", feature_names=["f"])]
    module = HashZchManagedCollisionModule(4, "cpu", 1, max_probe=4,
                                           eviction_policy_name=HashZchEvictionPolicyName.SINGLE_TTL_EVICTION,
                                           eviction_config=HashZchEvictionConfig(features=["f"], single_ttl=1))  # fmt: skip
    ebc = EmbeddingBagCollection(configs)
    mc = ManagedCollisionEmbeddingBagCollection(ebc, ManagedCollisionCollection({"t": module}, configs),
                                                return_remapped_features=True)  # fmt: skip
    weight = ebc.embedding_bags["t"].weight
    assert isinstance(weight, torch.Tensor)

    def step(ids: list[int]) -> torch.Tensor:
        _, remapped = mc(KeyedJaggedTensor(keys=["f"], values=torch.tensor(ids), lengths=torch.tensor([len(ids)])))
        assert remapped is not None
        return weight[remapped.values()].detach().clone()

    step([1, 2, 3, 4])  # fills the table
    fresh = []
    for new_id in (10, 11):
        clock[0] += 5  # every id expired: the new id takes an evicted row
        fresh.append(step([new_id]))
    assert module.current_iteration() == 3
    assert not torch.equal(fresh[0], fresh[1])


def test_frozen_remappers_fold_ids_outside_the_id_space_as_the_float_module_does() -> None:
    from lightrec.modules.managed_collision.serving import FrozenManagedCollisionCollection

    configs = [EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="t", feature_names=["f"]),
               EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="h", feature_names=["g"])]  # fmt: skip
    mcc = ManagedCollisionCollection(
        {"t": MCHManagedCollisionModule(10, "cpu", LRU_EvictionPolicy(), 5, input_hash_size=1000, buckets=2),
         "h": HashZchManagedCollisionModule(10, "cpu", 2, max_probe=4)},
        configs,
    )  # fmt: skip

    def kjt(values: list[int]) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(keys=["f", "g"], values=torch.tensor(values), lengths=torch.tensor([2, 2]))

    mcc(kjt([995, 3, 2**63 - 2, 7]))  # residents: 995 and 3; 2**63 - 2 and 7
    mcc.eval()
    outside = kjt([-5, 3, -1, 7])  # -5 folds to 995 (id space 1000), -1 to 2**63 - 2 (unbounded)
    with pytest.warns(UserWarning, match="folded"):
        expected = mcc(outside).values()
    assert torch.equal(FrozenManagedCollisionCollection.from_collection(mcc)(outside).values(), expected)
