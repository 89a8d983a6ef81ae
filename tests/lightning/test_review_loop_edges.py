"""RecModule training-loop edge cases.

* ``nonfinite_loss="skip"`` with ``accumulate_grad_batches > 1``: a NaN micro-batch drops its own
  contribution only. Before, it cleared every dense gradient of the accumulation window, so the good
  micro-batches before it were lost too (the window's step changed nothing). Compared with a
  plain-PyTorch loop that accumulates the good micro-batches only (Lightning's 1/N loss scaling).
* a ``configure_optimizers`` override that returns a dense optimizer with an LR scheduler leaves the
  fused embedding tables out of the schedule (they keep their initial learning rate): a warning now
  names the fix. A dense optimizer without a scheduler, or the default ``configure_optimizers``,
  does not warn.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.optim.lr_scheduler import StepLR

from lightrec.lightning import RecModule
from lightrec.modules import EmbeddingBagConfig
from lightrec.optim import CombinedOptimizer, KeyedOptimizerWrapper
from tests.lightning.toy import toy_data

ACCUMULATE = 2


def _trainer(**kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, **kwargs,
    )  # fmt: skip


def _batches(nan_at: tuple[int, ...], count: int = 6) -> list[Any]:
    data = toy_data(batch_size=32, num_train_batches=count)
    data.setup("fit")
    batches = list(data.train_dataloader())
    for i in nan_at:
        batches[i].dense_features[0, 0] = float("nan")
    return batches


def _loader(batches: list[Any]) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=lambda b: b)


class _Dense(RecModule):
    """A linear model over the dense features (every parameter stepped by the dense optimizer)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(metrics=None, **kwargs)
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(13, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))

    def forward(self, dense: torch.Tensor, sparse: Any) -> torch.Tensor:
        assert self.model is not None
        return self.model(dense)


