"""Review cases of the sharding core on 2 gloo ranks, against the unsharded collection trained by hand.

What the broad test (``test_sharded_embeddings.py``) does not reach:

* row-wise splits chosen in the plan (``row_wise(sizes_placement=...)``) that are not the default
  ``ceil(rows / W)`` blocks: an uneven split, a rank owning zero rows of a table (first or last),
  so the input dist routes by explicit block bounds;
* tables of one sharding type under *different* fused optimizers (two kernel groups on a rank),
  one group of which has no rows on a rank, and a served group with an empty shard in its middle;
* MEAN tables next to SUM tables under these splits, weighted and unweighted, unequal batches and
  a rank without samples;
* the same splits for a sequence ``EmbeddingCollection`` (the unbucketize permutation).

Each case compares the forward with the unsharded module's rows for the rank's samples and, after
SGD steps (a different learning rate per table group), the gathered tables with the unsharded
tables updated by hand on the loss ``mean over ranks of the rank's loss`` (docs/sharding.md).
"""

from __future__ import annotations

from typing import Any

import torch

from tests.distributed.test_sharded_embeddings import concat_kjts, max_abs, mean_or_zero, per_sample_loss
from tests.multiprocess import run_ranks

WORLD = 2
STEPS = 2
TOL = 2e-5
ROWS = {"A": 13, "B": 5, "C": 11}
LR = {"A": 0.1, "B": 0.05, "C": 0.1}  # B alone in its own kernel group (another optimizer)


def _configs(pooled: bool) -> list[Any]:
    from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType

    if pooled:
        return [
            EmbeddingBagConfig(num_embeddings=13, embedding_dim=8, name="A", feature_names=["a1", "a2"]),
            EmbeddingBagConfig(num_embeddings=5, embedding_dim=4, name="B", feature_names=["b"],
                               pooling=PoolingType.MEAN),  # fmt: skip
            EmbeddingBagConfig(num_embeddings=11, embedding_dim=6, name="C", feature_names=["c"],
                               pooling=PoolingType.MEAN),  # fmt: skip
        ]
    return [
        EmbeddingConfig(num_embeddings=13, embedding_dim=4, name="A", feature_names=["a1", "a2"]),
        EmbeddingConfig(num_embeddings=5, embedding_dim=4, name="B", feature_names=["b"]),
        EmbeddingConfig(num_embeddings=11, embedding_dim=6, name="C", feature_names=["c"]),
    ]


def _generators(split: str) -> dict[str, Any]:
    from lightrec.distributed.planner import row_wise

    if split == "uneven":  # A 10 | 3, B 0 | 5 (rank 0 empty), C 11 | - (rank 1 has no shard)
        return {
            "A": row_wise(([10, 3], "cpu")),
            "B": row_wise(([0, 5], "cpu")),
            "C": row_wise(([11], "cpu")),
        }
    # A 1 | 12, B 5 | 0 (rank 1 empty), C 0 | 11
    return {"A": row_wise(([1, 12], "cpu")), "B": row_wise(([5, 0], "cpu")), "C": row_wise(([0, 11], "cpu"))}


def _batch(step: int, weighted: bool, sizes: list[int]) -> list[Any]:
    from lightrec.sparse import KeyedJaggedTensor

    keys = ["b", "c", "a2", "a1"]  # not the collection's order
    rows = {"a1": 13, "a2": 13, "b": 5, "c": 11}
    g = torch.Generator().manual_seed(31 + step)
    out = []
    for batch in sizes:
        lengths = torch.randint(0, 5, (len(keys), batch), generator=g)
        if batch:
            lengths[1, 0] = 0  # an empty MEAN bag
        values = torch.cat(
            [torch.randint(0, rows[k], (int(lengths[i].sum()),), generator=g) for i, k in enumerate(keys)]
        )
        weights = torch.rand(values.numel(), generator=g) + 0.5 if weighted else None
        out.append(KeyedJaggedTensor(keys, values, weights, lengths=lengths.reshape(-1), stride=batch))
    return out


def _mark_optimizers(module: Any, attr: str) -> None:
    from lightrec.optim import apply_optimizer_in_backward

    for name, holder in getattr(module, attr).items():
        # register_hook=False: the unsharded reference is stepped by hand below
        apply_optimizer_in_backward(torch.optim.SGD, [holder.weight], {"lr": LR[name]}, register_hook=False)


def _sgd(module: Any, attr: str) -> None:
    with torch.no_grad():
        for name, holder in getattr(module, attr).items():
            holder.weight -= LR[name] * holder.weight.grad
            holder.weight.grad = None


