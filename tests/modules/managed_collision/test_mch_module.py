"""``MCHManagedCollisionModule`` and ``ManagedCollisionCollection``: torchrec's construction and
forward, rows for new ids at once, every eviction policy (which ids keep their rows), admission,
buckets, the frozen eval mode, state dicts (torchrec's sorted form loads) and bad input."""

from __future__ import annotations

import pytest
import torch

from lightrec import EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig, JaggedTensor, KeyedJaggedTensor
from lightrec.modules.feature_checks import strict_checks
from lightrec.modules.managed_collision import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    ManagedCollisionEmbeddingCollection,
    ManagedCollisionIdError,
    MCHManagedCollisionModule,
    TTL_EvictionPolicy,
    average_threshold_filter,
    mix64_hash,
)
from lightrec.modules.managed_collision.ops import EMPTY_ID


def mch(zch: int = 8, policy: object = None, interval: int = 2, **kwargs: object) -> MCHManagedCollisionModule:
    module = MCHManagedCollisionModule(
        zch_size=zch, device=torch.device("cpu"), eviction_policy=policy or LRU_EvictionPolicy(),
        eviction_interval=interval, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip
    module._name = "t"
    return module.train()


def step(module: MCHManagedCollisionModule, *ids: int) -> list[int]:
    return module.remap_values(torch.tensor(ids, dtype=torch.int64)).tolist()


def resident(module: MCHManagedCollisionModule) -> set[int]:
    return {int(i) for i in module._mch_sorted_raw_ids.tolist() if i != EMPTY_ID}


def kjt(ids: list[int], lengths: list[int], keys: tuple[str, ...] = ("f",)) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(list(keys), torch.tensor(ids, dtype=torch.int64), lengths=torch.tensor(lengths))


def test_torchrec_style_construction_and_forward() -> None:
    tables = [EmbeddingConfig(num_embeddings=16, embedding_dim=4, name="t", feature_names=["f", "g"])]
    module = MCHManagedCollisionModule(
        zch_size=16, device=torch.device("cpu"), eviction_policy=LFU_EvictionPolicy(), eviction_interval=2,
        input_hash_size=2**62,
    )  # fmt: skip
    mcc = ManagedCollisionCollection({"t": module}, tables)
    mc_ec = ManagedCollisionEmbeddingCollection(EmbeddingCollection(tables), mcc, return_remapped_features=True)
    raw = [2**61 + 5, 7, 2**61 + 5, 123456789, 99]
    out, remapped = mc_ec(kjt(raw, [2, 1, 0, 2], ("f", "g")))
    rows = remapped.values().tolist()
    assert remapped.keys() == ["f", "g"] and remapped.lengths().tolist() == [2, 1, 0, 2]
    assert all(0 <= r < 15 for r in rows)  # row 15 is the default row, unused while rows are free
    by_id = dict(zip(raw, rows))
    assert [by_id[i] for i in raw] == rows and len(set(by_id.values())) == len(by_id)  # one row per live id
    weight = mc_ec._embedding_module.embeddings["t"].weight
    assert torch.equal(torch.cat([out["f"].values(), out["g"].values()]), weight[remapped.values()])
    # torchrec's dict API on the module alone, and its bookkeeping calls
    got = module({"t": JaggedTensor(values=torch.tensor([7, 2**61 + 5]), lengths=torch.tensor([2]))})
    assert got["t"].values().tolist() == [by_id[7], by_id[2**61 + 5]]
    assert module.evict() is None and module.output_size() == 16 and module.input_size() == 2**62
    assert int(module.open_slots()) == 15 - 4 and mcc.open_slots()["t"].item() == 11


def test_new_id_gets_a_free_row_in_its_first_step() -> None:
    module = mch(zch=8, interval=100)  # no eviction round for a long time
    first = step(module, 10, 11)
    second = step(module, 12, 10)
    assert 7 not in first + second  # never the default row: free rows are given at once
    assert second[1] == first[0] and second[0] not in first


@pytest.mark.parametrize("fraction", [0.25, 0.0])
def test_full_table_new_id_takes_the_lowest_ranked_row_at_once(fraction: float) -> None:
    module = mch(zch=5, interval=3, immediate_eviction_fraction=fraction)  # 4 rows + the default row 4
    rows = step(module, 1, 2, 3, 4)  # it 1: fills the table
    step(module, 1, 2, 3)  # it 2
    step(module, 1, 2, 3)  # it 3: round -- 4 ranks last (LRU)
    got = step(module, 9)  # it 4
    if fraction:
        assert got == [rows[3]] and resident(module) == {1, 2, 3, 9}  # 9 evicted 4 at once
        assert module.evict().tolist() == [rows[3]]
    else:
        assert got == [4] and resident(module) == {1, 2, 3, 4}  # waits in the default row (torchrec)
        assert module.evict() is None
        step(module, 9)
        assert step(module, 9) == [rows[3]] and resident(module) == {1, 2, 3, 9}  # the round at it 6 gave it a row


def test_a_victim_seen_after_the_round_keeps_its_row() -> None:
    module = mch(zch=5, interval=3, immediate_eviction_fraction=0.5)  # 2 victims per interval
    step(module, 1, 2, 3, 4)
    step(module, 1, 2)
    step(module, 1, 2)  # round: 3 and 4 rank lowest
    step(module, 3)  # 3 is seen again: no longer a victim
    step(module, 8)  # takes 4's row
    assert resident(module) == {1, 2, 3, 8}


@pytest.mark.parametrize(
    ("policy", "survivors"),
    [
        (LFU_EvictionPolicy(), {1, 2, 4}),  # counts: 1x3, 2x2, 3x1 vs waiting 4x4, 5x1
        (LRU_EvictionPolicy(), {3, 4, 5}),  # 3 seen in step 2, 4 and 5 wait from step 2
        (DistanceLFU_EvictionPolicy(), {1, 3, 4}),
    ],
)
def test_which_ids_keep_their_rows_at_a_round(policy: object, survivors: set[int]) -> None:
    module = mch(zch=4, policy=policy, interval=2, immediate_eviction_fraction=0.0)  # 3 rows
    step(module, 1, 1, 1, 2, 2, 3)  # it 1: all get free rows
    step(module, 4, 4, 4, 4, 5, 3)  # it 2: 4 and 5 wait; round
    assert resident(module) == survivors
    evicted = module.evict()
    assert evicted is not None and evicted.numel() == len({1, 2, 3} - survivors)


def test_ttl_evicts_unseen_ids_without_demand() -> None:
    module = mch(zch=6, policy=TTL_EvictionPolicy(ttl=2), interval=2)
    step(module, 1, 2, 3)
    step(module, 1)
    step(module, 1)
    step(module, 1)  # it 4: round -- 2 and 3 unseen for 3 > ttl iterations
    assert resident(module) == {1} and int(module.open_slots()) == 4
    with pytest.raises(ValueError, match="ttl"):
        TTL_EvictionPolicy(ttl=0)


def test_threshold_filter_keeps_frequent_waiting_ids_only() -> None:
    module = mch(zch=3, policy=LFU_EvictionPolicy(average_threshold_filter), interval=2, immediate_eviction_fraction=0)
    step(module, 1, 2)
    step(module, 7, 7, 7, 8, 9)  # waiting: 7 (3x) above the mean count, 8 and 9 below it
    assert 7 in resident(module) and not {8, 9} & resident(module)


def test_admission_threshold() -> None:
    module = mch(zch=8, interval=100, admission_threshold=3)
    assert step(module, 42) == [7]  # seen once: default row
    assert step(module, 42) == [7]
    row = step(module, 42)[0]
    assert row != 7 and step(module, 42) == [row]
    assert "_mch_admission_counts" in module.state_dict()


def test_buckets_keep_ids_in_their_segment() -> None:
    module = mch(zch=10, interval=100, input_hash_size=100, buckets=2)  # segments [0, 5) and [5, 10)
    rows = step(module, 1, 2, 60, 70, 99)
    assert all(r < 4 for r in rows[:2]) and all(5 <= r < 9 for r in rows[2:])
    assert step(module, 3, 4, 5) == [2, 3, 4]  # bucket 0 is full (4 rows): 5 waits in its default row 4
    assert module.bucket_of(torch.tensor([49, 50])).tolist() == [0, 1]


def test_eval_mode_is_frozen() -> None:
    module = mch(zch=6, interval=1)
    rows = step(module, 1, 2)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    module.eval()
    assert step(module, 1, 2, 3) == rows + [5]  # unknown id: the default row
    assert all(torch.equal(v, module.state_dict()[k]) for k, v in state.items())
    assert module.evict() is None


def test_state_dict_round_trip_and_torchrec_sorted_form() -> None:
    module = mch(zch=8, policy=DistanceLFU_EvictionPolicy(), interval=2)
    for ids in ([5, 6, 7], [5, 9, 2**40], [11, 5]):
        step(module, *ids)
    sd = module.state_dict()
    assert set(sd) == {"_mch_sorted_raw_ids", "_mch_remapped_ids_mapping", "_mch_counts", "_mch_last_access_iter",
                       "_current_iter_tensor", "_output_segments_tensor", "_mch_victim_rank"}  # fmt: skip
    # torchrec keeps ids sorted, each with its row in _mch_remapped_ids_mapping: same content, another order
    order = torch.sort(sd["_mch_sorted_raw_ids"], stable=True).indices
    torchrec_sd = {k: (v[order] if v.shape == (8,) else v) for k, v in sd.items()}
    torchrec_sd.pop("_mch_victim_rank")  # a lightrec-only key; torchrec's state dicts lack it
    twin = mch(zch=8, policy=DistanceLFU_EvictionPolicy(), interval=2)
    twin.load_state_dict(torchrec_sd)
    probe = torch.tensor([5, 6, 2**40, 11, 12345])
    assert torch.equal(twin.eval().remap_values(probe), module.eval().remap_values(probe))
    twin = mch(zch=8, policy=DistanceLFU_EvictionPolicy(), interval=2)
    twin.load_state_dict(sd)
    assert torch.equal(twin._mch_sorted_raw_ids, module._mch_sorted_raw_ids)
    module.train()
    for ids in ([5, 13, 14], [2**40, 15, 16, 17, 18], [19, 5]):  # a resumed run continues identically
        assert step(twin, *ids) == step(module, *ids)


def test_load_errors_name_the_table() -> None:
    module = mch(zch=8, interval=2)
    step(module, 1, 2)
    sd = module.state_dict()
    with pytest.raises(ValueError, match="'t'.*bucket segments"):
        mch(zch=8, interval=2, buckets=2).load_state_dict(sd)
    bad = dict(sd, _mch_remapped_ids_mapping=torch.zeros(8, dtype=torch.int64))
    with pytest.raises(ValueError, match="'t'.*every row"):
        mch(zch=8, interval=2).load_state_dict(bad)
    with pytest.raises(ValueError, match="'t'.*shape"):
        mch(zch=8, interval=2).load_state_dict(dict(sd, _mch_sorted_raw_ids=torch.zeros(5, dtype=torch.int64)))


@pytest.mark.parametrize("policy", [LFU_EvictionPolicy(), LRU_EvictionPolicy(), DistanceLFU_EvictionPolicy(),
                                    TTL_EvictionPolicy(3)])  # fmt: skip
@pytest.mark.parametrize(("buckets", "admission"), [(1, 1), (3, 2)])
def test_index_stays_consistent_over_a_drifting_stream(policy: object, buckets: int, admission: int) -> None:
    g = torch.Generator().manual_seed(0)
    module = mch(zch=31, policy=policy, interval=3, input_hash_size=1000, buckets=buckets, admission_threshold=admission)
    for s in range(40):
        ids = torch.randint(0, 60 + 10 * s, (20,), generator=g) % 1000
        rows = module.remap_values(ids)
        occupied = torch.nonzero(module._mch_sorted_raw_ids != EMPTY_ID).flatten()
        found, hit_all = module._index.lookup(module._mch_sorted_raw_ids, module._mch_sorted_raw_ids[occupied])
        assert bool(hit_all.all()) and torch.equal(found, occupied)
        hit = module._mch_sorted_raw_ids[rows] == ids
        default = module._default_slots[(module.bucket_of(ids))]
        assert bool((hit | (rows == default)).all())  # every id is at its own row or its bucket's default row
        module.evict()
    module.validate_state()


def test_bad_input_errors_name_the_table() -> None:
    tables = [EmbeddingBagConfig(num_embeddings=8, embedding_dim=4, name="catalog", feature_names=["item"])]
    mcc = ManagedCollisionCollection({"catalog": mch(zch=8, input_hash_size=1000)}, tables)
    with strict_checks():  # by default such ids are folded into the id space (test_collection_steps.py)
        with pytest.raises(ManagedCollisionIdError, match="'catalog'.*-3.*\\[0, 1000\\)"):
            mcc(kjt([1, -3], [2], ("item",)))
        with pytest.raises(ManagedCollisionIdError, match="'catalog'.*1000"):
            mcc(kjt([1000], [1], ("item",)))
    with pytest.raises(ValueError, match="'catalog'.*zch_size.*num_embeddings=8"):
        ManagedCollisionCollection({"catalog": mch(zch=6)}, tables)
    with pytest.raises(ValueError, match="'catalog' has no managed-collision module"):
        ManagedCollisionCollection({}, tables)
    with pytest.raises(TypeError, match="eviction_policy"):
        MCHManagedCollisionModule(8, "cpu", "lru", 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eviction_interval"):
        MCHManagedCollisionModule(8, "cpu", LRU_EvictionPolicy(), 0)
    with pytest.raises(ValueError, match="immediate_eviction_fraction"):
        mch(immediate_eviction_fraction=1.5)
    with pytest.raises(ValueError, match="input_hash_size"):
        mch(input_hash_size=2**63)


def test_input_hash_func_spreads_small_ids_over_buckets() -> None:
    tables = [EmbeddingBagConfig(num_embeddings=12, embedding_dim=4, name="t", feature_names=["f"])]
    module = mch(zch=12, interval=100, buckets=2, input_hash_func=mix64_hash)
    mcc = ManagedCollisionCollection({"t": module}, tables)
    rows = mcc(kjt(list(range(8)), [8])).values()
    assert bool((rows < 5).any()) and bool((rows >= 6).any())  # both buckets used, though every id < 2**62
