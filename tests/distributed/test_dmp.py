"""DistributedModelParallel on real gloo ranks.

* A DLRM with mixed sharding types (row-wise, data-parallel, table-wise, column-wise) trains on 2
  ranks with the same per-rank losses as one process training on the concatenated batches
  (dense part: DDP + SGD; embeddings: fused row-wise Adagrad vs a hand-written reference).
* Resharding: a model sharded on 2 ranks is saved as full tables; 1 rank (planner's plan) and 3
  ranks (another hand-written plan) load it and give the same outputs. Along the way: tables
  created on ``meta`` get the same initial values whatever the plan and world size.
* Semantics: sharding a materialised module keeps its weights; ``state_dict`` keys equal the
  unsharded model's; the sharded state dict round-trips through ``torch.save``/``torch.load``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from tests.distributed.test_sharded_embeddings import reference_update
from tests.multiprocess import run_ranks

DIM = 8
LR = 0.1


def _tables(device: str) -> Any:
    from lightrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from lightrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(num_embeddings=29, embedding_dim=DIM, name="t0", feature_names=["f0", "f1"]),
        EmbeddingBagConfig(
            num_embeddings=5, embedding_dim=DIM, name="t1", feature_names=["f2"], pooling=PoolingType.MEAN
        ),
        EmbeddingBagConfig(num_embeddings=17, embedding_dim=DIM, name="t2", feature_names=["f3"]),
        EmbeddingBagConfig(num_embeddings=2, embedding_dim=DIM, name="t3", feature_names=["f4"]),
    ]
    return EmbeddingBagCollection(configs, device=device)


def _dlrm(device: str) -> Any:
    from lightrec.models import DLRM

    torch.manual_seed(0)
    return DLRM(
        _tables(device), dense_in_features=3, dense_arch_layer_sizes=[16, DIM], over_arch_layer_sizes=[8, 1]
    )


def _batch(step: int, num_samples: int) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """The global batch of a step: dense [N, 3], KJT (N samples), labels [N]."""
    from lightrec.sparse import KeyedJaggedTensor

    rows = [29, 29, 5, 17, 2]
    g = torch.Generator().manual_seed(100 + step)
    lengths = torch.randint(0, 3, (5, num_samples), generator=g)
    values = torch.cat([torch.randint(0, rows[k], (int(lengths[k].sum()),), generator=g) for k in range(5)])
    kjt = KeyedJaggedTensor(
        [f"f{k}" for k in range(5)], values, lengths=lengths.reshape(-1), stride=num_samples
    )
    return (
        torch.randn(num_samples, 3, generator=g),
        kjt,
        torch.randint(0, 2, (num_samples,), generator=g).float(),
    )


def _rank_loss(model: Any, step: int, rank: int, world_size: int, batch: int) -> tuple[torch.Tensor, Any]:
    """``(loss of model on this rank's `batch` samples of step's global batch, the global batch (x, kjt, y))``."""
    x, kjt, y = _batch(step, batch * world_size)
    lo = rank * batch
    logits = model(x[lo : lo + batch], _slice(kjt, lo, batch)).squeeze(1)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, y[lo : lo + batch]), (x, kjt, y)


def _slice(kjt: Any, start: int, size: int) -> Any:
    """Samples ``[start, start + size)`` of a KJT."""
    from lightrec.sparse import KeyedJaggedTensor

    jts = kjt.to_dict()
    lengths = torch.cat([jts[k].lengths()[start : start + size] for k in kjt.keys()])
    values = torch.cat(
        [
            jts[k].values()[int(jts[k].lengths()[:start].sum()) :][
                : int(jts[k].lengths()[start : start + size].sum())
            ]
            for k in kjt.keys()
        ]
    )
    return KeyedJaggedTensor(kjt.keys(), values, lengths=lengths, stride=size)


def _mixed_plan(world_size: int) -> Any:
    from lightrec.distributed import ShardingPlan
    from lightrec.distributed.planner import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )

    ebc = _tables("meta")
    gens = {"t0": row_wise(), "t1": data_parallel(), "t2": table_wise(rank=world_size - 1),
            "t3": column_wise(ranks=list(range(world_size))[::-1])}  # fmt: skip
    return ShardingPlan(
        {
            "sparse_arch.embedding_bag_collection": construct_module_sharding_plan(
                ebc, gens, world_size=world_size
            )
        }
    )


def _sharders() -> list[Any]:
    from lightrec.distributed import EmbeddingBagCollectionSharder
    from lightrec.optim import EmbOptimType

    return [
        EmbeddingBagCollectionSharder({"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR})
    ]


def _train_body(rank: int, world_size: int) -> dict[str, Any]:
    import copy

    from lightrec.distributed import DistributedModelParallel
    from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter

    batch = 4
    reference = _dlrm("cpu")
    model = DistributedModelParallel(
        copy.deepcopy(reference), device="cpu", plan=_mixed_plan(world_size), sharders=_sharders()
    )
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    optimizer = CombinedOptimizer(
        [model.fused_optimizer, KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=LR))]
    )
    ref_opt = torch.optim.SGD(
        [p for n, p in reference.named_parameters() if "embedding_bags" not in n], lr=LR
    )
    bce = torch.nn.BCEWithLogitsLoss()
    losses, ref_losses, states = [], [], {}
    for step in range(4):
        loss, (x, kjt, y) = _rank_loss(model, step, rank, world_size, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        logits = reference(x, kjt).squeeze(1)
        per_rank = [
            bce(logits[r * batch : (r + 1) * batch], y[r * batch : (r + 1) * batch])
            for r in range(world_size)
        ]
        ref_losses.append(per_rank[rank].item())
        ref_opt.zero_grad()
        reference.sparse_arch.embedding_bag_collection.zero_grad()
        (sum(per_rank) / world_size).backward()
        ref_opt.step()
        for name, bag in reference.sparse_arch.embedding_bag_collection.embedding_bags.items():
            blocks = [(0, 4), (4, 8)] if name == "t3" else [(0, DIM)]  # t3: two column shards (2 ranks)
            reference_update(
                bag.weight, bag.weight.grad, states.setdefault(name, {}), "rowwise_adagrad", blocks
            )
    full = model.gather_full_state_dict()
    ref_sd = reference.state_dict()
    assert set(full) == set(ref_sd), (sorted(full), sorted(ref_sd))
    table_err = max((full[k] - ref_sd[k]).abs().max().item() for k in ref_sd)
    return {"losses": losses, "ref_losses": ref_losses, "state_err": table_err}


def test_dlrm_mixed_sharding_trains_like_one_process() -> None:
    results = run_ranks(_train_body, 2, timeout=180)
    for rank, r in enumerate(results):
        assert r["losses"] == pytest.approx(r["ref_losses"], abs=1e-5), f"rank {rank}"
        assert r["state_err"] < 1e-5, f"rank {rank}: parameters differ by {r['state_err']}"
    assert results[0]["losses"] != results[1]["losses"]  # ranks really saw different samples


# ---------------------------------------------------------------------------------------------
# Save on 2 ranks, load on 1 and 3


def _outputs(model: Any, rank: int, world_size: int, num_samples: int) -> torch.Tensor:
    per_rank = num_samples // world_size
    x, kjt, _ = _batch(99, num_samples)
    lo = rank * per_rank
    with torch.no_grad():
        return model(x[lo : lo + per_rank], _slice(kjt, lo, per_rank)).squeeze(1)


def _reshard_body(rank: int, world_size: int, path: str, mode: str) -> dict[str, Any]:
    import torch.distributed as dist

    from lightrec.distributed import DistributedModelParallel, ShardedTableState

    plan = None if world_size == 1 else _mixed_plan(world_size)
    if world_size == 3:  # another plan: everything row-wise except one table-wise table
        from lightrec.distributed import ShardingPlan
        from lightrec.distributed.planner import construct_module_sharding_plan, row_wise, table_wise

        gens = {"t0": table_wise(rank=1), "t1": row_wise(), "t2": row_wise(), "t3": row_wise()}
        plan = ShardingPlan(
            {
                "sparse_arch.embedding_bag_collection": construct_module_sharding_plan(
                    _tables("meta"), gens, world_size=3
                )
            }
        )
    model = DistributedModelParallel(_dlrm("meta"), device="cpu", plan=plan, sharders=_sharders())
    initial = model.gather_full_state_dict(dst=0)
    out: dict[str, Any] = {"initial": {k: v for k, v in initial.items() if "embedding_bags" in k}}
    sd = model.state_dict()
    value = sd["sparse_arch.embedding_bag_collection.embedding_bags.t0.weight"]
    out["t0_is_sharded"] = isinstance(value, ShardedTableState)
    if mode == "save":
        model.train()
        x, kjt, y = _batch(7, 4 * world_size)
        loss = model(x[4 * rank : 4 * rank + 4], _slice(kjt, 4 * rank, 4)).sum()
        loss.backward()  # fused update: the saved tables differ from their initial values
        full = model.gather_full_state_dict(dst=0)
        if rank == 0:
            torch.save(full, path)
        # The sharded state dict itself round-trips through torch.save (weights_only) on the same plan.
        own = os.path.join(os.path.dirname(path), f"rank{rank}.pt")
        torch.save(model.state_dict(), own)
        model.load_state_dict(torch.load(own))
    else:
        model.load_state_dict(torch.load(path))
    dist.barrier()
    out["outputs"] = _outputs(model, rank, world_size, 6)
    return out


# Loading on 3 ranks (10 s) runs with -m slow; loading on one keeps the reshard in the default run.
@pytest.mark.parametrize("load_world_size", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_save_on_two_ranks_load_on_other_world_size(tmp_path: Any, load_world_size: int) -> None:
    """1 rank: the planner's plan (everything table-wise); 3 ranks: a row-wise/table-wise plan."""
    path = str(tmp_path / "full.pt")
    saved = run_ranks(_reshard_body, 2, args=(path, "save"), timeout=180)
    loaded = run_ranks(_reshard_body, load_world_size, args=(path, "load"), timeout=180)
    expected = torch.cat([r["outputs"] for r in saved])
    assert torch.allclose(torch.cat([r["outputs"] for r in loaded]), expected, atol=1e-6)
    # meta tables start identical whatever the world size and plan (seeded per table and row chunk)
    for key, value in saved[0]["initial"].items():
        assert torch.equal(value, loaded[0]["initial"][key]), key
    assert saved[1]["initial"] == {}  # gathered on rank 0 only
    assert all(r["t0_is_sharded"] for r in saved)  # t0 is row-wise there (the planner may replicate it)


