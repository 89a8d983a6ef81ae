"""``RecModule(managed_collisions=...)`` and ``ManagedCollisionMonitor``: a DLRM over raw 63-bit ids of
a drifting vocabulary trains in one process and on 2 ranks under ``RecStrategy``; the monitor logs
occupancy / evictions / default-row share to TensorBoard, and its global counters are the same on
2 ranks as in one process (the remapping decisions do not depend on the split); the serving model
keeps the id maps, frozen."""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lightrec.data import SyntheticCriteo
from lightrec.lightning import ManagedCollisionMonitor, RecModule
from lightrec.models import DLRM
from lightrec.modules import EmbeddingBagConfig
from lightrec.modules.managed_collision import ManagedCollisionEmbeddingBagCollection
from lightrec.modules.managed_collision.options import ManagedCollisionOptions
from tests.multiprocess import free_port, run_ranks, set_torchrun_env

DIM, B, STEPS, EVERY = 4, 32, 6, 3
MC = {"eviction_interval": 2, "buckets": 2}


def drifting_data(batch_size: int = 2 * B, steps: int = STEPS, drift: float = 0.2) -> SyntheticCriteo:
    return SyntheticCriteo(batch_size=batch_size, block_size=B, num_train_batches=steps, num_val_batches=1,
                           num_test_batches=1, num_embeddings_cap=30, vocabulary="drifting",
                           drift_per_batch=drift, seed=5)  # fmt: skip