def _pooled_case(rank: int, world_size: int, split: str, weighted: bool, sizes: list[int]) -> dict[str, float]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv, gather_full_state_dict
    from lightrec.distributed.planner import construct_module_sharding_plan
    from lightrec.modules.embedding_modules import EmbeddingBagCollection

    torch.manual_seed(3)
    ref = EmbeddingBagCollection(_configs(True), is_weighted=weighted)
    _mark_optimizers(ref, "embedding_bags")
    plan = construct_module_sharding_plan(ref, _generators(split), world_size=world_size)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = EmbeddingBagCollectionSharder().shard(ref, plan, env, torch.device("cpu"))
    first = sum(sizes[:rank])
    starts = [sum(sizes[:r]) for r in range(world_size)]
    errors = {"forward": 0.0, "tables": 0.0}
    for step in range(STEPS):
        kjts = _batch(step, weighted, sizes)
        out = sharded(kjts[rank]).wait()
        ref_out = ref(concat_kjts(kjts))
        assert out.keys() == ref_out.keys()
        errors["forward"] = max(errors["forward"], max_abs(out.values().detach() - ref_out.values()[first : first + sizes[rank]]))
        mean_or_zero(per_sample_loss(out.values(), first)).backward()
        ref_loss = sum(
            mean_or_zero(per_sample_loss(ref_out.values()[s : s + b], s)) for s, b in zip(starts, sizes)
        ) / world_size
        ref_loss.backward()
        _sgd(ref, "embedding_bags")
    full = gather_full_state_dict(sharded.state_dict())
    for name, bag in ref.embedding_bags.items():
        errors["tables"] = max(errors["tables"], max_abs(full[f"embedding_bags.{name}.weight"] - bag.weight.detach()))
    return errors


def _sequence_case(rank: int, world_size: int, split: str, sizes: list[int]) -> dict[str, float]:
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingCollectionSharder, ShardingEnv, gather_full_state_dict
    from lightrec.distributed.planner import construct_module_sharding_plan
    from lightrec.modules.embedding_modules import EmbeddingCollection

    torch.manual_seed(4)
    ref = EmbeddingCollection(_configs(False))
    _mark_optimizers(ref, "embeddings")
    plan = construct_module_sharding_plan(ref, _generators(split), world_size=world_size)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = EmbeddingCollectionSharder().shard(ref, plan, env, torch.device("cpu"))
    errors = {"forward": 0.0, "tables": 0.0}

    def loss_of(jts: dict) -> torch.Tensor:
        return sum(((jt.values() - 0.3) ** 2).sum() * (i + 1) for i, (_, jt) in enumerate(sorted(jts.items())))

    for step in range(STEPS):
        kjts = _batch(step, False, sizes)
        out = sharded(kjts[rank]).wait()
        ref_out = ref(concat_kjts(kjts))
        for f, jt in out.items():
            lengths = ref_out[f].lengths()
            lo = int(lengths[: sum(sizes[:rank])].sum())
            mine = ref_out[f].values()[lo : lo + jt.values().shape[0]]
            assert torch.equal(jt.lengths(), lengths[sum(sizes[:rank]) : sum(sizes[: rank + 1])])
            errors["forward"] = max(errors["forward"], max_abs(jt.values().detach() - mine))
        loss_of(out).backward()
        (loss_of(ref_out) / world_size).backward()
        _sgd(ref, "embeddings")
    full = gather_full_state_dict(sharded.state_dict())
    for name, emb in ref.embeddings.items():
        errors["tables"] = max(errors["tables"], max_abs(full[f"embeddings.{name}.weight"] - emb.weight.detach()))
    return errors


def _custom_splits_body(rank: int, world_size: int) -> dict[str, dict[str, float]]:
    results = {}
    for split in ("uneven", "mirrored"):
        for weighted, sizes in ((False, [3, 2]), (True, [2, 4]), (True, [3, 0])):
            results[f"ebc/{split}/weighted={weighted}/batches={sizes}"] = _pooled_case(
                rank, world_size, split, weighted, sizes
            )
        for sizes in ([3, 2], [0, 3]):
            results[f"ec/{split}/batches={sizes}"] = _sequence_case(rank, world_size, split, sizes)
    return results


def _failures(per_rank: list[dict[str, dict[str, float]]]) -> list[str]:
    return [
        f"rank {rank} {case}: {what} differs by {err:.3g}"
        for rank, results in enumerate(per_rank)
        for case, errs in results.items()
        for what, err in errs.items()
        if not err <= TOL
    ]


def test_row_wise_plan_splits_and_per_table_optimizers_match_unsharded() -> None:
    per_rank = run_ranks(_custom_splits_body, WORLD, timeout=240)
    failures = _failures(per_rank)
    assert not failures, "\n".join(failures)


