"""RecModule in a single process (default strategy): steps, optimizers, schedules, logging."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch

from lightrec.lightning import RecModule, dlrm_lr_lambda
from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.optim import CombinedOptimizer
from tests.lightning.toy import ToyDLRM, toy_data


def _trainer(tmp_path, device: torch.device | None = None, **kwargs) -> pl.Trainer:  # noqa: ANN001
    accelerator = "gpu" if device is not None and device.type == "cuda" else "cpu"
    return pl.Trainer(
        accelerator=accelerator, devices=1, max_epochs=1, logger=pl.loggers.TensorBoardLogger(tmp_path),
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **kwargs,
    )  # fmt: skip


def test_fit_logs_loss_metrics_and_throughput_to_tensorboard(tmp_path, device: torch.device) -> None:  # noqa: ANN001
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    module = ToyDLRM(dense_lr=0.05, train_metrics=True)
    trainer = _trainer(tmp_path, device, log_every_n_steps=1)
    trainer.fit(module, datamodule=toy_data())
    trainer.test(module, datamodule=toy_data())
    events = EventAccumulator(str(tmp_path / "lightning_logs" / "version_0")).Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("train/loss", "train/samples_per_sec", "val/auc", "val/ne", "val/calibration", "test/auc", "train/auc"):
        assert tag in tags, tags
    losses = [e.value for e in events.Scalars("train/loss")]
    assert len(losses) == 8 and all(torch.isfinite(torch.tensor(losses)))


def test_configure_optimizers_returns_one_combined_optimizer_with_a_schedule() -> None:
    module = ToyDLRM(dense_optimizer="adam", dense_lr=0.1, warmup_steps=4, decay_start_step=6, decay_steps=4)
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert isinstance(optimizer, CombinedOptimizer)
    assert config["lr_scheduler"]["interval"] == "step"
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [0.1 * dlrm_lr_lambda(4, 6, 4)(s) for s in range(10)]
    assert lrs == pytest.approx(expected)
    # every trainable parameter is stepped by the dense part (the unsharded EBC has no fused optimizer)
    assert set(optimizer.params) == {f"dense.{n}" for n, p in module.named_parameters() if p.requires_grad}


def test_predict_step_returns_probabilities(tmp_path, device: torch.device) -> None:  # noqa: ANN001
    module = ToyDLRM()
    data = toy_data()
    preds = _trainer(tmp_path, device).predict(module, dataloaders=data.test_dataloader())
    assert len(preds) == 2 and preds[0].shape == (64,)
    assert float(preds[0].min()) >= 0.0 and float(preds[0].max()) <= 1.0


def test_bad_dense_optimizer_name() -> None:
    with pytest.raises(ValueError, match="dense_optimizer must be one of"):
        RecModule(dense_optimizer="lbfgs-ish")


def test_lr_lambda_shape() -> None:
    f = dlrm_lr_lambda(warmup_steps=2, decay_start_step=4, decay_steps=2, decay_power=1.0)
    assert [f(s) for s in range(7)] == [0.5, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0]
    with pytest.raises(ValueError, match="warmup_steps"):
        dlrm_lr_lambda(-1, None, 0)


class _TablesModule(RecModule):
    """A RecModule that lets RecModule build its model from tables (the recipes' way)."""

    def __init__(self, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.tables = [EmbeddingBagConfig(name="t", num_embeddings=20, embedding_dim=4, feature_names=["f"])]

    def table_configs(self) -> list[EmbeddingBagConfig]:
        return self.tables

    def build_model(self, embedding_bag_collection: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.ModuleDict({"sparse": embedding_bag_collection})

    def for_serving(self, model: torch.nn.Module) -> torch.nn.Module:
        return model["sparse"]


def test_a_model_built_from_tables_gets_the_embedding_optimizer_for_each_strategy() -> None:
    from lightrec.kernels import FusedEmbeddingBagCollection
    from lightrec.optim import EmbOptimType, fused_spec_from_parameter

    module = _TablesModule(embedding_optimizer="sgd", embedding_lr=0.5)
    module.configure_model()  # no Trainer: one process, fused tables
    fused = module.built_model()["sparse"]
    assert isinstance(fused, FusedEmbeddingBagCollection)
    assert fused.fused_optimizer.param_groups[0]["lr"] == 0.5
    assert module.fused_params()["learning_rate"] == 0.5
    # RecStrategy's view: meta tables marked with the same optimizer, for the sharders
    planned = module.model_for_planning()["sparse"]
    weight = planned.embedding_bags["t"].weight
    assert weight.is_meta and fused_spec_from_parameter(weight).optimizer == EmbOptimType.SGD
    # serving: plain tables holding the trained rows, the part for_serving picks
    serving = module.serving_model()
    assert isinstance(serving, EmbeddingBagCollection) and not serving.training
    torch.testing.assert_close(serving.embedding_bags["t"].weight, fused.state_dict()["embedding_bags.t.weight"])
    assert module.serving_factory().embedding_bags["t"].weight.is_meta
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["lightrec_module"].endswith("test_rec_module._TablesModule")


def test_a_module_that_builds_its_own_model_is_left_alone() -> None:
    module = ToyDLRM()
    model = module.model
    module.configure_model()
    assert module.model is model and module.built_model() is model
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    assert "lightrec_module" not in checkpoint
    with pytest.raises(TypeError, match=r"define table_configs\(\) and build_model"):
        module.model_for_planning()
    with pytest.raises(ValueError, match="embedding_optimizer must be one of"):
        RecModule(embedding_optimizer="lamb")


@pytest.mark.parametrize("accumulate", [1, 2])
def test_gradient_accumulation_with_fused_tables_warns_that_rows_step_every_batch(accumulate: int) -> None:
    module = _TablesModule(embedding_optimizer="sgd", embedding_lr=0.5)
    module.configure_model()
    trainer = pl.Trainer(accelerator="cpu", devices=1, accumulate_grad_batches=accumulate, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False)  # fmt: skip
    module.trainer = trainer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module.configure_optimizers()
    said = [str(w.message) for w in caught if "accumulate_grad_batches" in str(w.message)]
    if accumulate == 1:
        assert said == []
    else:
        assert len(said) == 1 and "inside every batch's backward" in said[0] and "raise the batch size" in said[0]
