"""Tensor operations of managed-collision tables: hashes against unbounded-integer references,
the slot index against a fresh sort, bucket routing, deterministic row re-initialisation."""

from __future__ import annotations

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.managed_collision.hash_zch_probe import murmur3_2x64, unsigned_mod
from lightrec.modules.managed_collision.mch_index import SlotIndex
from lightrec.modules.managed_collision.mch_slots import BucketLayout, round_cut
from lightrec.modules.managed_collision.ops import (
    EMPTY_ID,
    block_bucket,
    bucket_segments,
    mix64,
)
from lightrec.modules.managed_collision.reset import reinit_values

M64 = (1 << 64) - 1


def _splitmix(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _rotl(v: int, r: int) -> int:
    return ((v << r) | (v >> (64 - r))) & M64


def _fmix(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M64
    return h ^ (h >> 33)


def _murmur(x: int) -> int:
    """MurmurHash3 x64 of the 128-bit block (x, 0), seed 0, written out with Python integers."""
    k1 = _rotl((x * 0x87C37B91114253D5) & M64, 31) * 0x4CF5AD432745937F & M64
    h1 = (_rotl(k1, 27) * 5 + 0x52DCE729) & M64
    h2 = (h1 * 5 + 0x38495AB5) & M64
    h1, h2 = h1 ^ 16, h2 ^ 16
    h1 = (h1 + h2) & M64
    h2 = (h2 + h1) & M64
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = (h1 + h2) & M64
    h2 = (h2 + h1) & M64
    return h1 ^ h2


VALUES = [0, 1, 2, 37, 12345, 2**31 - 1, 2**40 + 3, 2**62 + 7, 2**63 - 2, -1, -(2**62)]


def test_mix64_matches_unbounded_integers() -> None:
    out = mix64(torch.tensor(VALUES)).tolist()
    assert [o & M64 for o in out] == [_splitmix(v & M64) for v in VALUES]


def test_murmur3_matches_unbounded_integers_and_unsigned_mod() -> None:
    hashed = murmur3_2x64(torch.tensor(VALUES))
    assert [h & M64 for h in hashed.tolist()] == [_murmur(v & M64) for v in VALUES]
    for m in (1, 7, 97, 2**33 + 5):
        got = unsigned_mod(hashed, torch.full_like(hashed, m)).tolist()
        assert got == [_murmur(v & M64) % m for v in VALUES]


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm_gpu is unavailable")
def test_probe_start_is_fbgemms() -> None:
    """An identity placed at our first probe position is found there by fbgemm's read-only op."""
    ids = torch.tensor([3, 99, 2**40 + 17, 5_000_000_123])
    size = 1009
    pos = unsigned_mod(murmur3_2x64(ids), torch.full_like(ids, size))
    assert len(set(pos.tolist())) == len(ids)
    identities = torch.full((size, 1), -1, dtype=torch.int64)
    identities[pos, 0] = ids
    out, _ = torch.ops.fbgemm.zero_collision_hash(ids, identities, 1, True, -1, True)
    assert torch.equal(out, pos)


def test_block_bucket_and_segments() -> None:
    ids = torch.tensor([0, 249, 250, 999, 1000 - 1])
    assert block_bucket(ids, 1000, 4).tolist() == [0, 0, 1, 3, 3]
    assert block_bucket(ids, 0, 4).tolist() == [0, 1, 2, 3, 3]  # input_hash_size 0: id % buckets
    assert block_bucket(ids, 1000, 1).tolist() == [0] * 5
    assert bucket_segments(10, 3) == [0, 3, 6, 10]
    with pytest.raises(ValueError, match="at least 2 slots"):
        bucket_segments(5, 3)


def test_slot_index_finds_every_resident_after_moves_evictions_and_compaction() -> None:
    g = torch.Generator().manual_seed(0)
    z = 64
    slot_ids = torch.full((z,), EMPTY_ID, dtype=torch.int64)
    index = SlotIndex(BucketLayout([0, z], 0, 1))
    index.rebuild(slot_ids, torch.full((z,), -1, dtype=torch.int64), 0)
    for step in range(30):
        new = torch.unique(torch.randint(0, 40, (6,), generator=g))  # small id space: ids come back
        _, hit = index.lookup(slot_ids, new)
        new = new[~hit]
        slots = torch.randperm(z - 1, generator=g)[: new.numel()]  # move ids out of these slots
        slot_ids[slots] = new
        index.insert(new, slots)
        if step % 7 == 6:
            index.compact(slot_ids)
        occupied = torch.nonzero(slot_ids != EMPTY_ID).flatten()
        found, hit = index.lookup(slot_ids, slot_ids[occupied])
        assert bool(hit.all()) and torch.equal(found, occupied)
        absent = torch.tensor([i for i in range(40) if i not in set(slot_ids.tolist())], dtype=torch.int64)
        assert not bool(index.lookup(slot_ids, absent)[1].any())
    index.compact(slot_ids)
    assert torch.equal(index.ids, torch.sort(slot_ids[slot_ids != EMPTY_ID]).values)


def test_round_cut_ranks_like_a_full_sort() -> None:
    """The cut (kthvalue threshold + a sort of the low entries) equals a full ranking: score
    descending, residents before waiting ids on ties, then position."""
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        residents, waiting = int(torch.randint(0, 30, ())), int(torch.randint(0, 10, ()))
        scores = torch.randint(0, 5, (residents + waiting,), generator=g).double()  # many ties
        capacity, budget = 25, int(torch.randint(0, 8, ()))
        cut = round_cut(scores, residents, capacity, 0, budget)
        keys = [(-float(s), int(i >= residents), i) for i, s in enumerate(scores)]
        ranked = [i for _, _, i in sorted(keys)]  # best first
        worst = ranked[::-1]
        drop = max(len(ranked) - capacity, 0)
        assert cut.dropped.tolist() == worst[:drop]
        assert cut.victims.tolist() == [i for i in worst[drop:] if i < residents][:budget]


def test_reinit_values_depend_on_table_iteration_and_bucket_only() -> None:
    config = EmbeddingBagConfig(num_embeddings=100, embedding_dim=6, name="t", feature_names=["f"])
    rows = torch.tensor([3, 50, 77, 10])
    bounds = [0, 40, 100]  # two buckets
    both = reinit_values(config, rows, iteration=5, seed=1, bucket_bounds=bounds)
    # a shard holding bucket 1 alone draws its rows exactly as the whole table does
    assert torch.equal(reinit_values(config, rows[1:3], 5, 1, [40, 100], first_bucket=1), both[1:3])
    assert torch.equal(reinit_values(config, rows[[0, 3]], 5, 1, [0, 40]), both[[0, 3]])
    assert not torch.equal(reinit_values(config, rows, 6, 1, bounds), both)
    other = EmbeddingBagConfig(num_embeddings=100, embedding_dim=6, name="u", feature_names=["f"])
    assert not torch.equal(reinit_values(other, rows, 5, 1, bounds), both)
    bound = config.get_weight_init_max()
    assert bool((both.abs() <= bound).all()) and both.std() > bound / 4