# ---------------------------------------------------------------------------------------------
# Pieces that need no process group


def test_balanced_table_wise_plan_is_contiguous_and_balanced() -> None:
    """The fallback plan (planner not importable) keeps tables in order, so no output permute."""
    from lightrec.distributed import balanced_table_wise_plan, get_default_sharders
    from lightrec.modules.embedding_configs import EmbeddingBagConfig
    from lightrec.modules.embedding_modules import EmbeddingBagCollection

    sizes = [100, 100, 100, 100, 400, 100, 100]
    ebc = EmbeddingBagCollection(
        [
            EmbeddingBagConfig(num_embeddings=n, embedding_dim=4, name=f"t{i}", feature_names=[f"f{i}"])
            for i, n in enumerate(sizes)
        ],
        device="meta",
    )
    plan = balanced_table_wise_plan(ebc, get_default_sharders(), world_size=3)
    ranks = [ps.ranks[0] for ps in plan.plan[""].values()]
    assert ranks == sorted(ranks) and set(ranks) == {0, 1, 2}
    load = [sum(n for n, r in zip(sizes, ranks) if r == k) for k in range(3)]
    assert max(load) <= 500 and min(load) >= 200, load
    assert all(ps.sharding_type == "table_wise" for ps in plan.plan[""].values())


def test_sharding_without_process_group_says_what_to_do() -> None:
    import torch.distributed as dist

    from lightrec.distributed import DistributedModelParallel

    if dist.is_initialized():
        pytest.skip("a process group exists in this test process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedModelParallel(_tables("meta"))
    with pytest.raises(TypeError, match="nn.Module"):
        DistributedModelParallel("not a module")  # type: ignore[arg-type]


def _wrong_path_body(rank: int, world_size: int) -> str:
    from lightrec.distributed import DistributedModelParallel

    plan = _mixed_plan(1)
    plan.plan["model.sparse_arch.embedding_bag_collection"] = plan.plan.pop("sparse_arch.embedding_bag_collection")
    try:
        DistributedModelParallel(_dlrm("meta"), device="cpu", plan=plan, sharders=_sharders())
    except ValueError as e:
        return str(e)
    return "no error"


def test_plan_paths_that_match_no_module_are_an_error() -> None:
    """A plan written for another root (e.g. the LightningModule) must not silently shard nothing."""
    message = run_ranks(_wrong_path_body, 1, timeout=120)[0]
    assert "['model.sparse_arch.embedding_bag_collection'] that are not shardable" in message
    assert "['sparse_arch.embedding_bag_collection']" in message
