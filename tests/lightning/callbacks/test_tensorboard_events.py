"""TensorBoard event files of a 2-rank RecStrategy fit hold the loss, metrics, throughput, memory and plan.

The event files are read back with tensorboard's own ``EventAccumulator``, as TensorBoard does.
"""

from __future__ import annotations

import io
import logging
import os

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from tests.lightning.toy import DIM, ToyDLRM, toy_data
from tests.multiprocess import free_port, run_ranks, set_torchrun_env

STEPS = 4  # per rank; one epoch, then the validation loop (AUC, NE ...)
BATCH = 32  # per rank
EVERY = 2  # RecThroughputMonitor window
FUSED = {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1}


def _events(log_dir: str):  # noqa: ANN202 - EventAccumulator
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    return EventAccumulator(log_dir, size_guidance={"scalars": 0, "tensors": 0, "images": 0}).Reload()


def _text(events, tag: str) -> str:  # noqa: ANN001
    from tensorboard.util import tensor_util

    value = tensor_util.make_ndarray(events.Tensors(f"{tag}/text_summary")[-1].tensor_proto).item()
    return value.decode() if isinstance(value, bytes) else str(value)


def _local_embedding_bytes(plan, rank: int, world_size: int) -> int:  # noqa: ANN001
    """fp32 bytes of the shards the plan puts on ``rank`` plus every data-parallel replica."""
    total = 0
    for module_plan in plan.plan.values():
        for ps in module_plan.values():
            for shard in ps.sharding_spec or []:
                if ps.sharding_type == "data_parallel" or shard.rank == rank:
                    total += shard.shard_sizes[0] * shard.shard_sizes[1] * 4
    return total


def _fit(rank: int, world_size: int, port: int, log_dir: str) -> dict:
    set_torchrun_env(rank, world_size, port)
    from lightrec.lightning import RecStrategy, RecThroughputMonitor
    from lightrec.lightning.callbacks.plan_report import PlanReport

    console = io.StringIO()  # what PlanReport prints (through Lightning's console logger)
    handler = logging.StreamHandler(console)
    logging.getLogger("lightning.pytorch").addHandler(handler)
    monitor, report = RecThroughputMonitor(every_n_steps=EVERY), PlanReport()
    seen: dict = {}

    class RecordPlan(pl.Callback):  # the strategy forgets its plan at teardown
        def on_fit_start(self, trainer, module) -> None:  # noqa: ANN001
            seen["plan"] = trainer.strategy.plan

    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, max_epochs=1, num_sanity_val_steps=0, log_every_n_steps=1,
        strategy=RecStrategy(fused_params=FUSED),
        logger=pl.loggers.TensorBoardLogger(log_dir, name="tb", version=0),
        callbacks=[report, monitor, RecordPlan()], enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    module = ToyDLRM(device="meta", dense_optimizer="sgd", dense_lr=0.1)
    trainer.fit(module, datamodule=toy_data(batch_size=BATCH, num_train_batches=STEPS * world_size))
    logging.getLogger("lightning.pytorch").removeHandler(handler)
    plan = seen["plan"]
    expected = torch.tensor(float(_local_embedding_bytes(plan, rank, world_size)))
    gathered = trainer.strategy.all_gather(expected)
    shown = report.report  # what PlanReport drew (rank 0 only)
    return {
        "plan_json": plan.to_json(),
        "shown": None if shown is None else {"cost_s": shown.cost_s, "ddr_bytes": shown.ddr_bytes},
        "console": console.getvalue(),
        "expected_shard_mib": float(gathered.max()) / 1024**2,
        "last_metrics": monitor.last_metrics,
    }


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):  # noqa: ANN001, ANN201
    log_dir = str(tmp_path_factory.mktemp("tb_events"))
    ranks = run_ranks(_fit, 2, args=(free_port(), log_dir), timeout=240)
    return ranks, _events(os.path.join(log_dir, "tb", "version_0"))


def test_events_hold_loss_metrics_and_throughput(two_rank_run) -> None:  # noqa: ANN001
    _, events = two_rank_run
    tags = set(events.Tags()["scalars"])
    for tag in ("train/loss", "val/loss", "val/auc", "val/ne", "val/calibration", "train/samples_per_sec",
                "monitor/samples_per_sec", "monitor/step_time_ms", "monitor/peak_rss_mib",
                "monitor/embedding_shard_mib", "monitor/embedding_optimizer_state_mib"):  # fmt: skip
        assert tag in tags, sorted(tags)
    assert not any(t.startswith("monitor/cuda") for t in tags)  # CPU run: no CUDA figures
    assert len(events.Scalars("train/loss")) == STEPS
    auc = events.Scalars("val/auc")[-1].value
    assert 0.0 <= auc <= 1.0 and events.Scalars("val/ne")[-1].value > 0


