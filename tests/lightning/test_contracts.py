"""The declared contract between RecStrategy and the modules it trains (lightrec/lightning/contracts.py)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

from lightrec.lightning import RecModule, RecStrategy
from lightrec.lightning.contracts import (
    EmbeddingShardingStrategy,
    FusedOptimizerModule,
    ServingModelProvider,
    ShardedModelProvider,
    ShardingRequest,
)
from lightrec.modules import EmbeddingBagConfig
from tests.lightning.toy import ToyDLRM
from tests.multiprocess import free_port, run_ranks, set_torchrun_env

_LIGHTNING = Path(__file__).resolve().parents[2] / "lightrec" / "lightning"


class _Tables(RecModule):
    def table_configs(self) -> list[EmbeddingBagConfig]:
        return [EmbeddingBagConfig(name="t", num_embeddings=12, embedding_dim=4, feature_names=["f"])]

    def build_model(self, embedding_bag_collection: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.ModuleDict({"sparse": embedding_bag_collection})


def test_each_side_satisfies_the_protocol_the_other_reads() -> None:
    assert isinstance(RecStrategy(), EmbeddingShardingStrategy)
    module = ToyDLRM()
    assert isinstance(module, ShardedModelProvider) and isinstance(module, ServingModelProvider)
    assert not isinstance(torch.nn.Linear(2, 2), ShardedModelProvider)


def test_the_sharding_request_carries_the_optimizer_only_of_tables_the_module_builds() -> None:
    built = _Tables(embedding_optimizer="adagrad", embedding_lr=0.3)
    assert built.builds_from_tables
    assert built.sharding_request() == ShardingRequest(fused_params=built.fused_params(), constraints={})
    own = ToyDLRM()  # builds its own model: its tables carry their own optimizer
    assert not own.builds_from_tables and own.sharding_request() == ShardingRequest()
    tiered = _Tables(tables_on="ssd", cache_load_factor=0.5)
    assert list(tiered.sharding_request().constraints) == ["t"]


def test_recmodule_hooks_have_defaults_with_the_old_error() -> None:
    own = ToyDLRM()
    assert own.for_serving(own.model) is own.model
    with pytest.raises(TypeError, match="builds its own model; define table_configs"):
        own.serving_model()


def test_a_fused_collection_is_a_fused_optimizer_module() -> None:
    from lightrec.kernels import FusedEmbeddingBagCollection

    fused = FusedEmbeddingBagCollection(_Tables().table_configs(), optimizer_type=torch.optim.SGD,
                                        optimizer_kwargs={"lr": 0.1})  # fmt: skip
    assert isinstance(fused, FusedOptimizerModule) and fused.fused_optimizer is not None


def test_lightrec_datamodules_meet_the_data_contracts_the_recipes_read() -> None:
    from lightrec.lightning.contracts import BatchSizedData, CheckedData, TableDescribingData
    from lightrec.lightning.recipe.module import table_specs_of
    from tests.lightning.toy import toy_data

    class Sized:
        batch_size = 32

    data = toy_data(batch_size=32)
    assert isinstance(data, TableDescribingData) and isinstance(Sized(), BatchSizedData)
    assert not isinstance(data, CheckedData)  # synthetic: nothing on disk to check
    assert len(table_specs_of(data)) == 26
    with pytest.raises(TypeError, match="needs a DataModule with a table_configs"):
        table_specs_of(object())  # names what to add


def test_module_and_strategy_do_not_import_each_other() -> None:
    def imports(name: str) -> set[str]:
        tree = ast.parse((_LIGHTNING / name).read_text())
        return {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}

    assert "lightrec.lightning.rec_strategy" not in imports("rec_module.py")
    assert "lightrec.lightning.rec_module" not in imports("rec_strategy.py")


def _fit_plain_modules(rank: int, world_size: int, port: int) -> dict[str, Any]:
    set_torchrun_env(rank, world_size, port)
    import lightning.pytorch as pl

    from lightrec import EmbeddingBagCollection
    from lightrec.lightning import RecStrategy
    from lightrec.lightning.contracts import UnshardableModuleError
    from tests.lightning.toy import toy_data

    class Dense(pl.LightningModule):
        """A LightningModule without embedding tables: nothing for RecStrategy to shard."""

        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(13, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.head(batch.dense_features).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class WithTables(Dense):
        """A plain LightningModule with its own EmbeddingBagCollection (the docs' migration path)."""

        def __init__(self) -> None:
            super().__init__()
            self.ebc = EmbeddingBagCollection(toy_data().table_configs(4), device=torch.device("meta"))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.ebc(batch.sparse_features).values().sum() + self.head(batch.dense_features).sum()

    def fit(module: pl.LightningModule) -> int:
        trainer = pl.Trainer(accelerator="cpu", devices=world_size, strategy=RecStrategy(), max_steps=1,
                             logger=False, enable_progress_bar=False, enable_model_summary=False,
                             enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
        trainer.fit(module, datamodule=toy_data())
        return trainer.global_step

    try:
        fit(Dense())
        refused = ""
    except UnshardableModuleError as exc:
        refused = str(exc)
    return {"refused": refused, "steps_with_tables": fit(WithTables())}


def test_a_plain_module_needs_tables_to_shard_and_trains_with_them() -> None:
    out = run_ranks(_fit_plain_modules, 1, args=(free_port(),), timeout=300)[0]
    assert "Dense it was given holds none" in out["refused"] and "strategy='ddp'" in out["refused"]
    assert out["steps_with_tables"] == 1
