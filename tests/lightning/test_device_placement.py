"""Device placement of a sharded RecModule: every module kind follows the dense part, sharded
tables stay where the plan put them, across fit -> validate -> test -> predict in one Trainer.

On CPU a misplaced tensor cannot be seen by its device, so these tests check the mechanism:

* ``move_dense_to_device`` to the ``meta`` device (a device every build has) moves torchmetrics
  states (neither parameters nor buffers: the cause of the GPU crash "Encountered different devices
  in metric calculation") and leaves the embedding collections alone;
* on 2 gloo ranks, one Trainer runs fit, validate, test and predict with a fixed mixed plan: the
  sharded collection is the same object with the same tensors and values throughout, the plan is
  unchanged, ``teardown`` never applies a device move to sharded storage nor moves optimizer state
  (spies), and the predictions equal an unsharded model holding the gathered tables.

``tests/lightning/test_gpu_lightning.py`` runs the same path on a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torchmetrics
from torch import nn

from lightrec.distributed.dmp.placement import detached, move_dense_to_device
from lightrec.modules import EmbeddingBagCollection
from tests.lightning.toy import ToyDLRM
from tests.multiprocess import free_port, run_nccl, run_ranks, set_torchrun_env


def _metric_states(module: nn.Module) -> list[torch.Tensor]:
    states = []
    for m in module.modules():
        if isinstance(m, torchmetrics.Metric):
            for value in m.metric_state.values():
                states += value if isinstance(value, list) else [value]
    return states


def test_move_dense_to_device_moves_metric_states_and_keeps_collections() -> None:
    module = ToyDLRM()
    ebc = module.model.sparse_arch.embedding_bag_collection
    tables = dict(ebc.named_parameters())
    assert _metric_states(module)  # the metrics hold tensor states
    assert not list(module.val_metrics.parameters()) and not list(module.val_metrics.buffers())

    move_dense_to_device(module, "meta", keep=(EmbeddingBagCollection,))

    assert module.device.type == "meta"  # LightningModule.device follows its own .to()
    assert all(s.device.type == "meta" for s in _metric_states(module))
    dense = [p for n, p in module.named_parameters() if "embedding_bag_collection" not in n]
    assert dense and all(p.is_meta for p in dense)
    assert dict(ebc.named_parameters()) == tables  # same Parameter objects
    assert all(p.device.type == "cpu" for p in tables.values())


def test_meta_dense_modules_are_materialised_and_meta_collections_kept() -> None:
    module = ToyDLRM(device="meta")  # tables on meta; the dense layers too:
    module.model.dense_arch.to_empty(device="meta")
    move_dense_to_device(module, "cpu", keep=(EmbeddingBagCollection,))
    assert not any(p.is_meta for n, p in module.named_parameters() if "embedding_bag_collection" not in n)
    assert all(p.is_meta for p in module.model.sparse_arch.embedding_bag_collection.parameters())


def test_detached_restores_the_tree_in_order_even_after_an_error() -> None:
    module = ToyDLRM()
    before = [name for name, _ in module.named_modules()]
    with pytest.raises(RuntimeError, match="inside"), detached(module, (EmbeddingBagCollection,)) as taken:
        assert [p for p, _ in taken] == ["model.sparse_arch.embedding_bag_collection"]
        assert not any(isinstance(m, EmbeddingBagCollection) for m in module.modules())
        raise RuntimeError("inside")
    assert [name for name, _ in module.named_modules()] == before


# ---------------------------------------------------------------------------------------------
# One Trainer: fit -> validate -> test -> predict on 2 ranks


def _stages_body(rank: int, world_size: int, port: int, tmp: str, accelerator: str = "cpu") -> dict[str, Any]:
    set_torchrun_env(rank, world_size, port)
    import lightning.pytorch as pl
    import lightning.pytorch.strategies.strategy as strategy_module

    from lightrec.distributed import ShardedEmbeddingBagCollection
    from lightrec.distributed.sharding.collection import ShardedCollectionBase
    from lightrec.distributed.sharding.state_dict import gather_full_state_dict
    from lightrec.lightning import PlanReport, RecStrategy
    from tests.lightning.test_rec_strategy import mixed_plan
    from tests.lightning.toy import toy_data

    moves: list[str] = []  # device moves applied to sharded storage
    original_apply = ShardedCollectionBase._apply

    def spy_apply(self: nn.Module, fn: Any, *args: Any, **kwargs: Any) -> Any:
        moves.append(type(self).__name__)
        return original_apply(self, fn, *args, **kwargs)

    optimizer_moves: list[str] = []
    original_opt_move = strategy_module._optimizers_to_device

    def spy_opt_move(optimizers: Any, device: Any) -> None:
        optimizer_moves.append(str(device))
        original_opt_move(optimizers, device)

    ShardedCollectionBase._apply = spy_apply  # type: ignore[method-assign]
    strategy_module._optimizers_to_device = spy_opt_move  # type: ignore[attr-defined]

    batches: list[Any] = []

    class RecordPredictBatches(pl.Callback):
        def on_predict_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0) -> None:  # noqa: ANN001
            batches.append(batch)

    report = PlanReport(log_chart=False)
    data = toy_data(batch_size=16, num_train_batches=3 * world_size, block_size=16)
    trainer = pl.Trainer(
        accelerator=accelerator, devices=world_size, max_steps=3, limit_val_batches=2, num_sanity_val_steps=0,
        strategy=RecStrategy(plan=mixed_plan(world_size, "cuda" if accelerator == "gpu" else "cpu"),
                             fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1}),
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[RecordPredictBatches(), report], default_root_dir=tmp,
    )  # fmt: skip
    module = ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1)
    trainer.fit(module, datamodule=data)

    sharded = module.model.sparse_arch.embedding_bag_collection
    assert isinstance(sharded, ShardedEmbeddingBagCollection)
    plan = trainer.strategy.plan.to_json()
    tensors = {n: p for n, p in sharded.named_parameters()}
    values = {n: p.detach().clone() for n, p in tensors.items()}
    fused_state = [id(t) for s in sharded.fused_optimizer.state.values() for t in s.values()]
    moves_after_fit = list(moves)

    out: dict[str, Any] = {}
    out["val"] = trainer.validate(module, datamodule=data, verbose=False)[0]
    out["test"] = trainer.test(module, datamodule=data, verbose=False)[0]
    predictions = trainer.predict(module, datamodule=data)

    after = module.model.sparse_arch.embedding_bag_collection
    out["same_object"] = after is sharded
    out["same_tensors"] = {n: p for n, p in after.named_parameters()} == tensors
    out["same_values"] = all(torch.equal(p.detach(), values[n]) for n, p in after.named_parameters())
    out["same_fused_state"] = [
        id(t) for s in after.fused_optimizer.state.values() for t in s.values()
    ] == fused_state
    out["same_plan"] = trainer.strategy.plan.to_json() == plan
    out["moves"], out["moves_after_fit"], out["optimizer_moves"] = moves, moves_after_fit, optimizer_moves
    out["strategy_model_is_module"] = trainer.strategy.model is module
    out["metric_devices"] = {s.device.type for s in _metric_states(module)}
    out["dense_devices"] = {p.device.type for n, p in module.named_parameters() if "embedding_bag" not in n}
    out["table_devices"] = {p.device.type for p in after.parameters()}
    out["hbm_caps"] = report.report.hbm_caps.tolist() if report.report is not None else None

    # the predictions are those of an unsharded model holding the gathered tables
    full = {k: v.cpu() for k, v in gather_full_state_dict(module.state_dict()).items()}
    reference = ToyDLRM()
    reference.load_state_dict(full)
    reference.eval()
    with torch.no_grad():
        cpu = [b.to(torch.device("cpu")) for b in batches]
        expected = [torch.sigmoid(reference(b.dense_features, b.sparse_features).reshape(-1)) for b in cpu]
    out["predictions"] = torch.cat(predictions).cpu()
    out["expected"] = torch.cat(expected)
    return out


def test_fit_validate_test_predict_keep_the_sharded_tables(tmp_path: Any) -> None:
    ranks = run_ranks(_stages_body, 2, args=(free_port(), str(tmp_path)), timeout=240)
    for rank, r in enumerate(ranks):
        assert r["same_object"] and r["same_tensors"] and r["same_values"], f"rank {rank}"
        assert r["same_fused_state"] and r["same_plan"], f"rank {rank}"
        assert r["strategy_model_is_module"]
        assert r["metric_devices"] == r["dense_devices"] == r["table_devices"] == {"cpu"}
        assert r["moves"] == [], f"rank {rank}: a device move reached sharded storage: {r['moves']}"
        assert r["optimizer_moves"] == [], f"rank {rank}: optimizer state was moved: {r['optimizer_moves']}"
        assert len(r["predictions"]) == 16  # one test batch per rank
        torch.testing.assert_close(r["predictions"], r["expected"], rtol=1e-5, atol=1e-6)
        assert 0.0 < r["test"]["test/auc"] < 1.0 and "val/loss" in r["val"]
    assert ranks[0]["val"]["val/loss"] == pytest.approx(ranks[1]["val"]["val/loss"])  # synced across ranks


@pytest.mark.gpu
def test_fit_validate_test_predict_on_a_gpu(tmp_path: Any) -> None:
    """The same on CUDA (NCCL group of size 1): metric states, dense part and tables on the GPU
    through every stage; the plan report's HBM cap is the GPU's memory."""
    r = run_nccl(_stages_body, args=(free_port(), str(tmp_path), "gpu"), timeout=300)
    assert (
        r["same_object"]
        and r["same_tensors"]
        and r["same_values"]
        and r["same_fused_state"]
        and r["same_plan"]
    )
    assert r["moves"] == [] and r["optimizer_moves"] == []
    assert r["metric_devices"] == r["dense_devices"] == r["table_devices"] == {"cuda"}
    assert r["hbm_caps"] == [torch.cuda.get_device_properties(0).total_memory]
    assert len(r["predictions"]) == 32  # both test batches on the one rank
    torch.testing.assert_close(r["predictions"], r["expected"], rtol=1e-4, atol=1e-5)
