"""A sharded collection honours its unsharded module's ``bounds_check="clamp"|"skip"`` (2 gloo ranks).

Every sharding type at once (row-wise, table-wise, data-parallel, column-wise), weighted bags
with a MEAN table, and sequence embeddings: with out-of-range ids (negative and too large) in the
batch, the sharded forward equals the unsharded module's on the same samples.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.distributed.test_sharded_embeddings import concat_kjts
from tests.multiprocess import run_ranks


def _configs(pooled: bool) -> list[Any]:
    from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType

    if pooled:
        return [
            EmbeddingBagConfig(num_embeddings=13, embedding_dim=8, name="A", feature_names=["a"]),
            EmbeddingBagConfig(num_embeddings=5, embedding_dim=4, name="B", feature_names=["b"], pooling=PoolingType.MEAN),
            EmbeddingBagConfig(num_embeddings=11, embedding_dim=4, name="C", feature_names=["c"]),
            EmbeddingBagConfig(num_embeddings=7, embedding_dim=8, name="D", feature_names=["d"]),
        ]
    return [EmbeddingConfig(num_embeddings=n, embedding_dim=4, name=t, feature_names=[t.lower()])
            for t, n in (("A", 13), ("B", 5), ("C", 11), ("D", 7))]  # fmt: skip


def _batches(world_size: int, weighted: bool) -> list[Any]:
    from lightrec.sparse import KeyedJaggedTensor

    rows = {"a": 13, "b": 5, "c": 11, "d": 7}
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(world_size):
        lengths = torch.randint(0, 4, (4, 3), generator=g)
        # ids in [-3, rows + 3): some negative, some too large
        values = torch.cat([torch.randint(-3, rows[k] + 3, (int(lengths[i].sum()),), generator=g)
                            for i, k in enumerate(rows)])  # fmt: skip
        weights = torch.rand(values.numel(), generator=g) + 0.5 if weighted else None
        out.append(KeyedJaggedTensor(list(rows), values, weights, lengths=lengths.reshape(-1), stride=3))
    return out


def _body(rank: int, world_size: int) -> dict[str, float]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder, ShardingEnv
    from lightrec.distributed.planner import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )  # fmt: skip
    from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    env = ShardingEnv.from_process_group(dist.group.WORLD)
    gens = {"A": row_wise(), "B": table_wise(rank=1), "C": data_parallel(), "D": column_wise(ranks=[1, 0])}
    errors = {}
    for mode in ("clamp", "skip"):
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(_configs(True), is_weighted=True, bounds_check=mode)
        plan = construct_module_sharding_plan(ebc, gens, world_size=world_size)
        sharded = EmbeddingBagCollectionSharder().shard(ebc, plan, env, torch.device("cpu"))
        kjts = _batches(world_size, weighted=True)
        got = sharded(kjts[rank]).wait().values()
        expected = ebc(concat_kjts(kjts)).values()[3 * rank : 3 * rank + 3]
        errors[f"ebc/{mode}"] = (got - expected).abs().max().item()

        torch.manual_seed(0)
        ec = EmbeddingCollection(_configs(False), bounds_check=mode)
        plan = construct_module_sharding_plan(ec, gens, world_size=world_size)
        sharded_ec = EmbeddingCollectionSharder().shard(ec, plan, env, torch.device("cpu"))
        kjts = _batches(world_size, weighted=False)
        got_ec, ref_ec = sharded_ec(kjts[rank]).wait(), ec(concat_kjts(kjts))
        err = 0.0
        for f, jt in got_ec.items():
            ref_lengths = ref_ec[f].lengths()
            assert torch.equal(jt.lengths(), ref_lengths[3 * rank : 3 * rank + 3]), (mode, f)
            lo = int(ref_lengths[: 3 * rank].sum())
            mine = ref_ec[f].values()[lo : lo + jt.values().shape[0]]
            err = max(err, (jt.values() - mine).abs().max().item() if mine.numel() else 0.0)
        errors[f"ec/{mode}"] = err
    return errors


def test_bounds_check_modes_survive_sharding() -> None:
    for rank, errors in enumerate(run_ranks(_body, 2, timeout=120)):
        assert set(errors) == {"ebc/clamp", "ebc/skip", "ec/clamp", "ec/skip"}
        for case, err in errors.items():
            assert err <= 1e-6, f"rank {rank} {case}: differs by {err}"


def test_id_bounds_rewrites_only_bad_ids() -> None:
    from lightrec.distributed.sharding.id_bounds import IdBounds
    from lightrec.sparse import KeyedJaggedTensor

    kjt = KeyedJaggedTensor(["a", "b"], torch.tensor([0, 5, -1, 2, 9]), torch.tensor([1.0, 2, 3, 4, 5]),
                            lengths=torch.tensor([2, 1, 2, 0]), stride=2)  # fmt: skip
    clamped = IdBounds("clamp", {"a": 5, "b": 3})(kjt)
    assert clamped.values().tolist() == [0, 4, 0, 2, 2] and clamped.lengths().tolist() == [2, 1, 2, 0]
    skipped = IdBounds("skip", {"a": 5, "b": 3})(kjt)
    assert skipped.values().tolist() == [0, 2] and skipped.lengths().tolist() == [1, 0, 1, 0]
    assert skipped.weights().tolist() == [1.0, 4.0]
    assert IdBounds("error", {"a": 5, "b": 3})(kjt) is kjt
    good = KeyedJaggedTensor(["a", "b"], torch.tensor([0, 4, 2]), lengths=torch.tensor([2, 0, 1, 0]), stride=2)
    assert IdBounds("skip", {"a": 5, "b": 3})(good) is good  # nothing to rewrite: the same object
