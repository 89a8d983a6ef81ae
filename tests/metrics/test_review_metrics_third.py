"""Third review of lightrec.metrics: R^2 with nothing seen or constant labels, the metric module's
compute-interval arguments, and GAUC next to torchrec's (``GAUCMetric``, the weighted pair AUC)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from lightrec.metrics.computation import MetricComputationReport
from lightrec.metrics.metric_module import RecMetricModule, generate_metric_module
from lightrec.metrics.metrics_config import MetricsConfig, RecTaskInfo
from lightrec.metrics.rec_metric import RecMetricException
from lightrec.metrics.regression import MSEMetricComputation


def values(reports: list[MetricComputationReport]) -> dict[str, list[float]]:
    return {f"{r.metric_prefix}{r.name}": r.value.tolist() for r in reports}


def r_squared(p: list[float] | None, y: list[float] | None, w: list[float] | None) -> dict[str, list[float]]:
    """The lifetime and window R^2 of one task after one batch (no batch: ``p`` None)."""
    metric = MSEMetricComputation(my_rank=0, batch_size=4, n_tasks=1, window_size=100, include_r_squared=True)
    if p is not None and y is not None and w is not None:
        metric.update(predictions=torch.tensor([p]), labels=torch.tensor([y]), weights=torch.tensor([w]))
    got = values(metric.compute())
    return {k: v for k, v in got.items() if k.endswith("r_squared")}


# ---------------------------------------------------------------------------------------------- R^2


def test_r_squared_is_zero_not_nan_with_no_sample_or_only_zero_weights() -> None:
    # MSE, RMSE and MAE report torchrec's 0 where no weight was seen; R^2 follows them
    assert r_squared(None, None, None) == {"lifetime_r_squared": [0.0], "window_r_squared": [0.0]}
    assert r_squared([0.1, 0.2], [0.3, 0.5], [0.0, 0.0]) == {
        "lifetime_r_squared": [0.0],
        "window_r_squared": [0.0],
    }


@pytest.mark.parametrize("label", [0.3, 300.44767548166374, 12345.678, -7.1])
def test_r_squared_of_constant_labels_is_one_despite_rounding(label: float) -> None:
    # sum w y^2 - (sum w y)^2 / sum w cancels to a rounding residue (1e-16 relative), not 0: dividing
    # the error by it gave R^2 of -5e14 or +6e15 instead of torchrec's 1 for labels that do not vary
    rng = random.Random(int(abs(label) * 1000))
    for n in (3, 7, 20, 35, 35, 64):
        w = [rng.uniform(0.01, 10.0) for _ in range(n)]
        p = [label + rng.uniform(-1.0, 1.0) for _ in range(n)]
        got = r_squared(p, [label] * n, w)
        assert got == {"lifetime_r_squared": [1.0], "window_r_squared": [1.0]}, (label, n, got)


def test_r_squared_of_labels_that_vary_little_is_still_computed() -> None:
    # labels 1000 +- 0.01 (relative spread 1e-10): the rounding guard must not swallow a real spread
    y = [1000.0 + d for d in (-0.01, 0.01, -0.01, 0.01)]
    p = [1000.0 + d for d in (-0.005, 0.005, 0.0, 0.02)]
    w = [1.0, 2.0, 1.0, 1.0]
    sw = sum(w)
    mean = sum(a * b for a, b in zip(y, w)) / sw
    want = 1 - sum(c * (a - b) ** 2 for a, b, c in zip(p, y, w)) / sum(
        c * (b - mean) ** 2 for b, c in zip(y, w)
    )
    metric = MSEMetricComputation(my_rank=0, batch_size=4, n_tasks=1, window_size=100, include_r_squared=True)
    metric.update(predictions=torch.tensor([p], dtype=torch.float64), labels=torch.tensor([y], dtype=torch.float64),
                  weights=torch.tensor([w], dtype=torch.float64))  # fmt: skip
    assert values(metric.compute())["lifetime_r_squared"] == pytest.approx([want], rel=1e-5)


# ---------------------------------------------------------------------------- compute intervals


@pytest.mark.parametrize(
    ("low", "high", "named", "shown"),
    [
        (-1.0, math.inf, "min_compute_interval", "-1.0"),
        (math.nan, math.inf, "min_compute_interval", "nan"),
        (math.inf, math.inf, "min_compute_interval", "inf"),
        (0.0, -5.0, "max_compute_interval", "-5.0"),
        (0.0, 0.0, "max_compute_interval", "0.0"),
        (0.0, math.nan, "max_compute_interval", "nan"),
        (30.0, 10.0, "min_compute_interval", "30.0"),
    ],
)
def test_metric_module_refuses_bad_compute_intervals(low: float, high: float, named: str, shown: str) -> None:
    with pytest.raises(RecMetricException, match=named) as caught:
        RecMetricModule(batch_size=4, world_size=1, min_compute_interval=low, max_compute_interval=high)
    assert isinstance(caught.value, ValueError)  # torchrec raises ValueError: `except ValueError` still works
    assert shown in str(caught.value) and "pass" in str(caught.value)  # the value and the fix
    config = MetricsConfig(rec_tasks=[RecTaskInfo()], min_compute_interval=low, max_compute_interval=high)
    with pytest.raises(RecMetricException, match=named):
        generate_metric_module(RecMetricModule, config, batch_size=4, world_size=1, my_rank=0,
                               state_metrics_mapping={}, device="cpu")  # fmt: skip


def test_metric_module_refuses_a_compute_interval_that_is_not_a_number() -> None:
    with pytest.raises(TypeError, match="min_compute_interval"):
        RecMetricModule(batch_size=4, world_size=1, min_compute_interval="10")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("low", "high"), [(0.0, math.inf), (0, 30), (1.0, 10.0), (5.0, math.inf), (10.0, 10.0)]
)
def test_metric_module_accepts_valid_compute_intervals(low: float, high: float) -> None:
    module = RecMetricModule(batch_size=4, world_size=1, min_compute_interval=low, max_compute_interval=high)
    assert module.compute_interval_steps == 100


# ------------------------------------------------------------------------------------------- GAUC


def _group_auc(p: list[float], y: list[int], w: list[float]) -> float:
    """Weighted share of (positive, negative) pairs ranked right (no ties in these groups)."""
    pairs = [(wi * wj, 1.0 if pi > pj else 0.0) for pi, yi, wi in zip(p, y, w) if yi == 1
             for pj, yj, wj in zip(p, y, w) if yj == 0]  # fmt: skip
    return sum(a * b for a, b in pairs) / sum(a for a, _ in pairs)


def test_gauc_metric_is_importable_at_torchrecs_path_and_computes_per_task() -> None:
    from lightrec.metrics.gauc import GAUCMetric

    tasks = [RecTaskInfo(name="click"), RecTaskInfo(name="like")]
    metric = GAUCMetric(world_size=1, my_rank=0, batch_size=7, tasks=tasks, window_size=100)
    p = [0.2, 0.7, 0.4, 0.9, 0.1, 0.3, 0.6]
    groups = [(0, 3), (3, 7)]
    y = {"click": [0, 1, 1, 1, 0, 0, 1], "like": [1, 0, 0, 0, 0, 1, 1]}
    w = {"click": [1.0, 2.0, 1.0, 1.0, 3.0, 1.0, 1.0], "like": [1.0] * 7}
    metric.update(
        predictions={t: torch.tensor([p]) for t in y},  # torchrec's tests pass [1, B] per task
        labels={t: torch.tensor([v], dtype=torch.float64) for t, v in y.items()},
        weights={t: torch.tensor([v]) for t, v in w.items()},
        num_candidates=torch.tensor([3, 4]),
    )
    got = metric.compute()
    for task in y:
        aucs = [_group_auc(p[lo:hi], y[task][lo:hi], w[task][lo:hi]) for lo, hi in groups]
        want = (sum(aucs) + 1e-9) / (len(aucs) + 2e-9)
        for prefix in ("lifetime_", "window_"):
            assert float(got[f"gauc-{task}|{prefix}gauc"]) == pytest.approx(want), task
            assert float(got[f"gauc-{task}|{prefix}gauc_num_samples"]) == 2.0
    # torchrec's RecMetricModule hands num_candidates over in required_inputs
    metric.reset()
    metric.update(predictions=torch.tensor(p[:3]), labels=torch.tensor(y["click"][:3], dtype=torch.float64),
                  weights=None, required_inputs={"num_candidates": torch.tensor([3])})  # fmt: skip
    assert float(metric.compute()["gauc-click|lifetime_gauc"]) == pytest.approx(
        _group_auc(p[:3], [0, 1, 1], [1.0] * 3)
    )


def test_gauc_metric_without_num_candidates_says_what_to_pass() -> None:
    from lightrec.metrics.gauc import GAUCMetric

    metric = GAUCMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo()])
    with pytest.raises(RecMetricException, match="num_candidates"):
        metric.update(predictions=torch.tensor([0.1, 0.9]), labels=torch.tensor([0.0, 1.0]), weights=None)