class ManagedDLRM(RecModule):
    """A DLRM whose tables RecModule builds (behind managed collisions when asked)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.tables = drifting_data().table_configs(DIM)

    def table_configs(self) -> list[EmbeddingBagConfig]:
        return self.tables

    def build_model(self, embedding_bag_collection: torch.nn.Module) -> torch.nn.Module:
        torch.manual_seed(0)
        return DLRM(embedding_bag_collection=embedding_bag_collection, dense_in_features=13,
                    dense_arch_layer_sizes=[8, DIM], over_arch_layer_sizes=[8, 1])  # fmt: skip

    def forward(self, dense: torch.Tensor, sparse: Any) -> torch.Tensor:
        return self.built_model()(dense, sparse)


def _counters(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.count("/") == 1}  # the totals over tables


def test_options_parse_and_build_one_module_per_table() -> None:
    assert ManagedCollisionOptions.parse(None) is None and ManagedCollisionOptions.parse(False) is None
    options = ManagedCollisionOptions.parse({"eviction_policy": "ttl", "ttl": 5, "buckets": 3})
    assert options is not None and options.to_dict()["ttl"] == 5
    tables = [EmbeddingBagConfig(num_embeddings=12, embedding_dim=4, name="big", feature_names=["a"]),
              EmbeddingBagConfig(num_embeddings=4, embedding_dim=4, name="small", feature_names=["b"])]  # fmt: skip
    mcc = options.collection(tables, "cpu")
    modules = mcc.modules_by_table()
    assert modules["big"].buckets() == 3 and modules["small"].buckets() == 1  # too few rows for 3 buckets
    assert modules["big"].output_size() == 12 and type(modules["big"].eviction_policy).__name__ == "TTL_EvictionPolicy"
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['interval'\]"):
        ManagedCollisionOptions.parse({"interval": 3})
    with pytest.raises(ValueError, match="eviction_policy must be one of"):
        ManagedCollisionOptions.parse({"eviction_policy": "fifo"})
    with pytest.raises(ValueError, match="needs ttl"):
        ManagedCollisionOptions(eviction_policy="ttl")


def test_one_process_fit_logs_the_tables_and_serves_them_frozen(tmp_path) -> None:  # noqa: ANN001
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    module = ManagedDLRM(managed_collisions=MC, dense_optimizer="sgd", dense_lr=0.1)
    monitor = ManagedCollisionMonitor(every_n_steps=EVERY)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, num_sanity_val_steps=0, log_every_n_steps=1,
        logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="tb", version=0), callbacks=[monitor],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    data = drifting_data()
    trainer.fit(module, datamodule=data)
    events = EventAccumulator(os.path.join(str(tmp_path), "tb", "version_0"), size_guidance={"scalars": 0}).Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("mc/occupancy", "mc/evictions", "mc/insertions", "mc/default_row_share", "mc/t_cat_0/occupancy"):
        assert tag in tags, sorted(tags)
    assert [e.step for e in events.Scalars("mc/occupancy")] == [EVERY - 1, 2 * EVERY - 1]
    assert sum(e.value for e in events.Scalars("mc/evictions")) > 0  # the vocabulary drifted out of the tables
    # the monitor's figures are the modules' own
    sparse = module.built_model().sparse_arch.embedding_bag_collection
    assert isinstance(sparse, ManagedCollisionEmbeddingBagCollection)
    stats = [m.mc_stats() for m in sparse._managed_collision_collection.modules_by_table().values()]
    occupied, rows = sum(s["occupied"] for s in stats), sum(s["rows"] for s in stats)
    assert monitor.last_metrics["mc/occupancy"] == pytest.approx(occupied / rows)
    assert sum(e.value for e in events.Scalars("mc/evictions")) == sum(s["evicted"] for s in stats)
    # serving: the same id maps, frozen (a second pass maps every id the same way and evicts nothing)
    serving = module.serving_model()
    batch = data.datasets["val"][0]
    module.eval()
    with torch.no_grad():
        expected = module(batch.dense_features, batch.sparse_features)
        got = serving(batch.dense_features, batch.sparse_features)
        again = serving(batch.dense_features, batch.sparse_features)
    torch.testing.assert_close(got, expected)
    assert torch.equal(got, again)


def _fit_ranks(rank: int, world_size: int, port: int, out_dir: str) -> dict[str, float]:
    set_torchrun_env(rank, world_size, port)
    from lightrec.lightning import QuantizedExport, RecStrategy

    monitor = ManagedCollisionMonitor(every_n_steps=EVERY)
    export = QuantizedExport(dirpath=out_dir, dtype="fp16")  # gathers the tables and id maps to rank 0
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=out_dir, save_last=True)  # a sharded folder
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, max_epochs=1, num_sanity_val_steps=0, limit_val_batches=0,
        strategy=RecStrategy(), logger=False, callbacks=[monitor, export, checkpoint],
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    module = ManagedDLRM(managed_collisions=MC, dense_optimizer="sgd", dense_lr=0.1)
    trainer.fit(module, datamodule=drifting_data(batch_size=B, steps=STEPS * world_size, drift=0.1))
    return _counters(monitor.last_metrics)


def test_two_ranks_make_the_one_process_decisions(tmp_path) -> None:  # noqa: ANN001
    """The monitor's global counters and the id maps of the sharded checkpoint equal a one-process
    run's: ids of both ranks' batches meet in their owners' modules, which decide as the unsharded
    ones do. (The weights differ: the sharded tables sum the ranks' gradients of their per-rank mean
    losses, as torchrec's do.) The model exported at the end (tables and id maps gathered from both
    ranks) is the checkpoint's model quantized."""
    from lightrec.inference import load, quantize

    ranks = run_ranks(_fit_ranks, 2, args=(free_port(), str(tmp_path)), timeout=300)
    assert ranks[0] == ranks[1] and ranks[0]["mc/evictions"] > 0
    monitor = ManagedCollisionMonitor(every_n_steps=EVERY)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, num_sanity_val_steps=0, limit_val_batches=0, logger=False,
        callbacks=[monitor], enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    module = ManagedDLRM(managed_collisions=MC, dense_optimizer="sgd", dense_lr=0.1)
    data = drifting_data()
    trainer.fit(module, datamodule=data)
    assert _counters(monitor.last_metrics) == ranks[0]
    restored = ManagedDLRM.load_from_checkpoint(tmp_path / "last.ckpt")  # the sharded folder, consolidated
    mine = module.built_model().sparse_arch.embedding_bag_collection._managed_collision_collection
    theirs = restored.built_model().sparse_arch.embedding_bag_collection._managed_collision_collection
    for table, mc in mine.modules_by_table().items():
        for name, value in mc.slot_state().items():
            assert torch.equal(value, theirs.modules_by_table()[table].slot_state()[name]), (table, name)
    batch = data.datasets["val"][0]
    kjt = batch.sparse_features
    want = quantize(restored.serving_model(), dtype=torch.float16)(batch.dense_features, kjt)
    predictor = load(next(tmp_path.glob("*.pt")))
    assert torch.equal(predictor(batch.dense_features, kjt.values(), kjt.lengths()), want)


def test_checkpoint_exports_with_the_id_maps(tmp_path) -> None:  # noqa: ANN001
    """``export_from_checkpoint`` with the module's ``serving_factory`` (meta tables and id maps) gives
    the artifact of the trained model quantized: the id maps come from the checkpoint."""
    from lightrec.inference import export_from_checkpoint, load, quantize

    module = ManagedDLRM(managed_collisions=MC, dense_optimizer="sgd", dense_lr=0.1)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path), save_last=True)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, num_sanity_val_steps=0, limit_val_batches=0, logger=False,
        callbacks=[checkpoint], enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    data = drifting_data()
    trainer.fit(module, datamodule=data)
    path = export_from_checkpoint(str(tmp_path / "last.ckpt"), module.serving_factory, tmp_path / "m.pt",
                                  dtype=torch.float16)  # fmt: skip
    predictor = load(path)
    batch = data.datasets["val"][0]
    want = quantize(module.serving_model(), dtype=torch.float16)(batch.dense_features, batch.sparse_features)
    kjt = batch.sparse_features
    assert torch.equal(predictor(batch.dense_features, kjt.values(), kjt.lengths()), want)
    assert predictor.meta["tables"][0]["id_space"] == 2**63 - 1
