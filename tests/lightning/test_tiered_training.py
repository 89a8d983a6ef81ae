"""The DLRM recipe's module with its tables on SSD (``tables_on="ssd"``): trained by ``RecStrategy`` it
takes the same steps as with its tables in memory, its next batch's rows are prefetched
(``SparseDistPrefetch`` on one CPU process), TensorBoard shows the caches' hit rate and traffic, the
plan shows the tiered kernel, and export is refused with a clear message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightrec.data import SyntheticCriteo
from lightrec.distributed.planner import ParameterConstraints
from lightrec.inference import quantize
from lightrec.kernels import FusedEmbeddingBagCollection, TieringConfig
from lightrec.lightning import RecStrategy, SparseDistPrefetch, TableTiering, TieredTableMonitor
from lightrec.lightning.callbacks.tiered_table_monitor import tiered_kernels
from lightrec.modules import EmbeddingBagConfig
from lightrec.optim import EmbOptimType
from lightrec.recipes.dlrm import DLRMModule

STEPS = 20


@pytest.fixture(autouse=True)
def _own_process_group(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fits run in the pytest process: give their one-rank process group a port of its own and
    take it down afterwards, so neither its listening store nor the MASTER_PORT Lightning writes
    into the environment reaches the launched commands of later tests (EADDRINUSE)."""
    from tests.multiprocess import free_port

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _data() -> SyntheticCriteo:
    return SyntheticCriteo(batch_size=128, num_train_batches=STEPS, num_val_batches=1, num_test_batches=1,
                           num_embeddings_cap=20_000, seed=5)  # fmt: skip


def _fit(tmp: Path, **tiering: Any) -> tuple[DLRMModule, pl.Trainer, list[float]]:
    # In memory the planner would make the smallest tables data parallel (the dense optimizer then
    # trains them): keep every table table-wise and fused, as the tiered kernel is.
    names = [c.name for c in _data().table_configs(8)]
    constraints = None if tiering else {n: ParameterConstraints(sharding_types=["table_wise"]) for n in names}
    torch.manual_seed(0)
    module = DLRMModule(embedding_dim=8, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1], **tiering)
    losses: list[float] = []

    class Losses(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            losses.append(float(outputs["loss"]))

    trainer = pl.Trainer(
        accelerator="cpu", devices=1, strategy=RecStrategy(constraints=constraints), max_steps=STEPS, num_sanity_val_steps=0,
        limit_val_batches=0, logger=TensorBoardLogger(str(tmp), name="run"), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[Losses(), SparseDistPrefetch()],
    )  # fmt: skip
    trainer.fit(module, datamodule=_data())
    return module, trainer, losses


def test_tables_on_ssd_train_like_tables_in_memory_and_log_their_caches(tmp_path: Path) -> None:
    _, _, in_memory = _fit(tmp_path / "memory")
    module, trainer, on_ssd = _fit(tmp_path / "ssd", tables_on="ssd", cache_load_factor=0.05,
                                   ssd_storage_directory=str(tmp_path / "rows"))  # fmt: skip
    assert on_ssd == in_memory  # the same arithmetic on the cached rows
    plan = trainer.strategy.plan
    kernels = {ps.compute_kernel for mp in plan.plan.values() for ps in mp.values()}
    assert kernels == {"key_value"}
    monitors = [c for c in trainer.callbacks if isinstance(c, TieredTableMonitor)]
    assert len(monitors) == 1 and 0.0 < monitors[0].last_logged["hit_rate"] < 1.0
    kernels_ = tiered_kernels(module)
    stats = [k.stats() for k in kernels_]
    assert kernels_ and sum(s.rows_fetched for s in stats) > 0
    # prefetched on one process: the lookups found their rows already fetched
    assert sum(s.requested_ids for s in stats) == STEPS * 128 * 26
    events = EventAccumulator(str(trainer.logger.log_dir)).Reload()  # type: ignore[union-attr]
    for tag in ("tiered/hit_rate", "tiered/rows_fetched_per_step", "tiered/mib_per_step", "tiered/cache_fill"):
        assert tag in events.Tags()["scalars"], tag
    assert list(Path(tmp_path / "rows").iterdir()) == []  # row files are unlinked working stores
    with pytest.raises(ValueError, match=r"are tiered .* lightrec does not export tiered tables"):
        module.serving_model()


def test_table_tiering_options() -> None:
    tiering = TableTiering("ssd", 0.05, "lfu", "/ssd/@local_rank")
    assert tiering.fused_params() == {"cache_algorithm": "lfu", "cache_load_factor": 0.05,
                                      "ssd_storage_directory": "/ssd/@local_rank"}  # fmt: skip
    assert tiering.constraints(["t0"])["t0"].compute_kernels == ["key_value"]
    assert TableTiering("host").compute_kernel == "fused_uvm_caching"
    assert TableTiering().constraints(["t0"]) == {} and TableTiering().tiering() is None
    with pytest.raises(ValueError, match="tables_on must be one of"):
        TableTiering("disk")
    with pytest.raises(ValueError, match="cache_load_factor must be a share"):
        TableTiering("ssd", cache_load_factor=0.0)


def test_quantize_refuses_tiered_tables_by_name(tmp_path: Path) -> None:
    sgd = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    tables = [EmbeddingBagConfig(name="big", embedding_dim=4, num_embeddings=1000, feature_names=["f"])]
    tiering = TieringConfig("ssd", cache_rows=64, ssd_storage_directory=str(tmp_path))
    model = torch.nn.Sequential(FusedEmbeddingBagCollection(tables, fused_params=sgd, tiering=tiering))
    with pytest.raises(ValueError, match=r"tables \['big'\] are tiered .* --recipe.export false"):
        quantize(model)
    in_memory = torch.nn.Sequential(FusedEmbeddingBagCollection(tables, fused_params=sgd))
    assert quantize(in_memory) is not None  # the refusal is the tiering's, not the fused collection's


def test_tiered_tables_with_managed_collisions_are_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tables_on='ssd' with managed_collisions is not supported.*tables_on='memory'"):
        DLRMModule(tables_on="ssd", ssd_storage_directory=str(tmp_path), managed_collisions=True)