def _reference(batches: list[Any], initial: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Plain PyTorch: Adam, gradients of the finite micro-batches accumulated (loss / N), one step per window."""
    model = copy.deepcopy(initial)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for start in range(0, len(batches), ACCUMULATE):
        optimizer.zero_grad()
        for batch in batches[start : start + ACCUMULATE]:
            logits = model(batch.dense_features).reshape(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels.float())
            if torch.isfinite(loss):
                (loss / ACCUMULATE).backward()
        optimizer.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


# Window [2, 3] loses its second micro-batch; window [4, 5] loses its first one (then a good one).
@pytest.mark.parametrize("nan_at", [(3,), (4,), (2, 3)])
def test_skip_with_accumulation_drops_only_the_bad_micro_batch(nan_at: tuple[int, ...]) -> None:
    batches = _batches(nan_at)
    module = _Dense(dense_optimizer="adam", dense_lr=0.05, nonfinite_loss="skip")
    assert module.model is not None
    initial = copy.deepcopy(module.model)
    _trainer(max_epochs=1, accumulate_grad_batches=ACCUMULATE).fit(module, train_dataloaders=_loader(batches))
    assert module.skipped_nonfinite_batches == len(nan_at)
    want = _reference(batches, initial)
    got = module.model.state_dict()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-7, msg=key)


def test_skip_of_a_whole_window_changes_no_weight_even_with_zeroed_gradients() -> None:
    """All micro-batches of the only window are bad: Adam must not step, also on zero (not None) gradients."""

    class ZeroNotNone(_Dense):
        def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
            optimizer.zero_grad(set_to_none=False)

    module = ZeroNotNone(dense_optimizer="adam", dense_lr=0.05, nonfinite_loss="skip")
    assert module.model is not None
    before = copy.deepcopy(module.model.state_dict())
    batches = _batches((0, 1), count=2)
    _trainer(max_epochs=1, accumulate_grad_batches=ACCUMULATE).fit(module, train_dataloaders=_loader(batches))
    assert module.skipped_nonfinite_batches == 2
    for key, value in before.items():
        torch.testing.assert_close(module.model.state_dict()[key], value, rtol=0, atol=0, msg=key)


# ------------------------------------------------------------------ a user's configure_optimizers
class _FusedTables(RecModule):
    """One fused table (cat_0) and a linear layer over [embedding, dense]: RecModule builds it from tables."""

    def table_configs(self) -> list[EmbeddingBagConfig]:
        torch.manual_seed(0)
        return [EmbeddingBagConfig(name="t", num_embeddings=200, embedding_dim=4, feature_names=["cat_0"])]

    def build_model(self, embedding_bag_collection: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.ModuleDict({"sparse": embedding_bag_collection, "lin": torch.nn.Linear(4 + 13, 1)})

    def forward(self, dense: torch.Tensor, sparse: Any) -> torch.Tensor:
        assert self.model is not None
        return self.model["lin"](torch.cat([self.model["sparse"](sparse)["cat_0"], dense], dim=1))


class _DenseOnlyWithScheduler(_FusedTables):
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.dense_parameters().values(), lr=0.1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": StepLR(optimizer, 1, gamma=0.5), "interval": "step"}}


class _DenseOnly(_FusedTables):
    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.dense_parameters().values(), lr=0.1)


class _CombinedWithScheduler(_FusedTables):
    def configure_optimizers(self) -> Any:
        dense = KeyedOptimizerWrapper(self.dense_parameters(), lambda ps: torch.optim.SGD(ps, lr=0.1))
        optimizer = CombinedOptimizer([*self.fused_optimizers(), ("dense", dense)])
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": StepLR(optimizer, 1, gamma=0.5), "interval": "step"}}


def _fit_and_warnings(module: RecModule) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(max_steps=3).fit(module, datamodule=toy_data(batch_size=32, num_train_batches=4))
    return [str(w.message) for w in caught if "fused_optimizers" in str(w.message)]


def _table_lrs(module: RecModule) -> list[float]:
    return [g["lr"] for _, opt in module.fused_optimizers() for g in opt.param_groups]


def test_own_scheduler_that_misses_the_fused_tables_warns_with_the_fix() -> None:
    module = _DenseOnlyWithScheduler(embedding_optimizer="sgd", embedding_lr=0.2)
    found = _fit_and_warnings(module)
    assert _table_lrs(module) == [0.2]  # the behaviour the warning describes: the schedule missed the tables
    assert len(found) == 1, found
    assert "StepLR" in found[0] and "CombinedOptimizer" in found[0] and "self.fused_optimizers()" in found[0]


@pytest.mark.parametrize("cls", [_DenseOnly, _CombinedWithScheduler, _FusedTables])
def test_no_warning_when_tables_are_scheduled_or_nothing_is(cls: type[RecModule]) -> None:
    kwargs: dict[str, Any] = {"warmup_steps": 2} if cls is _FusedTables else {}
    module = cls(embedding_optimizer="sgd", embedding_lr=0.2, **kwargs)
    assert _fit_and_warnings(module) == []
    if cls is _CombinedWithScheduler:
        assert _table_lrs(module) == [pytest.approx(0.2 * 0.5**3)]  # the user's schedule reached the tables


def _rec_strategy_warnings(rank: int, world_size: int, port: int, tmp: str) -> list[list[str]]:
    from tests.multiprocess import set_torchrun_env

    set_torchrun_env(rank, world_size, port)
    from lightrec.lightning import RecStrategy

    found = []
    for module in (_DenseOnlyWithScheduler(), _FusedTables(warmup_steps=2)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _trainer(max_steps=2, strategy=RecStrategy(), default_root_dir=tmp).fit(
                module, datamodule=toy_data(batch_size=32, num_train_batches=4)
            )
        found.append([str(w.message) for w in caught if "fused_optimizers" in str(w.message)])
    return found


def test_rec_strategy_warns_about_a_schedule_that_misses_the_sharded_tables(tmp_path: Any) -> None:
    from tests.multiprocess import free_port, run_ranks

    own, default = run_ranks(_rec_strategy_warnings, 1, args=(free_port(), str(tmp_path)), timeout=240)[0]
    assert len(own) == 1 and "StepLR" in own[0], own
    assert default == []  # RecModule's own CombinedOptimizer + schedule reaches the sharded tables


# ------------------------------------------------------------------ skip under a GradScaler (16-mixed)
def _fit_with_grad_scaler(batches: list[Any]) -> _Dense:
    from lightning.pytorch.plugins.precision import MixedPrecision

    module = _Dense(dense_optimizer="adam", dense_lr=0.05, nonfinite_loss="skip")
    scaler = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))  # as on GPU
    _trainer(max_epochs=1, plugins=[scaler]).fit(module, train_dataloaders=_loader(batches))
    return module


def test_skip_under_a_grad_scaler_trains_as_without_the_batch() -> None:
    """Before: the step after the skipped batch failed in GradScaler.step ("No inf checks were recorded")."""
    skipped = _fit_with_grad_scaler(_batches((1,), count=4))
    reference = _fit_with_grad_scaler([b for i, b in enumerate(_batches((), count=4)) if i != 1])
    assert skipped.skipped_nonfinite_batches == 1 and reference.skipped_nonfinite_batches == 0
    assert skipped.model is not None and reference.model is not None
    want = reference.model.state_dict()
    for key, value in skipped.model.state_dict().items():
        torch.testing.assert_close(value, want[key], rtol=1e-5, atol=1e-6, msg=key)


def test_skip_of_a_windows_first_batch_under_a_grad_scaler_keeps_the_good_batches() -> None:
    """The NaN stand-ins a skipped first micro-batch leaves for the GradScaler are dropped by the window's
    next good micro-batch: its gradients step as in plain PyTorch (before, NaN poisoned the window)."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    batches = _batches((4,))
    module = _Dense(dense_optimizer="adam", dense_lr=0.05, nonfinite_loss="skip")
    assert module.model is not None
    initial = copy.deepcopy(module.model)
    scaler = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    _trainer(max_epochs=1, accumulate_grad_batches=ACCUMULATE, plugins=[scaler]).fit(
        module, train_dataloaders=_loader(batches)
    )
    assert module.skipped_nonfinite_batches == 1
    want = _reference(batches, initial)
    for key, value in want.items():
        torch.testing.assert_close(module.model.state_dict()[key], value, rtol=1e-3, atol=1e-4, msg=key)
