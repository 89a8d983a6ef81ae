"""Save on 2 ranks with one plan (row-wise, column-wise, table-wise), load the folder -- and the file
``consolidate_checkpoint`` makes of it -- on 1 or 2 ranks with another plan: every table element
and every fused optimizer state (row-wise Adagrad's per-row ``momentum1``, Adam's moments and
step) must come back exactly. Column shards keep their column blocks across the plans (a row-wise
accumulator of a column shard is per block, see test_checkpoint_blocks for the merge rule)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.distributed.test_dmp import _batch, _dlrm, _slice, _tables
from tests.multiprocess import run_ranks

OPTIMS = ("row_wise_adagrad", "adam")


def _plan(world_size: int, variant: str) -> Any:
    from lightrec.distributed import ShardingPlan
    from lightrec.distributed.planner import column_wise, construct_module_sharding_plan, row_wise, table_wise

    if variant == "save":
        gens = {"t0": row_wise(), "t1": column_wise(ranks=[0, 1]), "t2": table_wise(rank=1), "t3": row_wise()}
    elif world_size == 2:
        gens = {
            "t0": table_wise(rank=1),
            "t1": column_wise(ranks=[1, 0]),
            "t2": row_wise(),
            "t3": table_wise(rank=0),
        }
    else:
        gens = {"t0": table_wise(rank=0), "t1": column_wise(ranks=[0, 0]), "t2": row_wise(), "t3": row_wise()}
    return ShardingPlan(
        {
            "sparse_arch.embedding_bag_collection": construct_module_sharding_plan(
                _tables("meta"), gens, world_size=world_size
            )
        }
    )


def _build(world_size: int, variant: str, optim: str) -> tuple[Any, Any]:
    from lightrec.distributed import DistributedModelParallel, EmbeddingBagCollectionSharder
    from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter

    sharders = [EmbeddingBagCollectionSharder({"optimizer": optim, "learning_rate": 0.1})]
    model = DistributedModelParallel(
        _dlrm("meta"), device="cpu", plan=_plan(world_size, variant), sharders=sharders
    )
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    optimizer = CombinedOptimizer(
        [
            ("sparse", model.fused_optimizer),
            ("dense", KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adam(ps, lr=0.05))),
        ]
    )
    return model, optimizer


def _shards(model: Any) -> list[tuple[str, list[int], list[int], dict[str, torch.Tensor]]]:
    from lightrec.distributed.checkpoint.index import local_tables

    out = []
    states = model.fused_optimizer.state
    for key, table in local_tables(model).items():
        for meta, p in table.shards:
            entry = {"weight": p.detach().clone()}
            for name, v in states.get(p, {}).items():
                entry[name] = torch.as_tensor(v).detach().clone()
            out.append((key, list(meta.shard_offsets), list(meta.shard_sizes), entry))
    return out


def _save_body(rank: int, world_size: int, root: str) -> dict[str, Any]:
    from lightrec.distributed.checkpoint import save_sharded_checkpoint

    out = {}
    for optim in OPTIMS:
        model, optimizer = _build(world_size, "save", optim)
        for step in range(2):
            x, kjt, y = _batch(step, 8)
            lo = rank * 4
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(x[lo : lo + 4], _slice(kjt, lo, 4)).squeeze(1), y[lo : lo + 4]
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        ckpt = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()]}
        save_sharded_checkpoint(f"{root}/{optim}.ckpt", ckpt, model, [optimizer])
        out[optim] = {"shards": _shards(model)}
    return out


def _load_body(rank: int, world_size: int, root: str) -> dict[str, Any]:
    from lightrec.distributed.checkpoint import load_sharded_checkpoint

    out = {}
    for optim, source in [(o, f"{root}/{o}.ckpt") for o in OPTIMS] + [("adam", f"{root}/adam-full.ckpt")]:
        model, optimizer = _build(world_size, "load", optim)
        ckpt = load_sharded_checkpoint(source, model, [optimizer])
        model.load_state_dict(ckpt["state_dict"])
        optimizer.load_state_dict(ckpt["optimizer_states"][0])
        out[source] = (optim, _shards(model))
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> dict[str, Any]:
    from lightrec.distributed.checkpoint import consolidate_checkpoint

    root = str(tmp_path_factory.mktemp("review"))
    ranks = run_ranks(_save_body, 2, args=(root,), timeout=180)
    consolidate_checkpoint(f"{root}/adam.ckpt", f"{root}/adam-full.ckpt")
    return {"root": root, "ranks": ranks}


def _expected(ranks: list[dict[str, Any]], optim: str) -> dict[tuple[str, str], torch.Tensor]:
    full: dict[tuple[str, str], torch.Tensor] = {}
    for r in ranks:
        for key, (r0, c0), (nr, nc), entry in r[optim]["shards"]:
            for name, v in entry.items():
                if v.dim() == 0:
                    full[(key, name)] = v
                    continue
                # a row-wise state of a column shard is per column block: keyed by its first column
                slot = (key, name) if v.dim() == 2 else (key, f"{name}@{c0}")
                t = full.setdefault(
                    slot, torch.full((64, 64) if v.dim() == 2 else (64,), float("nan"), dtype=v.dtype)
                )
                if v.dim() == 2:
                    t[r0 : r0 + nr, c0 : c0 + nc] = v
                else:
                    t[r0 : r0 + nr] = v
    return full


@pytest.mark.parametrize("world", [2, 1])
def test_reshard_is_exact(saved: dict[str, Any], world: int) -> None:
    loaded = run_ranks(_load_body, world, args=(saved["root"],), timeout=180)
    for source in loaded[0]:
        optim = loaded[0][source][0]
        full = _expected(saved["ranks"], optim)
        for r in loaded:
            for key, (r0, c0), (nr, nc), entry in r[source][1]:
                for name, v in entry.items():
                    exp = full[(key, name) if v.dim() != 1 else (key, f"{name}@{c0}")]
                    if v.dim() == 2:
                        exp = exp[r0 : r0 + nr, c0 : c0 + nc]
                    elif v.dim() == 1:
                        exp = exp[r0 : r0 + nr]
                    assert torch.equal(v, exp), (source, key, name, r0, c0)