def test_the_run_metric_of_the_hparams_tab_is_the_validation_auc(two_rank_run) -> None:  # noqa: ANN001
    """Issue 23: TensorBoard's HPARAMS tab showed Lightning's placeholder ``hp_metric = -1`` for every
    run. RecModule logs the validation AUC as ``hp_metric`` at each validation, so the tab compares
    runs by it (the placeholder stays as the value at step 0, before any validation)."""
    _, events = two_rank_run
    hp = events.Scalars("hp_metric")
    auc = events.Scalars("val/auc")
    assert [e.value for e in hp[1:]] == [e.value for e in auc] and [e.step for e in hp[1:]] == [e.step for e in auc]
    assert hp[0].value == -1 and hp[0].step == 0  # Lightning's declaration of the metric when fitting starts


def test_monitor_counts_global_samples_and_local_shards(two_rank_run) -> None:  # noqa: ANN001
    ranks, events = two_rank_run
    rate = events.Scalars("monitor/samples_per_sec")
    step_ms = events.Scalars("monitor/step_time_ms")
    # logged at the step of the window's last batch, as train/loss is
    assert [e.step for e in rate] == [EVERY * (i + 1) - 1 for i in range(STEPS // EVERY)]
    assert [e.step for e in events.Scalars("train/loss")] == list(range(STEPS))
    for r, t in zip(rate, step_ms):
        # samples/s x seconds of the window = samples of both ranks in the window
        assert r.value * t.value / 1e3 * EVERY == pytest.approx(2 * BATCH * EVERY, rel=1e-4)
    shard_mib = events.Scalars("monitor/embedding_shard_mib")[-1].value
    assert shard_mib == pytest.approx(ranks[0]["expected_shard_mib"], rel=1e-6)
    assert 10 < events.Scalars("monitor/peak_rss_mib")[-1].value < 1e6
    # every rank holds the same gathered figures
    assert ranks[0]["last_metrics"] == ranks[1]["last_metrics"]


def test_events_hold_the_plan(two_rank_run) -> None:  # noqa: ANN001
    from lightrec.distributed.types import ShardingPlan
    from lightrec.lightning.callbacks.plan_report import load_plan_from_events

    ranks, events = two_rank_run
    plan = ShardingPlan.from_json(ranks[0]["plan_json"])
    table = _text(events, "plan/table")
    names = [name for module_plan in plan.plan.values() for name in module_plan]
    assert len(names) == 26
    for name in names:
        assert f"| {name} |" in table, name
    assert "| rank |" in table and "imbalance" in table
    json_text = _text(events, "plan/json")
    assert json_text.startswith("```json\n") and json_text.endswith("\n```")
    assert ShardingPlan.from_json(json_text[len("```json\n") : -len("\n```")]) == plan
    assert load_plan_from_events(events.path) == plan
    (image,) = events.Images("plan/chart")
    assert image.width >= 400 and image.height >= 400
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(image.encoded_image_string)))
    assert pixels.std() > 0  # drawn, not blank
    # the report is the planner's estimate of this plan on the unsharded model (optimizer state included)
    from lightrec.distributed import EmbeddingBagCollectionSharder
    from lightrec.distributed.planner import EmbeddingShardingPlanner, Topology

    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"))
    expected = planner.evaluate(ToyDLRM(device="meta"), [EmbeddingBagCollectionSharder(FUSED)], plan)
    shown = ranks[0]["shown"]
    assert ranks[1]["shown"] is None
    np.testing.assert_allclose(shown["cost_s"], expected.cost_s, rtol=1e-12)
    np.testing.assert_allclose(shown["ddr_bytes"], expected.ddr_bytes, rtol=1e-12)
    assert expected.ddr_bytes.sum() > 26 * 8 * 4 * 150  # weights and the row-wise Adagrad state
    # rank 0 printed the per-rank table, rank 1 printed nothing
    assert "rank | HBM used / cap" in ranks[0]["console"] and "tables on 2 ranks" in ranks[0]["console"]
    assert "HBM used" not in ranks[1]["console"]


