"""Sharded checkpoints on real gloo ranks: save on 2 ranks, resume on 2, 3 and 1.

A DLRM with a mixed plan (row-wise, data-parallel, table-wise, two column shards) trains with
fused row-wise Adagrad for the tables, Adagrad for the dense layers and a warm-up LR schedule on
the combined optimizer. After step ``SAVE_AT`` every rank writes its shards; the run goes on. A
fresh model (tables on ``meta``) then loads the checkpoint and trains the remaining steps:

* same world size and plan: the losses are bit-identical to the uninterrupted run;
* 3 ranks and another plan (tables moved between ranks, row-wise <-> table-wise), and 1 rank from
  the consolidated file: equal within float tolerance (the global batch is the same, only the
  order of the sums differs). Column shards keep their column blocks in these plans: a row-wise
  accumulator of a column shard is per block (docs/sharding.md), see test_blocks for the merge rule.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from tests.distributed.test_dmp import DIM, _batch, _dlrm, _sharders, _slice, _tables
from tests.multiprocess import run_ranks

STEPS, SAVE_AT, GLOBAL_BATCH = 6, 3, 12


def _plan(world_size: int) -> Any:
    from lightrec.distributed import ShardingPlan
    from lightrec.distributed.planner import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )  # fmt: skip

    if world_size == 2:
        gens = {"t0": row_wise(), "t1": data_parallel(), "t2": table_wise(rank=1), "t3": column_wise(ranks=[1, 0])}
    elif world_size == 3:
        gens = {"t0": table_wise(rank=1), "t1": row_wise(), "t2": row_wise(), "t3": column_wise(ranks=[2, 0])}
    else:
        gens = {"t0": row_wise(), "t1": data_parallel(), "t2": table_wise(rank=0), "t3": column_wise(ranks=[0, 0])}
    module_plan = construct_module_sharding_plan(_tables("meta"), gens, world_size=world_size)
    return ShardingPlan({"sparse_arch.embedding_bag_collection": module_plan})


def _build(world_size: int) -> tuple[Any, Any, Any]:
    from lightrec.distributed import DistributedModelParallel
    from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, in_backward_optimizer_filter

    model = DistributedModelParallel(_dlrm("meta"), device="cpu", plan=_plan(world_size), sharders=_sharders())
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    optimizer = CombinedOptimizer(
        [("sparse", model.fused_optimizer), ("dense", KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adagrad(ps, lr=0.05)))]
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    return model, optimizer, scheduler


def _step(model: Any, optimizer: Any, scheduler: Any, step: int, rank: int, world_size: int) -> float:
    import torch.distributed as dist

    per_rank = GLOBAL_BATCH // world_size
    x, kjt, y = _batch(step, GLOBAL_BATCH)
    lo = rank * per_rank
    logits = model(x[lo : lo + per_rank], _slice(kjt, lo, per_rank)).squeeze(1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y[lo : lo + per_rank])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return (total / world_size).item()


def _save_body(rank: int, world_size: int, path: str) -> dict[str, Any]:
    from lightrec.distributed.checkpoint import CheckpointError, save_sharded_checkpoint

    model, optimizer, scheduler = _build(world_size)
    losses, out = [], {}
    for step in range(STEPS):
        if step == SAVE_AT:
            ckpt = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()],
                    "lr_schedulers": [scheduler.state_dict()], "global_step": step}  # fmt: skip
            save_sharded_checkpoint(path, ckpt, model, [optimizer], [scheduler])
            out["saved_full"] = model.gather_full_state_dict(dst=0)
            x, kjt, _ = _batch(99, GLOBAL_BATCH)
            out["full_batch"] = (x, kjt)
            # A save that fails on one rank raises on every rank and leaves the checkpoint as it was.
            before = sorted(os.listdir(path)), os.path.getmtime(os.path.join(path, "meta.pt"))
            real_save = torch.save

            def failing_save(obj: Any, f: Any, *a: Any, real_save: Any = real_save, **k: Any) -> None:
                if rank == 1:
                    raise OSError("disk full (injected)")
                real_save(obj, f, *a, **k)

            torch.save = failing_save  # type: ignore[assignment]
            try:
                save_sharded_checkpoint(path, ckpt, model, [optimizer], [scheduler])
            except CheckpointError as e:
                out["failed_save"] = str(e)
            finally:
                torch.save = real_save  # type: ignore[assignment]
            after = sorted(os.listdir(path)), os.path.getmtime(os.path.join(path, "meta.pt"))
            out["unchanged"] = before == after
            out["leftovers"] = sorted(n for n in os.listdir(os.path.dirname(path)) if ".tmp-" in n)
        losses.append(_step(model, optimizer, scheduler, step, rank, world_size))
    out["losses"] = losses
    return out


def _resume_body(rank: int, world_size: int, path: str) -> dict[str, Any]:
    from lightrec.distributed.checkpoint import load_sharded_checkpoint

    model, optimizer, scheduler = _build(world_size)
    ckpt = load_sharded_checkpoint(path, model, [optimizer])
    model.load_state_dict(ckpt["state_dict"])
    optimizer.load_state_dict(ckpt["optimizer_states"][0])
    scheduler.load_state_dict(ckpt["lr_schedulers"][0])
    assert ckpt["global_step"] == SAVE_AT
    return {"losses": [_step(model, optimizer, scheduler, s, rank, world_size) for s in range(SAVE_AT, STEPS)]}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: Any) -> dict[str, Any]:
    path = str(tmp_path_factory.mktemp("ckpt") / "step=3.ckpt")
    results = run_ranks(_save_body, 2, args=(path,), timeout=180)
    return {"path": path, "ranks": results}


def test_failed_save_raises_on_every_rank_and_keeps_the_old_checkpoint(saved: dict[str, Any]) -> None:
    for r in saved["ranks"]:
        assert "rank 1: OSError: disk full (injected)" in r["failed_save"]
        assert r["unchanged"] and r["leftovers"] == []
    assert sorted(os.listdir(saved["path"])) == ["manifest.json", "meta.pt", "shards-rank00000.pt", "shards-rank00001.pt"]


def test_resume_on_same_ranks_is_bit_identical(saved: dict[str, Any]) -> None:
    resumed = run_ranks(_resume_body, 2, args=(saved["path"],), timeout=180)
    assert resumed[0]["losses"] == saved["ranks"][0]["losses"][SAVE_AT:]


def test_resume_on_three_ranks_with_another_plan(saved: dict[str, Any]) -> None:
    resumed = run_ranks(_resume_body, 3, args=(saved["path"],), timeout=180)
    assert resumed[0]["losses"] == pytest.approx(saved["ranks"][0]["losses"][SAVE_AT:], rel=1e-5, abs=1e-6)


def test_consolidated_file_loads_unsharded_and_resumes_on_one_rank(saved: dict[str, Any], tmp_path: Any) -> None:
    from lightrec.distributed.checkpoint import consolidate_checkpoint

    out = str(tmp_path / "full.ckpt")
    full = consolidate_checkpoint(saved["path"], out)
    expected = saved["ranks"][0]["saved_full"]
    assert set(full["state_dict"]) == set(expected)
    for key, value in expected.items():
        assert torch.equal(full["state_dict"][key], value), key
    # The unsharded model loads the plain state dict (strict) and computes what the sharded one did.
    plain = _dlrm("cpu")
    plain.load_state_dict(torch.load(out, weights_only=False)["state_dict"])
    assert plain.sparse_arch.embedding_bag_collection.embedding_bags["t0"].weight.shape == (29, DIM)
    resumed = run_ranks(_resume_body, 1, args=(out,), timeout=180)
    assert resumed[0]["losses"] == pytest.approx(saved["ranks"][0]["losses"][SAVE_AT:], rel=1e-5, abs=1e-6)


def test_incomplete_checkpoint_is_rejected_before_anything_changes(saved: dict[str, Any], tmp_path: Any) -> None:
    import shutil

    from lightrec.distributed.checkpoint import CheckpointError, open_checkpoint

    broken = tmp_path / "broken.ckpt"
    shutil.copytree(saved["path"], broken)
    os.remove(broken / "shards-rank00001.pt")
    with pytest.raises(CheckpointError, match=r"written by 2 ranks but holds 1 shard files.*shards-rank00001"):
        open_checkpoint(broken)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_checkpoint(tmp_path / "nothing.ckpt")


def _snapshot(model: Any, optimizer: Any) -> dict[str, torch.Tensor]:
    from lightrec.distributed.sharding.state_dict import ShardedTableState

    out = {}
    for k, v in model.state_dict().items():
        out[k] = (v.full_tensor_local() if isinstance(v, ShardedTableState) else v).detach().clone()
    for n, p in optimizer.params.items():
        for k, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                out[f"optim {n}.{k}"] = v.detach().clone()
    return out


def _misfit_body(rank: int, world_size: int, path: str, case: str) -> dict[str, Any]:
    """Load ``path`` into a model or optimizer it does not fit, the documented way (load, then
    apply): every rank must raise CheckpointError and nothing may change."""
    from lightrec.distributed import DistributedModelParallel, EmbeddingBagCollectionSharder, ShardingPlan
    from lightrec.distributed.checkpoint import CheckpointError, load_sharded_checkpoint
    from lightrec.distributed.planner import construct_module_sharding_plan, table_wise
    from lightrec.models import DLRM
    from lightrec.modules.embedding_configs import EmbeddingBagConfig
    from lightrec.modules.embedding_modules import EmbeddingBagCollection
    from lightrec.optim import (
        CombinedOptimizer,
        EmbOptimType,
        KeyedOptimizerWrapper,
        in_backward_optimizer_filter,
    )

    tables, over, optim = _tables("meta"), [8, 1], EmbOptimType.EXACT_ROWWISE_ADAGRAD
    if case == "missing table":
        configs = [*tables.embedding_bag_configs(),
                   EmbeddingBagConfig(num_embeddings=3, embedding_dim=DIM, name="t9", feature_names=["f9"])]  # fmt: skip
        tables = EmbeddingBagCollection(configs, device="meta")
    elif case == "dense shape":
        over = [9, 1]
    else:  # "optimizer": per-element Adagrad state where the checkpoint has row-wise Adagrad's per-row state
        optim = EmbOptimType.EXACT_ADAGRAD
    torch.manual_seed(1)
    model = DLRM(tables, dense_in_features=3, dense_arch_layer_sizes=[16, DIM], over_arch_layer_sizes=over)
    # Every table on the last rank: rank 0 holds no shard, so only the last rank can see an
    # optimizer mismatch -- rank 0 must raise all the same (never be left waiting in a collective).
    gens = {c.name: table_wise(rank=world_size - 1) for c in tables.embedding_bag_configs()}
    plan = ShardingPlan({"sparse_arch.embedding_bag_collection": construct_module_sharding_plan(tables, gens, world_size=world_size)})
    sharders = [EmbeddingBagCollectionSharder({"optimizer": optim, "learning_rate": 0.1})]
    dmp = DistributedModelParallel(model, device="cpu", plan=plan, sharders=sharders)
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    optimizer = CombinedOptimizer(
        [("sparse", dmp.fused_optimizer), ("dense", KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adagrad(ps, lr=0.05)))]
    )
    optimizer.init_state()
    before = _snapshot(dmp, optimizer)
    out: dict[str, Any] = {}
    try:
        ckpt = load_sharded_checkpoint(path, dmp, [optimizer])
        out["returned"] = True
        dmp.load_state_dict(ckpt["state_dict"])
        optimizer.load_state_dict(ckpt["optimizer_states"][0])
    except CheckpointError as e:
        out["error"] = str(e)
    except Exception as e:  # noqa: BLE001 -- an untyped error is what the test rejects
        out["untyped"] = f"{type(e).__name__}: {e}"
    after = _snapshot(dmp, optimizer)
    out["changed"] = sorted(k for k in before if not torch.equal(before[k], after[k]))
    return out


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing table", r"the model has keys \['sparse_arch\.embedding_bag_collection\.embedding_bags\.t9\.weight'\] "
                          r"that the checkpoint lacks.*nothing was loaded.*strict=False"),
        pytest.param("dense shape", r"shapes differ: 'over_arch\.model\.0\._mlp\.0\._linear\.bias' is \[8\] in the "
                     r"checkpoint but \[9\] in the model", marks=pytest.mark.slow),  # 2 gloo ranks, ~4 s each
        pytest.param("optimizer", r"rank 1: CheckpointError: checkpoint .*step=3\.ckpt.*state 'momentum1' of "
                     r"'sparse_arch\.embedding_bag_collection\.embedding_bags\.t\d\.weight' is per row in the "
                     r"checkpoint but per element here.*nothing was loaded", marks=pytest.mark.slow),
    ],
)  # fmt: skip
def test_checkpoint_that_does_not_fit_fails_on_every_rank_before_anything_changes(
    saved: dict[str, Any], case: str, message: str
) -> None:
    import re

    results = run_ranks(_misfit_body, 2, args=(saved["path"], case), timeout=180)
    for rank, r in enumerate(results):
        assert "untyped" not in r and "returned" not in r, (rank, r)
        assert re.search(message, r["error"]), (rank, r["error"])
        assert saved["path"] in r["error"], r["error"]
        assert r["changed"] == [], (rank, r["changed"])
