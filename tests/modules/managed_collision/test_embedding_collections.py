"""Managed-collision embedding collections: the lookup of the remapped ids, and evicted rows that
come back re-initialised with a fresh optimizer state -- plain collections with in-backward or
attached optimizers, fused collections on every backend -- so a new id never inherits an old id's
weights or momentum."""

from __future__ import annotations

import pytest
import torch

from lightrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    FusedEmbeddingBagCollection,
    KeyedJaggedTensor,
    apply_optimizer_in_backward,
)
from lightrec._fbgemm import fbgemm_available
from lightrec.modules.managed_collision import (
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    ManagedCollisionEmbeddingBagCollection,
    MCHManagedCollisionModule,
)
from lightrec.modules.managed_collision.reset import reinit_values

ROWS = 5  # 4 rows for ids + the default row 4


def tables() -> list[EmbeddingBagConfig]:
    return [EmbeddingBagConfig(num_embeddings=ROWS, embedding_dim=4, name="t", feature_names=["f"])]


def managed(collection: torch.nn.Module, return_remapped: bool = False) -> ManagedCollisionEmbeddingBagCollection:
    module = MCHManagedCollisionModule(ROWS, "cpu", LRU_EvictionPolicy(), eviction_interval=3)
    return ManagedCollisionEmbeddingBagCollection(collection, ManagedCollisionCollection({"t": module}, tables()),
                                                  return_remapped)  # fmt: skip


def batch(*ids: int) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(["f"], torch.tensor(ids), lengths=torch.ones(len(ids), dtype=torch.int64))


def train(mc: ManagedCollisionEmbeddingBagCollection, *ids: int, opt: torch.optim.Optimizer | None = None) -> list[int]:
    pooled, remapped = mc(batch(*ids))
    pooled.values().pow(2).sum().backward()
    if opt is not None:
        opt.step()
        opt.zero_grad()
    return remapped.values().tolist() if remapped is not None else []


def evict_row_of_4(mc: ManagedCollisionEmbeddingBagCollection, opt: torch.optim.Optimizer | None = None) -> int:
    """Fill the table, make id 4 the least recently used at the round of iteration 3, then let id 9
    take its row at iteration 4; returns that row."""
    rows = train(mc, 1, 2, 3, 4, opt=opt)
    train(mc, 1, 2, 3, opt=opt)
    train(mc, 1, 2, 3, opt=opt)
    return rows[3]


def test_lookup_of_remapped_ids_and_the_returned_kjt() -> None:
    ebc = EmbeddingBagCollection(tables())
    mc = managed(ebc, return_remapped=True)
    pooled, remapped = mc(batch(2**50, 7, 2**50))
    assert remapped is not None and remapped.values()[0] == remapped.values()[2]
    assert torch.equal(pooled.values(), ebc(remapped).values())
    assert mc.embedding_bag_configs() == tables() and mc.feature_names() == ["f"]
    assert managed(EmbeddingBagCollection(tables()))(batch(1))[1] is None


def test_evicted_row_is_reinitialised_with_fresh_in_backward_optimizer_state() -> None:
    ebc = EmbeddingBagCollection(tables())
    apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": 0.5})
    mc = managed(ebc, return_remapped=True)
    row = evict_row_of_4(mc)
    weight = ebc.embedding_bags["t"].weight
    (opt,) = weight._in_backward_optimizers
    assert bool((opt.state[weight]["sum"][row] > 0).all())  # id 4 left its accumulator
    pooled, remapped = mc(batch(9))  # 9 takes row `row`; it is reset before the lookup
    assert remapped.values().tolist() == [row]
    assert torch.equal(pooled.values()[0], reinit_values(tables()[0], torch.tensor([row]), 4)[0])
    assert bool((opt.state[weight]["sum"][row] == 0).all())
    assert bool((opt.state[weight]["sum"][0] > 0).all())  # the other rows keep theirs


def test_attached_outside_optimizer_is_reset_too() -> None:
    ebc = EmbeddingBagCollection(tables())
    opt = torch.optim.Adam(ebc.parameters(), lr=0.1)
    mc = managed(ebc, return_remapped=True)
    mc.attach_optimizer(opt)
    row = evict_row_of_4(mc, opt)
    weight = ebc.embedding_bags["t"].weight
    assert bool((opt.state[weight]["exp_avg"][row] != 0).any())
    mc(batch(9))
    assert bool((opt.state[weight]["exp_avg"][row] == 0).all()) and bool((opt.state[weight]["exp_avg_sq"][row] == 0).all())
    assert int(opt.state[weight]["step"]) == 3  # the shared step counter is kept


CASES = [("torch", "ROWWISE_ADAGRAD"), ("torch", "ADAM")] + (
    [("fbgemm", "ROWWISE_ADAGRAD"), ("fbgemm", "ADAGRAD")] if fbgemm_available() else []  # fbgemm: no CPU Adam
)


@pytest.mark.parametrize(("backend", "optimizer"), CASES)
def test_fused_collection_rows_and_kernel_state_are_reset(backend: str, optimizer: str) -> None:
    ebc = FusedEmbeddingBagCollection(tables(), fused_params={"optimizer": optimizer, "learning_rate": 0.2},
                                      kernel_backend=backend)  # fmt: skip
    mc = managed(ebc, return_remapped=True)
    row = evict_row_of_4(mc)
    states = ebc._lookups[0].kernel.split_optimizer_states()[0]
    assert all(bool((v[row] != 0).any()) for k, v in states.items() if k != "step")
    pooled, _ = mc(batch(9))
    assert torch.allclose(pooled.values()[0], reinit_values(tables()[0], torch.tensor([row]), 4)[0])
    states = ebc._lookups[0].kernel.split_optimizer_states()[0]
    assert all(bool((v[row] == 0).all()) for k, v in states.items() if k != "step")
    assert all(bool((v[0] != 0).any()) for k, v in states.items() if k != "step")


def test_tables_must_match() -> None:
    other = [EmbeddingBagConfig(num_embeddings=ROWS, embedding_dim=8, name="t", feature_names=["f"])]
    module = MCHManagedCollisionModule(ROWS, "cpu", LRU_EvictionPolicy(), eviction_interval=3)
    with pytest.raises(ValueError, match="same tables.*'t'"):
        ManagedCollisionEmbeddingBagCollection(EmbeddingBagCollection(other),
                                               ManagedCollisionCollection({"t": module}, tables()))  # fmt: skip
    with pytest.raises(TypeError, match="ManagedCollisionCollection"):
        ManagedCollisionEmbeddingBagCollection(EmbeddingBagCollection(tables()), {"t": module})  # type: ignore[arg-type]
