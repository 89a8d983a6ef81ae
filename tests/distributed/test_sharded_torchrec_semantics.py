"""torchrec input semantics through a 2-rank sharded EBC on real gloo ranks: variable-batch KJTs
(``stride_per_key_per_rank`` + ``inverse_indices``) and KJT keys the collection does not read,
against the unsharded EBC fed the same KJTs (forward, and tables after fused SGD steps).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.distributed.test_sharded_embeddings import (
    column_blocks,
    fused_params,
    max_abs,
    plan_generators,
    reference_update,
    table_configs,
)
from tests.multiprocess import run_ranks

WORLD = 2
VBE_KINDS = ["table_wise", "row_wise", "column_wise", "data_parallel", "table_row_wise", "table_column_wise", "mixed"]


def vbe_batch(rank: int, step: int) -> Any:
    """A variable-batch KJT of one rank: ``a1``/``b`` once per user, ``a2``/``c`` per impression,
    plus a key ``zz`` that no table reads (torchrec ignores it)."""
    from lightrec.sparse import KeyedJaggedTensor

    g = torch.Generator().manual_seed(100 * rank + step)
    rows = {"a1": 13, "b": 2, "a2": 13, "c": 11, "zz": 99}
    users, impressions = 2 + rank, 4 + rank
    keys = ["a1", "zz", "b", "a2", "c"]
    batch = {"a1": users, "b": users, "a2": impressions, "c": impressions, "zz": impressions}
    lengths = [torch.randint(0, 3, (batch[k],), generator=g) for k in keys]
    values = [torch.randint(0, rows[k], (int(n.sum()),), generator=g) for k, n in zip(keys, lengths, strict=True)]
    user_of = torch.randint(0, users, (impressions,), generator=g)
    own = torch.arange(impressions)
    inverse = torch.stack([user_of if batch[k] == users else own for k in keys])
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(values),
        lengths=torch.cat(lengths),
        stride_per_key_per_rank=[[batch[k]] for k in keys],
        inverse_indices=(keys, inverse),
    )


def _vbe_case(rank: int, world_size: int, kind: str) -> dict[str, float]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv, gather_full_state_dict
    from lightrec.distributed.planner import construct_module_sharding_plan
    from lightrec.modules.embedding_modules import EmbeddingBagCollection

    torch.manual_seed(5)
    ref = EmbeddingBagCollection(table_configs(True, world_size))
    plan = construct_module_sharding_plan(ref, plan_generators(kind, world_size, True), world_size=world_size)
    sharder = EmbeddingBagCollectionSharder(fused_params=fused_params("sgd"))
    sharded = sharder.shard(ref, plan, ShardingEnv.from_process_group(dist.group.WORLD), torch.device("cpu"))
    errors = {"forward": 0.0, "tables": 0.0}
    for step in range(2):
        out = sharded(vbe_batch(rank, step)).wait()
        ref_outs = [ref(vbe_batch(r, step)) for r in range(world_size)]
        assert out.keys() == ref_outs[rank].keys()
        errors["forward"] = max(errors["forward"], max_abs(out.values().detach() - ref_outs[rank].values()))
        # loss: mean over ranks of each rank's mean squared output (lightrec's gradient semantics)
        out.values().square().sum(1).mean().backward()
        ref.zero_grad()
        (sum(o.values().square().sum(1).mean() for o in ref_outs) / world_size).backward()
        for name, bag in ref.embedding_bags.items():
            reference_update(bag.weight, bag.weight.grad, {}, "sgd", column_blocks(plan, name, bag.weight.shape[1]))
    full = gather_full_state_dict(sharded.state_dict())
    for name, bag in ref.embedding_bags.items():
        diff = (full[f"embedding_bags.{name}.weight"] - bag.weight.detach()).abs().max().item()
        errors["tables"] = max(errors["tables"], diff)
    return errors


def _refusals_case(rank: int, world_size: int) -> list[str]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder, ShardingEnv
    from lightrec.distributed.planner import construct_module_sharding_plan, table_wise
    from lightrec.modules.embedding_configs import EmbeddingBagConfig
    from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    env = ShardingEnv.from_process_group(dist.group.WORLD)
    messages = []
    shared = EmbeddingBagCollection([
        EmbeddingBagConfig(name="s", num_embeddings=4, embedding_dim=2, feature_names=["x"]),
        EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2, feature_names=["x"]),
    ])  # fmt: skip
    plan = construct_module_sharding_plan(shared, {"s": table_wise(rank=0), "t": table_wise(rank=1)}, world_size=2)
    with pytest.raises(ValueError, match=r"features \['x'\] are read by several tables") as e:
        EmbeddingBagCollectionSharder().shard(shared, plan, env, "cpu")
    messages.append(str(e.value))
    ec = EmbeddingCollection(table_configs(False, world_size))
    ec_plan = construct_module_sharding_plan(ec, {t: table_wise(rank=0) for t in "ABC"}, world_size=2)
    sharded_ec = EmbeddingCollectionSharder().shard(ec, ec_plan, env, "cpu")
    with pytest.raises(ValueError, match="takes fixed-batch") as e:
        sharded_ec(vbe_batch(rank, 0))
    messages.append(str(e.value))
    return messages


def _vbe_every_kind(rank: int, world_size: int) -> dict[str, dict[str, float]]:
    """``_vbe_case`` for every sharding kind, in one pair of spawned ranks (a spawn costs ~4 s of imports)."""
    return {kind: _vbe_case(rank, world_size, kind) for kind in VBE_KINDS}


def test_variable_batch_kjt_through_two_rank_sharded_ebc_equals_unsharded() -> None:
    for by_kind in run_ranks(_vbe_every_kind, world_size=WORLD):
        assert list(by_kind) == list(VBE_KINDS)
        for kind, errors in by_kind.items():
            assert errors["forward"] < 2e-5 and errors["tables"] < 2e-5, (kind, errors)


def test_sharded_refusals_are_clear() -> None:
    results = run_ranks(_refusals_case, world_size=WORLD)
    assert [len(messages) for messages in results] == [2, 2]
