"""Review of the Lightning callbacks' conventions: windows counted in optimizer steps and aligned to the
trainer's step counter, logging steps of the last window, and ``QuantizedExport``'s moments (not under
``fast_dev_run``, again in a second fit, the fit-end artifact named after its epoch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from lightrec.lightning import (
    ManagedCollisionMonitor,
    QuantizedExport,
    RecThroughputMonitor,
    TieredTableMonitor,
)
from tests.lightning.toy import ToyDLRM, toy_data

BATCH = 32


class _Recorder(pl.loggers.logger.Logger):
    """Every ``log_metrics`` call, as ``(step, metrics)``."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def steps_of(self, tag: str) -> list[int | None]:
        return [step for step, metrics in self.rows if tag in metrics]

    def values_of(self, tag: str) -> list[float]:
        return [metrics[tag] for _, metrics in self.rows if tag in metrics]


def _trainer(root: Path, callbacks: list[pl.Callback], **kwargs: Any) -> pl.Trainer:
    settings: dict[str, Any] = dict(
        accelerator="cpu", devices=1, num_sanity_val_steps=0, limit_val_batches=0, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks, default_root_dir=str(root),
        log_every_n_steps=1,
    )  # fmt: skip
    settings.update(kwargs)
    return pl.Trainer(**settings)


def _samples_per_window(recorder: _Recorder, prefix: str = "monitor/") -> list[float]:
    """samples/s x step time x steps = the samples of the window (the wall time cancels)."""
    rates, step_ms = recorder.values_of(prefix + "samples_per_sec"), recorder.values_of(prefix + "step_time_ms")
    return [r * t / 1e3 for r, t in zip(rates, step_ms, strict=True)]


def test_throughput_windows_count_optimizer_steps_under_gradient_accumulation(tmp_path: Path) -> None:
    batches, accumulate, every = 8, 2, 2  # 4 optimizer steps: windows end at steps 1 and 3
    recorder, monitor = _Recorder(), RecThroughputMonitor(every_n_steps=every)
    _trainer(tmp_path, [monitor], max_epochs=1, accumulate_grad_batches=accumulate, logger=recorder).fit(
        ToyDLRM(), datamodule=toy_data(BATCH, batches))
    assert recorder.steps_of("monitor/samples_per_sec") == [1, 3]
    assert recorder.steps_of("monitor/samples_per_sec") == recorder.steps_of("train/loss")[every - 1 :: every]
    # each window: 2 steps of 2 batches; samples/s x step time (per optimizer step) x steps = its samples
    windows = [every * s for s in _samples_per_window(recorder)]
    assert windows == pytest.approx([every * accumulate * BATCH] * 2, rel=1e-6)


def test_throughput_windows_of_a_resumed_fit_end_at_the_uninterrupted_fits_steps(tmp_path: Path) -> None:
    data, every = toy_data(BATCH, 8), 2
    first, monitor = _Recorder(), RecThroughputMonitor(every_n_steps=every)
    trainer = _trainer(tmp_path, [monitor], max_steps=3, logger=first)
    trainer.fit(ToyDLRM(), datamodule=data)
    trainer.save_checkpoint(tmp_path / "step3.ckpt")
    assert first.steps_of("monitor/samples_per_sec") == [1, 2]  # the last, shorter window at train end
    second = _Recorder()
    _trainer(tmp_path, [RecThroughputMonitor(every_n_steps=every)], max_steps=6, logger=second).fit(
        ToyDLRM(), datamodule=data, ckpt_path=tmp_path / "step3.ckpt")
    assert second.steps_of("monitor/samples_per_sec") == [3, 5]  # an uninterrupted fit: 1, 3, 5
    assert [round(s) for s in _samples_per_window(second)] == [BATCH, BATCH]  # 1 step, then 1 step / 2 steps
    # (window 1: step 3 alone; window 2: steps 4 and 5, so samples/s x step time = one step's samples)


def test_monitors_refuse_a_bool_interval() -> None:
    for make in (RecThroughputMonitor, TieredTableMonitor, ManagedCollisionMonitor):
        with pytest.raises(ValueError, match="every_n_steps"):
            make(every_n_steps=True)


def test_quantized_export_writes_nothing_under_fast_dev_run(tmp_path: Path) -> None:
    export = QuantizedExport(every_n_epochs=1)
    _trainer(tmp_path, [export], fast_dev_run=True).fit(ToyDLRM(), datamodule=toy_data(BATCH, 4))
    assert export.paths == []
    assert not (tmp_path / "export").exists()


def test_quantized_export_exports_at_the_end_of_a_second_fit(tmp_path: Path) -> None:
    from lightrec.inference import load

    export, module, data = QuantizedExport(filename="model_{step}_{epoch}"), ToyDLRM(), toy_data(BATCH, 4)
    _trainer(tmp_path / "a", [export], max_steps=2, logger=False).fit(module, datamodule=data)
    _trainer(tmp_path / "b", [export], max_steps=2, logger=False).fit(module, datamodule=data)  # same step, 2
    assert [p.name for p in export.paths] == ["model_2_0.pt", "model_2_0.pt"]
    assert load(export.paths[-1]) is not None


