"""torchrec's metric entry points (RecMetricModule, generate_metric_module, RecTaskInfo,
RecMetricEnum, ThroughputMetric): keys, lifetime and window values against formulas computed here,
and on 2 gloo ranks against one process fed every rank's samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightrec.metrics.metric_module import RecMetricModule, StateMetric, generate_metric_module
from lightrec.metrics.metrics_config import (
    MetricsConfig,
    RecMetricDef,
    RecMetricEnum,
    RecTaskInfo,
    StateMetricEnum,
    ThroughputDef,
)
from lightrec.metrics.rec_metric import RecMetricException
from lightrec.metrics.throughput import ThroughputMetric
from tests.metrics.references import auc_pairs
from tests.metrics.test_binary_metrics import make_data, reference
from tests.multiprocess import run_ranks

TASKS = [RecTaskInfo(name="click", label_name="y", prediction_name="p", weight_name="w"),
         RecTaskInfo(name="rating", label_name="r", prediction_name="rp", weight_name="rw", weighted=False)]  # fmt: skip
SIZES = [30, 25, 41]


def _config(window: int) -> MetricsConfig:
    return MetricsConfig(
        rec_tasks=TASKS,
        rec_metrics={
            RecMetricEnum.NE: RecMetricDef(rec_task_indices=[0], window_size=window),
            RecMetricEnum.AUC: RecMetricDef(rec_task_indices=[0], window_size=window),
            RecMetricEnum.CALIBRATION: RecMetricDef(rec_task_indices=[0], window_size=window),
            RecMetricEnum.CTR: RecMetricDef(rec_task_indices=[0], window_size=window),
            RecMetricEnum.MSE: RecMetricDef(rec_tasks=[TASKS[1]], window_size=window),
        },
        throughput_metric=ThroughputDef(window_size=100, warmup_steps=1),
        compute_interval_steps=3,
    )


def _data(seed: int) -> list[dict[str, torch.Tensor]]:
    preds, labels, weights = make_data(sum(SIZES), seed=seed, ties=True, weighted=True)
    g = torch.Generator().manual_seed(seed + 1)
    ratings = torch.randint(1, 6, (sum(SIZES),), generator=g).float()
    rating_preds = ratings + torch.randn(sum(SIZES), generator=g)
    return [
        {"p": p, "y": y, "w": w, "r": r, "rp": rp}
        for p, y, w, r, rp in zip(*(t.split(SIZES) for t in (preds, labels, weights, ratings, rating_preds)))
    ]


def _feed(module: RecMetricModule, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    for b in batches:
        module.update(b)
    assert module.should_compute()  # 3 updates, compute_interval_steps=3
    return {k: float(v) for k, v in module.compute().items()}


def _expected(batches: list[dict[str, torch.Tensor]], prefix: str) -> dict[str, float]:
    cat = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    p, y, w = cat["p"], cat["y"], cat["w"]
    mse = float(((cat["rp"] - cat["r"]) ** 2).mean())
    return {
        f"ne-click|{prefix}ne": reference("ne", p, y, w),
        f"auc-click|{prefix}auc": auc_pairs(p.numpy(), y.numpy(), w.numpy()),
        f"calibration-click|{prefix}calibration": reference("calibration", p, y, w),
        f"ctr-click|{prefix}ctr": reference("ctr", p, y, w),
        f"mse-rating|{prefix}mse": mse,
        f"mse-rating|{prefix}rmse": math.sqrt(mse),
    }


def test_lifetime_and_window_values_and_keys() -> None:
    batches = _data(0)
    # window 60 samples (one rank): the last two batches (25 + 41 > 60 keeps only the last one).
    module = generate_metric_module(RecMetricModule, _config(60), batch_size=41, world_size=1, my_rank=0,
                                    state_metrics_mapping={}, device="cpu")  # fmt: skip
    values = _feed(module, batches)
    for key, want in {**_expected(batches, "lifetime_"), **_expected(batches[-1:], "window_")}.items():
        assert values[key] == pytest.approx(want, rel=1e-5), key
    assert values["throughput-throughput|total_examples"] == 3 * 41
    assert values["throughput-throughput|lifetime_throughput"] > 0
    assert module.rec_tasks[0].name == "click"


def _ranks_body(rank: int, world_size: int) -> dict[str, float]:
    module = generate_metric_module(RecMetricModule, _config(10_000), batch_size=41, world_size=world_size,
                                    my_rank=rank, state_metrics_mapping={}, device="cpu")  # fmt: skip
    return _feed(module, _data(10 * rank))


def test_two_ranks_equal_one_process_on_all_samples() -> None:
    results = run_ranks(_ranks_body, world_size=2, timeout=240)
    everything = _data(0) + _data(10)
    want = {**_expected(everything, "lifetime_"), **_expected(everything, "window_")}
    for values in results:
        for key, value in want.items():
            assert values[key] == pytest.approx(value, rel=1e-5), key
        assert values["throughput-throughput|total_examples"] == 3 * 41 * 2


class _Optimizer(StateMetric):
    def get_metrics(self) -> dict[str, torch.Tensor | float]:
        return {"lr": 0.5}


def test_state_metrics_and_errors() -> None:
    config = MetricsConfig(rec_tasks=TASKS[:1], rec_metrics={RecMetricEnum.NE: RecMetricDef(rec_task_indices=[0])},
                           state_metrics=[StateMetricEnum.OPTIMIZERS])  # fmt: skip
    module = generate_metric_module(RecMetricModule, config, 4, 1, 0, {StateMetricEnum.OPTIMIZERS: _Optimizer()}, "cpu")
    module.update({"p": torch.full((4,), 0.5), "y": torch.tensor([0.0, 1.0, 1.0, 0.0])})  # no "w": weight 1
    values = module.compute()
    assert values["optimizers-optimizers|lr"] == 0.5 and float(values["ne-click|lifetime_ne"]) == pytest.approx(1.0)
    with pytest.raises(RecMetricException, match="lacks \\['y'\\] for task 'click'"):
        module.update({"p": torch.ones(4)})
    bad = MetricsConfig(rec_tasks=TASKS, rec_metrics={RecMetricEnum.NDCG: RecMetricDef(rec_task_indices=[0])})
    with pytest.raises(RecMetricException, match="NDCG"):
        generate_metric_module(RecMetricModule, bad, 4, 1, 0, {}, "cpu")
    both = MetricsConfig(rec_tasks=TASKS, rec_metrics={RecMetricEnum.NE: RecMetricDef(TASKS, [0])})
    with pytest.raises(RecMetricException, match="exactly one of rec_tasks and rec_task_indices"):
        generate_metric_module(RecMetricModule, both, 4, 1, 0, {}, "cpu")
    with pytest.raises(KeyError, match="state_metrics_mapping"):
        generate_metric_module(RecMetricModule, MetricsConfig(state_metrics=[StateMetricEnum.OPTIMIZERS]), 4, 1, 0, {},
                               "cpu")  # fmt: skip


def test_throughput_metric_counts_after_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(np.arange(0.0, 100.0, 0.5))  # every update is 0.5 s after the previous one
    monkeypatch.setattr("lightrec.metrics.throughput.time.monotonic", lambda: float(next(clock)))
    metric = ThroughputMetric(batch_size=8, world_size=2, window_seconds=1, warmup_steps=2)
    metric.update()
    metric.update()
    assert set(metric.compute()) == {"throughput-throughput|total_examples"}
    for _ in range(4):
        metric.update()
    out = metric.compute()
    assert int(out["throughput-throughput|total_examples"]) == 6 * 16
    assert float(out["throughput-throughput|lifetime_throughput"]) == pytest.approx(4 * 16 / 2.0)
    assert float(out["throughput-throughput|window_throughput"]) == pytest.approx(2 * 16 / 1.0)  # last 1 s
    with pytest.raises(ValueError, match="warmup_steps must be >= 1"):
        ThroughputMetric(batch_size=1, world_size=1, window_seconds=1, warmup_steps=0)


def test_torchrec_per_metric_classes_compute_what_rec_metric_does() -> None:
    """``NEMetric``, ``AUCMetric``, ... at torchrec's paths, built with torchrec's constructor (its own arguments
    accepted and ignored), report the keys and values of ``RecMetric`` of their enum on the same batches."""
    from lightrec.metrics.accuracy import AccuracyMetric
    from lightrec.metrics.auc import AUCMetric
    from lightrec.metrics.calibration import CalibrationMetric
    from lightrec.metrics.ctr import CTRMetric
    from lightrec.metrics.mae import MAEMetric
    from lightrec.metrics.metrics_config import RecComputeMode
    from lightrec.metrics.mse import MSEMetric
    from lightrec.metrics.ne import LogLossMetric, NEMetric
    from lightrec.metrics.rec_metric import RecMetric

    task = TASKS[0]
    batches = _data(3)
    classes = [NEMetric, LogLossMetric, AUCMetric, CalibrationMetric, CTRMetric, MSEMetric, MAEMetric, AccuracyMetric]
    for cls in classes:
        named = cls(world_size=1, my_rank=0, batch_size=64, tasks=[task], compute_mode=RecComputeMode.UNFUSED_TASKS_COMPUTATION,
                    window_size=50, fused_update_limit=0, compute_on_all_ranks=True)  # fmt: skip
        plain = RecMetric(cls.metric, 1, 0, 64, [task], window_size=50)
        for b in batches:
            for m in (named, plain):
                m.update(predictions={"click": b["p"]}, labels={"click": b["y"]}, weights={"click": b["w"]})
        got, want = named.compute(), plain.compute()
        assert sorted(got) == sorted(want) and any(f"{cls.metric.value}-click|window_" in k for k in got), (cls, got)
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=0, equal_nan=True)
