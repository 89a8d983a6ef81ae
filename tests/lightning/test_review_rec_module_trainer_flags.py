"""RecModule with Trainer flags that meet the embedding tables' fused (in-backward) optimizer.

* ``gradient_clip_val`` clips the dense gradients only (the tables were updated inside backward):
  ``configure_optimizers`` says so, and a fit clips the dense gradients by their own norm, as a
  plain-PyTorch reference does;
* a RecModule whose tables train in backward, under a data-parallel strategy other than
  ``RecStrategy`` (``strategy="ddp"``), is refused at ``setup("fit")`` with
  ``FusedTablesStrategyError`` naming the strategy and the fix (before: torch's
  ``AttributeError: module 'torch.distributed' has no attribute 'optim'`` in the first forward).
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy

from lightrec.lightning import RecModule
from lightrec.modules import EmbeddingBagConfig
from tests.lightning.toy import ToyDLRM, toy_data
from tests.multiprocess import free_port, run_ranks, set_torchrun_env


class _FusedTablesDLRM(RecModule):
    """One fused table (cat_0) and a linear layer over [embedding, dense]: RecModule builds it from tables."""

    def table_configs(self) -> list[EmbeddingBagConfig]:
        torch.manual_seed(0)  # before the tables and the layer are initialised
        return [EmbeddingBagConfig(name="t", num_embeddings=200, embedding_dim=4, feature_names=["cat_0"])]

    def build_model(self, embedding_bag_collection: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.ModuleDict({"sparse": embedding_bag_collection, "lin": torch.nn.Linear(4 + 13, 1)})

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:  # noqa: ANN001
        assert self.model is not None
        return self.model["lin"](torch.cat([self.model["sparse"](sparse)["cat_0"], dense], dim=1))


def _trainer(**kwargs) -> pl.Trainer:  # noqa: ANN003
    return pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, **kwargs,
    )  # fmt: skip


def _clip_warnings(module: RecModule, trainer: pl.Trainer) -> list[str]:
    module.trainer = trainer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module.configure_optimizers()
    return [str(w.message) for w in caught if "gradient_clip_val" in str(w.message)]


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clipping_with_fused_tables_warns_that_it_clips_the_dense_part_only(algorithm: str) -> None:
    module = _FusedTablesDLRM(embedding_optimizer="sgd", embedding_lr=0.5)
    module.configure_model()
    said = _clip_warnings(module, _trainer(gradient_clip_val=0.25, gradient_clip_algorithm=algorithm))
    assert len(said) == 1, said
    assert "gradient_clip_val=0.25" in said[0] and f"gradient_clip_algorithm={algorithm!r}" in said[0]
    assert "dense parameters' gradients only" in said[0] and "embedding_lr" in said[0]
    # no clipping, or no fused tables (every table is a dense parameter): nothing to say
    assert _clip_warnings(module, _trainer()) == []
    assert _clip_warnings(ToyDLRM(), _trainer(gradient_clip_val=0.25)) == []


def test_gradient_clipping_with_fused_tables_clips_the_dense_gradients_by_their_own_norm() -> None:
    """One SGD step of a fit with gradient_clip_val equals plain PyTorch clipping the dense grads alone."""
    clip, lr = 0.01, 0.5
    data = toy_data(batch_size=32, num_train_batches=1)
    batch = next(iter(data.train_dataloader()))
    reference = _FusedTablesDLRM(dense_optimizer="sgd", dense_lr=lr, embedding_optimizer="sgd", embedding_lr=0.1)
    reference.configure_model()
    module = _FusedTablesDLRM(dense_optimizer="sgd", dense_lr=lr, embedding_optimizer="sgd", embedding_lr=0.1)
    _trainer(max_steps=1, gradient_clip_val=clip).fit(module, datamodule=data)

    _, loss = reference._logits_and_loss(batch)
    loss.backward()  # the fused table is updated here; the linear layer's grads remain
    dense = list(reference.model["lin"].parameters())
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in dense]))
    assert norm > clip  # the clip does act
    with torch.no_grad():
        for p in dense:
            p -= lr * p.grad * (clip / (norm + 1e-6))
    for name, expected in reference.model.state_dict().items():
        torch.testing.assert_close(module.model.state_dict()[name], expected, msg=name)


def _refuse(module: RecModule, strategy: DDPStrategy) -> None:
    """What ``RecModule.setup("fit")`` runs."""
    from lightrec.lightning.fused_tables_checks import refuse_fused_tables_under_data_parallel

    builds_fused = module.model is None and module.builds_from_tables and module._defines_tables()
    refuse_fused_tables_under_data_parallel(module, strategy, builds_fused)


def test_fused_tables_under_a_non_sharding_parallel_strategy_are_refused_by_name() -> None:
    from lightrec.lightning.rec_module import FusedTablesStrategyError

    strategy = DDPStrategy(accelerator=None)
    built = _FusedTablesDLRM()  # tables RecModule will build fused in configure_model
    with pytest.raises(FusedTablesStrategyError, match=r"strategy DDPStrategy .*Pass strategy=lightrec.lightning.RecStrategy"):
        _refuse(built, strategy)
    built.configure_model()  # already built: refused by the tables' in-backward marks
    with pytest.raises(FusedTablesStrategyError, match="fused optimizer inside backward"):
        _refuse(built, strategy)
    assert issubclass(FusedTablesStrategyError, ValueError)
    # plain tables (dense parameters) train under DDP as any model does: not refused
    _refuse(ToyDLRM(), strategy)


def _fit_under_ddp(rank: int, world_size: int, port: int) -> str:
    set_torchrun_env(rank, world_size, port)
    try:
        _trainer(strategy="ddp", max_steps=1).fit(_FusedTablesDLRM(), datamodule=toy_data(num_train_batches=2))
    except Exception as exc:  # noqa: BLE001 - the type and message are the result
        return f"{type(exc).__name__}: {exc}"
    return "fitted"


def test_a_fit_with_strategy_ddp_and_fused_tables_stops_at_setup_naming_the_fix() -> None:
    (said,) = run_ranks(_fit_under_ddp, 1, args=(free_port(),), timeout=180)
    assert said.startswith("FusedTablesStrategyError: _FusedTablesDLRM trains its embedding tables"), said
    assert "strategy DDPStrategy" in said and "RecStrategy(...)" in said and "strategy='auto'" in said
