"""RecStrategy on real gloo ranks: Trainer.fit of a sharded DLRM RecModule.

The ranks are started by tests/multiprocess.py with the torchrun environment variables set, so
Lightning takes the "processes created externally" path (as under torchrun or SLURM) and
RecStrategy reuses the already-initialised process group.
"""

from __future__ import annotations

import pytest

from tests.multiprocess import free_port, run_ranks, set_torchrun_env

STEPS = 4


def mixed_plan(world_size: int, device_type: str = "cpu"):  # noqa: ANN201
    """Row-wise, data-parallel and table-wise tables in turn (for the toy DLRM of tests/lightning/toy.py)."""
    from lightrec.distributed.planner import (
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )
    from lightrec.distributed.types import ShardingPlan
    from tests.lightning.toy import ToyDLRM

    module = ToyDLRM(device="meta")
    ebc = module.model.sparse_arch.embedding_bag_collection
    # (column-wise shards keep their own row-wise Adagrad state, so they are compared with SGD
    # in tests/distributed; row-wise Adagrad is exact under RW, TW and DP)
    kinds = [row_wise(), data_parallel(), table_wise(rank=world_size - 1)]
    per_table = {t.name: kinds[i % 3] for i, t in enumerate(ebc.embedding_bag_configs())}
    return ShardingPlan({
        "model.sparse_arch.embedding_bag_collection": construct_module_sharding_plan(
            ebc, per_table, world_size=world_size, local_size=world_size, device_type=device_type)
    })  # fmt: skip


def _fit_losses(rank: int, world_size: int, port: int, plan_kind: str, tmp: str) -> dict:
    set_torchrun_env(rank, world_size, port)
    import lightning.pytorch as pl
    import torch

    from lightrec.lightning import RecStrategy
    from tests.lightning.toy import ToyDLRM, toy_data

    losses: list[float] = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            losses.append(float(outputs["loss"]))

    plan = mixed_plan(world_size) if plan_kind == "mixed" else None
    data = toy_data(batch_size=64 // world_size, num_train_batches=STEPS * world_size, block_size=32)
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, max_steps=STEPS, num_sanity_val_steps=0, limit_val_batches=0,
        strategy=RecStrategy(plan=plan, fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1}),
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Record()], default_root_dir=tmp,
    )  # fmt: skip
    module = ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1)
    trainer.fit(module, datamodule=data)
    # the global loss of a step is the mean of the ranks' local losses (equal local batch sizes)
    t = torch.tensor(losses)
    torch.distributed.all_reduce(t)
    return {"losses": (t / world_size).tolist(), "plan": str(trainer.strategy.plan)}


# "planner" (15 s) runs with -m slow; the default suite keeps the mixed hand-written plan (the
# planner's plans are trained on 2 ranks by tests/test_cli.py's main job too)
@pytest.mark.parametrize("plan_kind", [pytest.param("planner", marks=pytest.mark.slow), "mixed"])
def test_two_ranks_match_one_rank(tmp_path, plan_kind: str) -> None:  # noqa: ANN001
    one = run_ranks(_fit_losses, 1, args=(free_port(), "planner", str(tmp_path)), timeout=240)[0]
    two = run_ranks(_fit_losses, 2, args=(free_port(), plan_kind, str(tmp_path)), timeout=240)
    assert two[0]["losses"] == pytest.approx(two[1]["losses"])
    assert len(one["losses"]) == STEPS
    assert two[0]["losses"] == pytest.approx(one["losses"], rel=1e-4, abs=1e-5)
    if plan_kind == "mixed":
        assert "row_wise" in two[0]["plan"] and "data_parallel" in two[0]["plan"]
