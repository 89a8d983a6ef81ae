"""Managed-collision tables under ``DistributedModelParallel``: the planner's plan, sharded
checkpoints (crash-safe, hashed, like every table) and resharding 2 -> 1 and 2 -> 3 ranks, after
which every id keeps its row (the same weights, id map and eviction state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.multiprocess import run_ranks

B = 4
BUCKETS = 6  # whole buckets on 1, 2, 3 and 6 ranks


def _model() -> Any:
    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
    from lightrec.modules.managed_collision import (
        LRU_EvictionPolicy,
        ManagedCollisionCollection,
        ManagedCollisionEmbeddingBagCollection,
        MCHManagedCollisionModule,
    )

    configs = [EmbeddingBagConfig(num_embeddings=30, embedding_dim=4, name="t0", feature_names=["f0"])]
    modules = {"t0": MCHManagedCollisionModule(30, "cpu", LRU_EvictionPolicy(), 2, input_hash_size=10**6,
                                               buckets=BUCKETS)}  # fmt: skip
    model = torch.nn.Module()
    model.mc = ManagedCollisionEmbeddingBagCollection(
        EmbeddingBagCollection(configs, device="meta"), ManagedCollisionCollection(modules, configs)
    )
    return model


def _kjt(ids: torch.Tensor) -> Any:
    from lightrec import KeyedJaggedTensor

    return KeyedJaggedTensor(["f0"], ids, lengths=torch.ones(ids.numel(), dtype=torch.int64))


def _train_and_save(rank: int, world: int, path: str) -> dict[str, Any]:
    from lightrec.distributed import DistributedModelParallel, gather_full_state_dict
    from lightrec.distributed.checkpoint import save_sharded_checkpoint

    dmp = DistributedModelParallel(_model())
    plan = dmp.plan.plan["mc"]["t0"]
    g = torch.Generator().manual_seed(0)
    for s in range(8):
        ids = torch.randint(0, 10**6, (world, B), generator=g)[rank] // 1000 * 1000 + s % 3
        pooled, _ = dmp.module.mc(_kjt(ids))
        pooled.wait().values().sum().backward()
    save_sharded_checkpoint(path, {"state_dict": dmp.state_dict()}, dmp)
    full = gather_full_state_dict(dmp.state_dict())
    return {"full": full, "plan": [(s.shard_offsets, s.shard_sizes) for s in plan.sharding_spec or []],
            "type": plan.sharding_type}  # fmt: skip


def _load(rank: int, world: int, path: str) -> dict[str, torch.Tensor]:
    from lightrec.distributed import DistributedModelParallel, gather_full_state_dict
    from lightrec.distributed.checkpoint import load_sharded_checkpoint

    dmp = DistributedModelParallel(_model())
    dmp.load_state_dict(load_sharded_checkpoint(path, dmp)["state_dict"])
    dmp.eval()
    probe = torch.tensor([0, 1001, 2002, 555000, 999999])  # eval lookups after the reshard work too
    pooled, _ = dmp.module.mc(_kjt(probe[rank::world]))
    pooled.wait()
    return gather_full_state_dict(dmp.state_dict())


def test_save_on_two_ranks_resume_on_one_and_three(tmp_path: Path) -> None:
    path = str(tmp_path / "ckpt")
    saved = run_ranks(_train_and_save, world_size=2, args=(path,), timeout=300)[0]
    assert saved["type"] == "row_wise" and saved["plan"] == [([0, 0], [15, 4]), ([15, 0], [15, 4])]  # 3 buckets each
    full = saved["full"]
    ids = full["mc._managed_collision_collection._managed_collision_modules.t0._mch_sorted_raw_ids"].view(-1)
    assert int((ids != 2**63 - 1).sum()) > 10  # a table in use, with evictions behind it
    for world in (1, 3):
        loaded = run_ranks(_load, world_size=world, args=(path,), timeout=300)[0]
        assert sorted(loaded) == sorted(full)
        for key, value in full.items():
            assert torch.equal(loaded[key].reshape(-1), value.reshape(-1)), (world, key)