def _vbe_weighted_batch(rank: int, step: int) -> Any:
    """A weighted variable-batch KJT: ``a1``/``b`` once per user, ``a2``/``c`` per impression."""
    from lightrec.sparse import KeyedJaggedTensor

    g = torch.Generator().manual_seed(50 * rank + step)
    users, impressions = 2 + rank, 3 + 2 * rank
    keys = ["c", "a1", "b", "a2"]
    rows = {"a1": 13, "a2": 13, "b": 5, "c": 11}
    batch = {"a1": users, "b": users, "a2": impressions, "c": impressions}
    lengths = [torch.randint(0, 4, (batch[k],), generator=g) for k in keys]
    values = [torch.randint(0, rows[k], (int(n.sum()),), generator=g) for k, n in zip(keys, lengths, strict=True)]
    weights = torch.rand(int(sum(int(n.sum()) for n in lengths)), generator=g) + 0.5
    user_of = torch.randint(0, users, (impressions,), generator=g)
    inverse = torch.stack([user_of if batch[k] == users else torch.arange(impressions) for k in keys])
    return KeyedJaggedTensor(
        keys=keys, values=torch.cat(values), weights=weights, lengths=torch.cat(lengths),
        stride_per_key_per_rank=[[batch[k]] for k in keys], inverse_indices=(keys, inverse),
    )  # fmt: skip


def _vbe_weighted_body(rank: int, world_size: int) -> dict[str, dict[str, float]]:
    """Weighted variable-batch KJTs through row-wise MEAN tables split by the plan."""
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, ShardingEnv, gather_full_state_dict
    from lightrec.distributed.planner import construct_module_sharding_plan
    from lightrec.modules.embedding_modules import EmbeddingBagCollection

    results = {}
    for split in ("uneven", "mirrored"):
        torch.manual_seed(8)
        ref = EmbeddingBagCollection(_configs(True), is_weighted=True)
        _mark_optimizers(ref, "embedding_bags")
        plan = construct_module_sharding_plan(ref, _generators(split), world_size=world_size)
        env = ShardingEnv.from_process_group(dist.group.WORLD)
        sharded = EmbeddingBagCollectionSharder().shard(ref, plan, env, torch.device("cpu"))
        errors = {"forward": 0.0, "tables": 0.0}
        for step in range(STEPS):
            out = sharded(_vbe_weighted_batch(rank, step)).wait()
            ref_outs = [ref(_vbe_weighted_batch(r, step)) for r in range(world_size)]
            errors["forward"] = max(errors["forward"], max_abs(out.values().detach() - ref_outs[rank].values()))
            out.values().square().sum(1).mean().backward()
            (sum(o.values().square().sum(1).mean() for o in ref_outs) / world_size).backward()
            _sgd(ref, "embedding_bags")
        full = gather_full_state_dict(sharded.state_dict())
        for name, bag in ref.embedding_bags.items():
            errors["tables"] = max(errors["tables"], max_abs(full[f"embedding_bags.{name}.weight"] - bag.weight.detach()))
        results[f"vbe/{split}"] = errors
    return results


def test_weighted_variable_batch_through_row_wise_mean_tables_matches_unsharded() -> None:
    per_rank = run_ranks(_vbe_weighted_body, WORLD, timeout=240)
    failures = _failures(per_rank)
    assert not failures, "\n".join(failures)


def _overlapping_column_shards_body(rank: int, world_size: int) -> list[str]:
    """Two column shards over the same columns (the others served by none) are refused, for EBC and EC."""
    import pytest
    import torch.distributed as dist

    from lightrec.distributed import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder, ShardingEnv
    from lightrec.distributed.planner import column_wise, construct_module_sharding_plan, table_column_wise
    from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
    from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    env = ShardingEnv.from_process_group(dist.group.WORLD)
    messages = []
    modules = [
        (EmbeddingBagCollection([EmbeddingBagConfig(num_embeddings=5, embedding_dim=8, name="T", feature_names=["t"])]),
         EmbeddingBagCollectionSharder()),
        (EmbeddingCollection([EmbeddingConfig(num_embeddings=5, embedding_dim=8, name="T", feature_names=["t"])]),
         EmbeddingCollectionSharder()),
    ]  # fmt: skip
    for module, sharder in modules:
        for gen in (column_wise(ranks=[0, 1]), table_column_wise(host_index=0)):
            plan = construct_module_sharding_plan(module, {"T": gen}, world_size=world_size)
            plan["T"].sharding_spec[1].shard_offsets[1] = 0  # columns 0-3 twice, 4-7 never
            with pytest.raises(ValueError, match=r"table 'T' do not tile its \[5, 8\] weight") as e:
                sharder.shard(module, plan, env, torch.device("cpu"))
            messages.append(str(e.value))
    return messages


def test_overlapping_column_shards_are_refused() -> None:
    for messages in run_ranks(_overlapping_column_shards_body, WORLD, timeout=120):
        assert len(messages) == 4
