"""Managed-collision modules against a plain dict-based remapper: every distinct id keeps one row of
its own while the table has room (repeated ids, empty batches, huge and negative raw ids, tables of
one row), eval and the frozen serving remapper give the trained rows, and a state-dict round trip
continues the same map. Also: the top id ``2**63 - 1`` of the hash module's unbounded space keeps its
row whether or not a negative id shares its batch, and is served to that row."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightrec.modules.managed_collision import (
    DistanceLFU_EvictionPolicy,
    HashZchManagedCollisionModule,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    MCHManagedCollisionModule,
)
from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.sparse import JaggedTensor

TOP = 2**63 - 1


class DictRemapper:
    """The reference: a new id takes a row no other id holds; a known id keeps its row."""

    def __init__(self) -> None:
        self.rows: dict[int, int] = {}

    def check(self, ids: list[int], rows: list[int], allowed: set[int]) -> None:
        for i, r in zip(ids, rows, strict=True):
            assert r in allowed, (i, r)
            if i in self.rows:
                assert self.rows[i] == r, (i, r, self.rows[i])
            else:
                assert r not in self.rows.values(), (i, r)  # no collision with another id
                self.rows[i] = r


def remap(module: ManagedCollisionModule, ids: list[int]) -> list[int]:
    """The collection's path: raw ids admitted (folded) first, then one step (or lookup in eval)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values = module.admit_ids(torch.tensor(ids, dtype=torch.int64), ["f"])
    return module.remap_values(values).tolist()


def torchrec_remap(module: ManagedCollisionModule, ids: list[int]) -> list[int]:
    """torchrec's dict interface (``remap``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = module.remap({"f": JaggedTensor(values=torch.tensor(ids, dtype=torch.int64), lengths=torch.tensor([len(ids)]))})
    return out["f"].values().tolist()


def fold(i: int, space: int) -> int:
    """The reference fold of a raw id into the id space (0: every id >= 0, a negative one mod 2**63 - 1)."""
    if space == 0:
        return i if i >= 0 else i % TOP
    return i % space


STREAM = [[5, 5, 7], [], [TOP - 1, 0, -1, -1, 5], [2**40, -(2**63), 7, 7, 7], [], [3, -3, TOP - 1, 2**62]]


def hash_module(zch: int, buckets: int, space: int) -> HashZchManagedCollisionModule:
    return HashZchManagedCollisionModule(zch_size=zch, device="cpu", total_num_buckets=buckets, max_probe=zch // buckets,
                                         input_hash_size=space).train()  # fmt: skip


def mch_module(policy: str, zch: int, space: int) -> MCHManagedCollisionModule:
    pol = {"lfu": LFU_EvictionPolicy, "lru": LRU_EvictionPolicy, "distance": DistanceLFU_EvictionPolicy}[policy]()
    return MCHManagedCollisionModule(zch, "cpu", pol, 2, input_hash_size=space).train()


def modules() -> list[tuple[str, ManagedCollisionModule, int, int]]:
    """``(name, module, id space, rows ids may hold)``: tables with room for every id of STREAM."""
    out: list[tuple[str, ManagedCollisionModule, int, int]] = []
    for space in (0, 2**62):
        out.append((f"hash-{space}", hash_module(64, 1, space), space, 64))
    out.append(("hash-2-buckets", hash_module(64, 2, 2**62), 2**62, 64))
    for policy in ("lfu", "lru", "distance"):
        out.append((f"mch-{policy}", mch_module(policy, 33, TOP), TOP, 32))  # row 32: the default row
    return out


@pytest.mark.parametrize("case", range(6))
def test_modules_map_like_a_dict_and_serve_and_restore_that_map(case: int) -> None:
    name, module, space, rows = modules()[case]
    ref = DictRemapper()
    seen: list[int] = []
    for step, ids in enumerate(STREAM):
        got = remap(module, ids)
        assert len(got) == len(ids)
        ref.check([fold(i, space) for i in ids], got, set(range(rows)))
        seen += ids
        if step == 2:  # a state-dict round trip in the middle of the stream
            fresh = modules()[case][1]
            fresh.load_state_dict(module.state_dict())
            module = fresh.train()
    module.eval()
    probe = seen + [11, 12, -7]
    trained = remap(module, seen)
    assert trained == [ref.rows[fold(i, space)] for i in seen]
    frozen = module.frozen_remapper()
    assert frozen(torch.tensor(probe)).tolist() == remap(module, probe), name


def test_one_row_hash_table() -> None:
    module = hash_module(1, 1, 0)
    assert remap(module, [9, 9, 4]) == [0, 0, 0]
    assert remap(module, []) == []
    module.eval()
    assert module.frozen_remapper()(torch.tensor([9, 4, -1])).tolist() == [0, 0, 0]
    assert module._hash_zch_identities.view(-1).tolist() == [4]  # new ids racing: the smallest is seated


def test_top_id_of_the_unbounded_space_keeps_its_row_beside_a_negative_id() -> None:
    module = hash_module(16, 1, 0)
    alone = torchrec_remap(module, [TOP, 0])
    with_negative = torchrec_remap(module, [TOP, 0, -5])
    assert with_negative[:2] == alone and alone[0] != alone[1]  # was: TOP folded onto id 0's row
    assert module._hash_zch_identities.view(-1).tolist().count(0) == 1


def test_frozen_hash_remapper_serves_the_top_id_to_its_row() -> None:
    module = hash_module(16, 2, 0)
    rows = remap(module, [TOP, 0, 6, -4])
    module.eval()
    served = module.frozen_remapper()(torch.tensor([TOP, 0, 6, -4])).tolist()
    assert served == rows == remap(module, [TOP, 0, 6, -4])
    assert rows[0] != rows[1]
