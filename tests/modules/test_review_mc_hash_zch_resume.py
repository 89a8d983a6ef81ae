"""A ``HashZchManagedCollisionModule`` restored from a checkpoint continues exactly as an uninterrupted
run: the training-step counter (which seeds the fresh values of evicted rows) is part of its state,
and state dicts saved before it was (no ``_current_iter_tensor`` key) still load."""

from __future__ import annotations

import pytest
import torch

import lightrec.modules.managed_collision.hash_zch_module as hash_zch_module
from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from lightrec.modules.managed_collision import (
    HashZchEvictionConfig,
    HashZchEvictionPolicyName,
    HashZchManagedCollisionModule,
    ManagedCollisionCollection,
    ManagedCollisionEmbeddingBagCollection,
)

ROWS = 8


class Clock:
    """The hash eviction's hour clock, moved by the test."""

    def __init__(self) -> None:
        self.hour = 1000

    def __call__(self) -> int:
        return self.hour


def build() -> ManagedCollisionEmbeddingBagCollection:
    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(num_embeddings=ROWS, embedding_dim=4, name="t", feature_names=["f"])]
    module = HashZchManagedCollisionModule(
        zch_size=ROWS, device="cpu", total_num_buckets=1, max_probe=ROWS, input_hash_size=0,
        eviction_policy_name=HashZchEvictionPolicyName.LRU_EVICTION,
        eviction_config=HashZchEvictionConfig(features=["f"], single_ttl=1),
    )  # fmt: skip
    return ManagedCollisionEmbeddingBagCollection(
        EmbeddingBagCollection(tables), ManagedCollisionCollection({"t": module}, tables), return_remapped_features=True
    ).train()


def batches() -> list[list[int]]:
    """Steps of ids: each new group fills the table, so older ids are evicted (their TTL ran out)."""
    return [[10 * s + k for k in range(ROWS)] for s in range(6)]


def step(mc: ManagedCollisionEmbeddingBagCollection, ids: list[int], clock: Clock, s: int) -> tuple[list[int], list[int], torch.Tensor]:
    clock.hour = 1000 + 2 * s  # every step two hours on: last step's ids have expired
    kjt = KeyedJaggedTensor(["f"], torch.tensor(ids), lengths=torch.ones(len(ids), dtype=torch.int64))
    with torch.no_grad():
        _, remapped = mc(kjt)
    assert remapped is not None
    module = mc._managed_collision_collection._managed_collision_modules["t"]
    assert isinstance(module, HashZchManagedCollisionModule)
    seated = sorted(int(v) for v in module._hash_zch_identities.view(-1).tolist())
    weight = mc._embedding_module.embedding_bags["t"].weight.detach().clone()
    return remapped.values().tolist(), seated, weight


def run(mc: ManagedCollisionEmbeddingBagCollection, steps: list[tuple[int, list[int]]], clock: Clock) -> list[tuple[list[int], list[int], torch.Tensor]]:
    return [step(mc, ids, clock, s) for s, ids in steps]


@pytest.mark.parametrize("n", [1, 3])
def test_restored_module_continues_like_an_uninterrupted_run(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    clock = Clock()
    monkeypatch.setattr(hash_zch_module, "now_hours", clock)
    steps = list(enumerate(batches()))

    reference = build()
    expected = run(reference, steps, clock)

    first = build()
    run(first, steps[:n], clock)
    saved = {k: v.clone() for k, v in first.state_dict().items()}
    restored = build()  # fresh: counter 0, empty table, other weights
    restored.load_state_dict(saved)
    got = run(restored, steps[n:], clock)

    mod = restored._managed_collision_collection._managed_collision_modules["t"]
    ref_mod = reference._managed_collision_collection._managed_collision_modules["t"]
    assert isinstance(mod, HashZchManagedCollisionModule)
    for (rows, seated, weight), (rows_e, seated_e, weight_e) in zip(got, expected[n:], strict=True):
        assert rows == rows_e  # remapped ids
        assert seated == seated_e  # which ids survived eviction
        assert torch.equal(weight, weight_e)  # evicted rows re-initialised with the same values
    assert mod.current_iteration() == ref_mod.current_iteration() == len(steps)
    assert set(restored.state_dict()) == set(reference.state_dict())
    for key, value in reference.state_dict().items():
        assert torch.equal(restored.state_dict()[key], value), key


def test_counter_is_saved_and_loaded_by_the_module_itself() -> None:
    module = HashZchManagedCollisionModule(zch_size=ROWS, device="cpu", total_num_buckets=1, max_probe=ROWS)
    module.train()
    for s in range(5):
        module.remap_values(torch.tensor([s, s + 100]))
    module.remap_values(torch.tensor([], dtype=torch.int64))  # an empty batch is a step too
    state = module.state_dict()
    assert state["_current_iter_tensor"].tolist() == [6]
    fresh = HashZchManagedCollisionModule(zch_size=ROWS, device="cpu", total_num_buckets=1, max_probe=ROWS)
    fresh.load_state_dict(state)
    assert fresh.current_iteration() == 6
    fresh.train().remap_values(torch.tensor([1]))
    assert fresh.current_iteration() == 7
    assert fresh.state_dict()["_current_iter_tensor"].tolist() == [7]
    assert torch.equal(fresh._hash_zch_identities, module._hash_zch_identities)


def test_eval_steps_do_not_count() -> None:
    module = HashZchManagedCollisionModule(zch_size=ROWS, device="cpu", total_num_buckets=1, max_probe=ROWS)
    module.train().remap_values(torch.tensor([1, 2]))
    module.eval().remap_values(torch.tensor([1, 3]))
    assert module.current_iteration() == 1
    assert module.state_dict()["_current_iter_tensor"].tolist() == [1]


def test_older_state_dict_without_the_counter_still_loads_strictly() -> None:
    old = HashZchManagedCollisionModule(zch_size=ROWS, device="cpu", total_num_buckets=1, max_probe=ROWS)
    old.train().remap_values(torch.tensor([4, 5, 6]))
    state = {k: v for k, v in old.state_dict().items() if k != "_current_iter_tensor"}  # as saved before
    fresh = HashZchManagedCollisionModule(zch_size=ROWS, device="cpu", total_num_buckets=1, max_probe=ROWS)
    result = fresh.load_state_dict(state)  # strict: no missing key
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(fresh._hash_zch_identities, old._hash_zch_identities)
    assert fresh.current_iteration() == 0  # nothing saved: the counter is left as it was
    fresh.train().remap_values(torch.tensor([4]))
    assert fresh.current_iteration() == 1


def test_sharded_twin_takes_the_counter() -> None:
    whole = HashZchManagedCollisionModule(zch_size=ROWS, device="cpu", total_num_buckets=2, max_probe=4)
    whole.train()
    for s in range(3):
        whole.remap_values(torch.tensor([s, s + 7]))
    shard = whole.rebuild_with_output_id_range((4, 8), whole.output_segments)
    shard.copy_state_from(whole)
    assert shard.current_iteration() == 3
    assert shard.state_dict()["_current_iter_tensor"].tolist() == [3]