@pytest.mark.parametrize(("every_n_epochs", "names"), [(None, ["m_e1.pt"]), (2, ["m_e1.pt", "m_e2.pt"])])
def test_quantized_export_names_the_fit_end_artifact_after_its_last_epoch(
    tmp_path: Path, every_n_epochs: int | None, names: list[str]
) -> None:
    epochs = 2 if every_n_epochs is None else 3  # epochs 0..epochs-1
    export = QuantizedExport(filename="m_e{epoch}", every_n_epochs=every_n_epochs)
    _trainer(tmp_path, [export], max_epochs=epochs, logger=False).fit(ToyDLRM(), datamodule=toy_data(BATCH, 2))
    assert [p.name for p in export.paths] == names
    meta = json.loads(Path(str(export.paths[-1]) + ".meta.json").read_text())
    assert (meta["epoch"], meta["global_step"]) == (epochs - 1, 2 * epochs)


def test_quantized_export_at_max_steps_mid_epoch_names_that_epoch(tmp_path: Path) -> None:
    export = QuantizedExport(filename="m_e{epoch}_s{step}")
    _trainer(tmp_path, [export], max_steps=3, logger=False).fit(ToyDLRM(), datamodule=toy_data(BATCH, 8))
    assert [p.name for p in export.paths] == ["m_e0_s3.pt"]  # 3 of epoch 0's 8 batches


def test_managed_collision_monitor_logs_its_last_window_at_the_step_of_its_last_batch(tmp_path: Path) -> None:
    from tests.lightning.test_managed_collisions import MC, ManagedDLRM, drifting_data

    steps, every = 5, 3  # windows: steps 0-2, then 3-4 at train end
    recorder, monitor = _Recorder(), ManagedCollisionMonitor(every_n_steps=every)
    module = ManagedDLRM(managed_collisions=MC, dense_optimizer="sgd", dense_lr=0.1)
    _trainer(tmp_path, [monitor], max_epochs=1, logger=recorder).fit(module, datamodule=drifting_data(steps=steps))
    assert recorder.steps_of("mc/occupancy") == [2, 4]
    assert recorder.steps_of("train/loss")[-1] == 4


def _tiered_fit(root: Path, every: int, **kwargs: Any) -> tuple[_Recorder, TieredTableMonitor]:
    """Fit a small DLRM with its tables on SSD; log with a recorder."""
    from lightrec.lightning import RecStrategy
    from lightrec.recipes.dlrm import DLRMModule

    recorder, monitor = _Recorder(), TieredTableMonitor(every_n_steps=every)
    module = DLRMModule(embedding_dim=8, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1],
                        tables_on="ssd", cache_load_factor=0.2, ssd_storage_directory=str(root / "rows"))  # fmt: skip
    _trainer(root, [monitor], strategy=RecStrategy(), logger=recorder, **kwargs).fit(
        module, datamodule=toy_data(BATCH, 8))
    return recorder, monitor


def test_tiered_monitor_logs_at_the_loss_steps_and_its_last_window_at_train_end(tmp_path: Path) -> None:
    recorder, _ = _tiered_fit(tmp_path, every=3, max_steps=7)
    # windows end at steps 2 and 5 (as train/loss numbers them); steps 6 is the last, shorter window
    assert recorder.steps_of("tiered/hit_rate") == [2, 5, 6]
    loss_steps = recorder.steps_of("train/loss")
    assert set(recorder.steps_of("tiered/hit_rate")) <= set(loss_steps)


def test_tiered_monitor_counts_optimizer_steps_under_gradient_accumulation(tmp_path: Path) -> None:
    # 8 batches, 2 per optimizer step: 4 steps, windows end at steps 1 and 3
    recorder, _ = _tiered_fit(tmp_path, every=2, max_epochs=1, accumulate_grad_batches=2)
    assert recorder.steps_of("tiered/hit_rate") == [1, 3]
    # every id of 2 steps x 2 batches is fetched at most once: rows per step <= ids of 2 batches
    assert all(v > 0 for v in recorder.values_of("tiered/rows_fetched_per_step"))


def test_mc_monitor_counts_optimizer_steps_under_gradient_accumulation(tmp_path: Path) -> None:
    from tests.lightning.test_managed_collisions import MC, ManagedDLRM, drifting_data

    # 6 batches, 2 per optimizer step: 3 steps, windows end at steps 1 and (train end) 2
    recorder, monitor = _Recorder(), ManagedCollisionMonitor(every_n_steps=2)
    module = ManagedDLRM(managed_collisions=MC, dense_optimizer="sgd", dense_lr=0.1)
    _trainer(tmp_path, [monitor], max_epochs=1, accumulate_grad_batches=2, logger=recorder).fit(
        module, datamodule=drifting_data(steps=6))
    assert recorder.steps_of("mc/occupancy") == [1, 2]
    assert recorder.steps_of("train/loss")[-1] == 2