def test_without_rec_strategy_plan_report_says_so_once_and_logs_nothing(tmp_path, caplog) -> None:  # noqa: ANN001
    from lightrec.lightning import RecThroughputMonitor
    from lightrec.lightning.callbacks.plan_report import PlanReport

    report, monitor = PlanReport(), RecThroughputMonitor(every_n_steps=3)

    def fit(version: int) -> None:
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_steps=4, limit_val_batches=0, num_sanity_val_steps=0,
            logger=pl.loggers.TensorBoardLogger(tmp_path, name="tb", version=version), callbacks=[report, monitor],
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(ToyDLRM(), datamodule=toy_data(num_train_batches=4))

    import logging

    with caplog.at_level(logging.INFO):
        fit(0)
        fit(1)  # the same callbacks in a second fit: no second line
    # one info line, not a warning: a recipe config lists the callback, and one-process runs are normal
    assert sum("does not shard the model" in r.getMessage() for r in caplog.records) == 1
    assert report.report is None
    events = _events(str(tmp_path / "tb" / "version_0"))
    assert not [t for t in events.Tags()["tensors"] if t.startswith("plan/")] and not events.Tags()["images"]
    # unsharded model: the monitor counts every table in full; windows of 3 steps, then the rest
    tables = toy_data().table_configs(DIM)
    full_mib = sum(t.num_embeddings * t.embedding_dim * 4 for t in tables) / 1024**2
    shard = events.Scalars("monitor/embedding_shard_mib")
    assert [e.step for e in shard] == [2, 3]
    assert shard[-1].value == pytest.approx(full_mib, rel=1e-6)
    assert events.Scalars("monitor/embedding_optimizer_state_mib")[-1].value == 0.0


def test_plan_the_cost_model_cannot_estimate_is_still_logged(tmp_path) -> None:  # noqa: ANN001
    """A strategy whose plan puts a table on a rank the world does not have: warned, table and JSON logged."""
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from lightrec.distributed.planner import construct_module_sharding_plan, table_wise
    from lightrec.distributed.types import ShardingPlan
    from lightrec.lightning.callbacks.plan_report import PlanReport, load_plan_from_events

    ebc = ToyDLRM(device="meta").model.sparse_arch.embedding_bag_collection
    per_table = {t.name: table_wise(rank=1) for t in ebc.embedding_bag_configs()}
    module_plan = construct_module_sharding_plan(
        ebc, per_table, world_size=2, local_size=2, device_type="cpu"
    )
    plan = ShardingPlan({"model.sparse_arch.embedding_bag_collection": module_plan})

    class WithPlan(SingleDeviceStrategy):  # one rank, but a plan for two
        def __init__(self) -> None:
            super().__init__(device=torch.device("cpu"))
            self.plan = plan

    report = PlanReport()
    trainer = pl.Trainer(
        accelerator="cpu", strategy=WithPlan(), max_steps=1, limit_val_batches=0, num_sanity_val_steps=0,
        logger=pl.loggers.TensorBoardLogger(tmp_path, name="tb", version=0), callbacks=[report],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with pytest.warns(UserWarning, match="could not estimate the plan .*rank 1"):
        trainer.fit(ToyDLRM(), datamodule=toy_data(num_train_batches=1))
    assert report.report is None
    events = _events(str(tmp_path / "tb" / "version_0"))
    table = _text(events, "plan/table")
    assert all(name in table for name in per_table)
    assert load_plan_from_events(events.path) == plan
    assert not events.Tags()["images"]


@pytest.mark.gpu
def test_monitor_logs_cuda_memory_on_a_gpu(tmp_path) -> None:  # noqa: ANN001
    from lightning.pytorch.demos.boring_classes import BoringModel

    from lightrec.lightning import RecThroughputMonitor

    monitor = RecThroughputMonitor(every_n_steps=2)
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_steps=4, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
        callbacks=[monitor], enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(BoringModel())
    metrics = monitor.last_metrics
    assert metrics["monitor/cuda_max_allocated_mib"] > 0
    assert metrics["monitor/cuda_max_reserved_mib"] >= metrics["monitor/cuda_max_allocated_mib"]
    assert metrics["monitor/embedding_shard_mib"] == 0.0  # no embedding collection
    assert metrics["monitor/samples_per_sec"] > 0


def test_a_test_after_fit_keeps_the_validation_auc_as_the_run_metric(tmp_path) -> None:  # noqa: ANN001
    """Issue 23: the recipes test after fit with the same Trainer, and each stage's start wrote
    Lightning's placeholder ``hp_metric = -1`` again, after the validation AUC. TensorBoard's HPARAMS
    tab shows a run's last ``hp_metric``, so it showed -1. Once fitted, a RecModule stops the
    placeholder: the last ``hp_metric`` is the validation AUC."""
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, num_sanity_val_steps=0, log_every_n_steps=1,
        logger=pl.loggers.TensorBoardLogger(str(tmp_path), name="tb", version=0), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    module, data = ToyDLRM(dense_optimizer="sgd", dense_lr=0.1), toy_data(batch_size=32, num_train_batches=2)
    trainer.fit(module, datamodule=data)
    trainer.test(module, datamodule=data)
    events = _events(os.path.join(str(tmp_path), "tb", "version_0"))
    hp = events.Scalars("hp_metric")
    assert hp[-1].value == events.Scalars("val/auc")[-1].value != -1
    assert [e.value for e in hp].count(-1) == 1  # the fit's declaration of the metric, at step 0
    assert "test/auc" in events.Tags()["scalars"]
