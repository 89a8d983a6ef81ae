"""torchrec's metric computations (issue 37): ``RecMetricComputation`` and the NE, accuracy, GAUC,
MAE and MSE computations at torchrec's paths, used the way generative-recommenders' metrics logger
uses them -- built per mode, ``update(predictions=, labels=, weights=[, num_candidates=])`` with
``[n_tasks, B]`` tensors, ``compute()`` read as ``metric/{prefix}{name}/{task}`` -- against their
definitions written out on hand-made data, windowed, and on 2 gloo ranks."""

from __future__ import annotations

import math

import pytest
import torch

from lightrec.metrics.accuracy import AccuracyMetricComputation
from lightrec.metrics.gauc import GAUCMetricComputation
from lightrec.metrics.mae import MAEMetricComputation
from lightrec.metrics.mse import MSEMetricComputation
from lightrec.metrics.ne import NEMetricComputation
from lightrec.metrics.rec_metric import MetricComputationReport, RecMetricComputation, RecMetricException
from tests.multiprocess import run_ranks

TASKS = ["click", "like"]


# ------------------------------------------------------------------ the definitions, written out
def ne_def(p: list[float], y: list[float], w: list[float]) -> float:
    ce = sum(-wi * (yi * math.log(pi) + (1 - yi) * math.log(1 - pi)) for pi, yi, wi in zip(p, y, w))
    ctr = sum(wi * yi for yi, wi in zip(y, w)) / sum(w)
    return ce / sum(w) / -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr))


def accuracy_def(p: list[float], y: list[float], w: list[float], t: float = 0.5) -> float:
    return sum(wi for pi, yi, wi in zip(p, y, w) if (pi >= t) == (yi == 1)) / sum(w)


def mse_def(p: list[float], y: list[float], w: list[float]) -> float:
    return sum(wi * (pi - yi) ** 2 for pi, yi, wi in zip(p, y, w)) / sum(w)


def mae_def(p: list[float], y: list[float], w: list[float]) -> float:
    return sum(wi * abs(pi - yi) for pi, yi, wi in zip(p, y, w)) / sum(w)


def auc_def(p: list[float], y: list[float], w: list[float]) -> float:
    """Weighted pairwise AUC, a tie counting one half."""
    num = sum(
        wi * wj * (1.0 if pi > pj else 0.5 if pi == pj else 0.0)
        for pi, yi, wi in zip(p, y, w) if yi == 1
        for pj, yj, wj in zip(p, y, w) if yj == 0
    )  # fmt: skip
    return num / (sum(wi for yi, wi in zip(y, w) if yi == 1) * sum(wi for yi, wi in zip(y, w) if yi == 0))


def gauc_def(groups: list[tuple[list[float], list[float], list[float]]]) -> tuple[float, int]:
    counted = [auc_def(*g) for g in groups if 0 < sum(g[1]) < len(g[1]) and len(set(g[0])) > 1]
    return (sum(counted) + 1e-9) / (len(counted) + 2e-9), len(counted)


def values(reports: list[MetricComputationReport]) -> dict[str, list[float]]:
    return {f"{r.metric_prefix}{r.name}": r.value.tolist() for r in reports}


# two tasks, three batches of 4 samples; task 1's labels and weights differ from task 0's
P = torch.tensor([[0.9, 0.2, 0.6, 0.4, 0.7, 0.1, 0.5, 0.8, 0.3, 0.95, 0.45, 0.05],
                  [0.1, 0.8, 0.5, 0.6, 0.3, 0.9, 0.2, 0.4, 0.7, 0.35, 0.65, 0.55]], dtype=torch.float64)
Y = torch.tensor([[1, 0, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0],
                  [0, 1, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1]], dtype=torch.float64)
W = torch.tensor([[1, 2, 1, 1, 3, 1, 1, 2, 1, 1, 2, 1],
                  [2, 1, 1, 1, 1, 1, 2, 1, 1, 3, 1, 1]], dtype=torch.float64)  # fmt: skip


def _columns(t: int, lo: int, hi: int) -> tuple[list[float], list[float], list[float]]:
    return P[t, lo:hi].tolist(), Y[t, lo:hi].tolist(), W[t, lo:hi].tolist()


def _feed(metric: RecMetricComputation, sizes: list[int] | None = None) -> None:
    start = 0
    for size in sizes or [4, 4, 4]:
        metric.update(predictions=P[:, start:start + size], labels=Y[:, start:start + size],
                      weights=W[:, start:start + size])  # fmt: skip
        start += size


@pytest.mark.parametrize(
    ("cls", "name", "definition"),
    [(NEMetricComputation, "ne", ne_def), (AccuracyMetricComputation, "accuracy", accuracy_def),
     (MSEMetricComputation, "mse", mse_def), (MAEMetricComputation, "mae", mae_def)],
)  # fmt: skip
def test_each_computation_equals_its_definition_lifetime_and_window(cls: type, name: str, definition) -> None:  # type: ignore[no-untyped-def]
    metric = cls(my_rank=0, batch_size=4, n_tasks=2, window_size=8)  # the window: the last two batches
    _feed(metric)
    got = values(metric.compute())
    for t in range(2):
        assert got[f"lifetime_{name}"][t] == pytest.approx(definition(*_columns(t, 0, 12)), rel=1e-9)
        assert got[f"window_{name}"][t] == pytest.approx(definition(*_columns(t, 4, 12)), rel=1e-9)


def test_mse_reports_rmse_and_r_squared_and_ne_logloss() -> None:
    mse = MSEMetricComputation(my_rank=0, batch_size=4, n_tasks=2, window_size=100, include_r_squared=True)
    _feed(mse)
    got = values(mse.compute())
    assert [f"{r.metric_prefix}{r.name}" for r in mse.compute()] == [
        "lifetime_mse", "lifetime_rmse", "window_mse", "window_rmse", "lifetime_r_squared", "window_r_squared"]
    for t in range(2):
        p, y, w = _columns(t, 0, 12)
        mean = sum(wi * yi for yi, wi in zip(y, w)) / sum(w)
        total = sum(wi * (yi - mean) ** 2 for yi, wi in zip(y, w))
        assert got["lifetime_rmse"][t] == pytest.approx(math.sqrt(mse_def(p, y, w)))
        assert got["lifetime_r_squared"][t] == pytest.approx(1 - mse_def(p, y, w) * sum(w) / total)
    ne = NEMetricComputation(my_rank=0, batch_size=4, n_tasks=2, window_size=100, include_logloss=True)
    _feed(ne)
    logloss = values(ne.compute())["lifetime_logloss"]
    p, y, w = _columns(0, 0, 12)
    bits = sum(-wi * (yi * math.log2(pi) + (1 - yi) * math.log2(1 - pi)) for pi, yi, wi in zip(p, y, w)) / sum(w)
    assert logloss[0] == pytest.approx(bits)  # torchrec's log loss is in bits


def test_window_drops_the_oldest_batches_but_keeps_the_newest_one() -> None:
    metric = MAEMetricComputation(my_rank=0, batch_size=4, n_tasks=2, window_size=5)
    _feed(metric, [2, 2, 2, 6])  # 2+2 <= 5 < 2+2+2; then one batch larger than the window
    got = values(metric.compute())
    assert got["window_mae"][1] == pytest.approx(mae_def(*_columns(1, 6, 12)))  # only the newest batch
    metric.reset()
    _feed(metric, [2, 2, 2])
    assert values(metric.compute())["window_mae"][0] == pytest.approx(mae_def(*_columns(0, 2, 6)))
    assert values(metric.compute())["lifetime_mae"][0] == pytest.approx(mae_def(*_columns(0, 0, 6)))


def test_gauc_equals_the_mean_auc_of_the_groups_that_count() -> None:
    # groups: clean ranking (AUC 1), reversed (0), all predictions equal (skipped), one class
    # (skipped), a tie across classes (0.75), weighted (by the definition)
    groups = [([0.9, 0.1, 0.5], [1, 0, 0], [1, 1, 1]), ([0.2, 0.8], [1, 0], [1, 1]),
              ([0.3, 0.3], [1, 0], [1, 1]), ([0.6, 0.7], [1, 1], [1, 1]),
              ([0.5, 0.5, 0.1], [1, 0, 0], [1, 1, 1]), ([0.7, 0.6, 0.5, 0.4], [1, 0, 1, 0], [2, 1, 3, 1])]  # fmt: skip
    flat = [sum((list(g[i]) for g in groups), []) for i in range(3)]
    sizes = torch.tensor([len(g[0]) for g in groups])
    gauc = GAUCMetricComputation(my_rank=0, batch_size=16, n_tasks=1, window_size=100)
    gauc.update(predictions=torch.tensor([flat[0]]), labels=torch.tensor([flat[1]]), weights=torch.tensor([flat[2]]),
                num_candidates=sizes)  # fmt: skip
    want, counted = gauc_def(groups)
    assert auc_def(*groups[4]) == 0.75 and counted == 4
    got = values(gauc.compute())
    assert got["lifetime_gauc"] == pytest.approx([want]) and got["lifetime_gauc_num_samples"] == [4.0]
    # a second batch: lifetime over both, window over the newest only (window_size < both batches)
    small = GAUCMetricComputation(my_rank=0, batch_size=16, n_tasks=1, window_size=5)
    small.update(predictions=torch.tensor([flat[0]]), labels=torch.tensor([flat[1]]), weights=torch.tensor([flat[2]]),
                 num_candidates=sizes)  # fmt: skip
    small.update(predictions=torch.tensor([[0.2, 0.8]]), labels=torch.tensor([[1.0, 0.0]]),
                 weights=torch.ones(1, 2), num_candidates=torch.tensor([2]))  # fmt: skip
    got = values(small.compute())
    assert got["lifetime_gauc"] == pytest.approx([gauc_def([*groups, ([0.2, 0.8], [1, 0], [1, 1])])[0]])
    assert got["window_gauc"] == pytest.approx([0.0], abs=1e-8) and got["window_gauc_num_samples"] == [1.0]
    with pytest.raises(RecMetricException, match="add up to the 16 samples"):
        gauc.update(predictions=torch.tensor([flat[0]]), labels=torch.tensor([flat[1]]), weights=None,
                    num_candidates=torch.tensor([3, 3]))  # fmt: skip


def test_errors_name_the_shapes() -> None:
    metric = MSEMetricComputation(my_rank=0, batch_size=4, n_tasks=2, window_size=10)
    with pytest.raises(RecMetricException, match=r"\[n_tasks, batch\] = \[2, B\]"):
        metric.update(predictions=torch.rand(4), labels=torch.rand(4), weights=None)
    with pytest.raises(RecMetricException, match="needs predictions"):
        metric.update(predictions=None, labels=torch.rand(2, 4), weights=None)


class _MeanPrediction(RecMetricComputation):
    """A metric of one's own, written against torchrec's base class contract."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._add_state("prediction_sum", torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=True,
                        dist_reduce_fx="sum", persistent=True)  # fmt: skip
        self._add_state("count", torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=True,
                        dist_reduce_fx="sum", persistent=True)  # fmt: skip

    def update(self, *, predictions, labels, weights, **kwargs) -> None:  # type: ignore[no-untyped-def]
        states = {"prediction_sum": predictions.double().sum(-1),
                  "count": torch.full((self._n_tasks,), float(predictions.shape[-1]), dtype=torch.double)}  # fmt: skip
        for name, value in states.items():
            getattr(self, name).add_(value)
            self._aggregate_window_state(name, value, predictions.shape[-1])

    def _compute(self) -> list[MetricComputationReport]:
        from lightrec.metrics.metrics_namespace import MetricPrefix

        return [MetricComputationReport("mean_prediction", MetricPrefix.LIFETIME, self.prediction_sum / self.count),
                MetricComputationReport("mean_prediction", MetricPrefix.WINDOW,
                                        self.get_window_state("prediction_sum") / self.get_window_state("count"))]


class MetricsLogger:
    """A metric module built from computations, as generative-recommenders' ``MetricsLogger`` builds one."""

    def __init__(self, rank: int, window_size: int) -> None:
        kw = {"my_rank": rank, "batch_size": 4, "n_tasks": len(TASKS), "window_size": window_size}
        self.metrics: list[RecMetricComputation] = [
            NEMetricComputation(**kw), AccuracyMetricComputation(**kw), GAUCMetricComputation(**kw),
            MSEMetricComputation(**kw), MAEMetricComputation(**kw), _MeanPrediction(**kw),
        ]  # fmt: skip

    def update(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, num_candidates: torch.Tensor) -> None:
        for metric in self.metrics:
            if isinstance(metric, GAUCMetricComputation):
                metric.update(predictions=predictions, labels=labels, weights=weights, num_candidates=num_candidates)
            else:
                metric.update(predictions=predictions, labels=labels, weights=weights)

    def compute(self) -> dict[str, float]:
        out = {}
        for metric in self.metrics:
            for report in metric.compute():
                for i, task in enumerate(TASKS):
                    out[f"metric/{report.metric_prefix}{report.name}/{task}"] = float(report.value[i])
        return out


def _logger_body(rank: int, world_size: int) -> dict[str, float]:
    logger = MetricsLogger(rank, window_size=4)
    halves = [(0, 4), (4, 8)] if rank == 0 else [(8, 10), (10, 12)]  # ranks see different batches
    for lo, hi in halves:
        logger.update(P[:, lo:hi], Y[:, lo:hi], W[:, lo:hi], torch.tensor([hi - lo]))
    return logger.compute()


def test_metrics_logger_on_two_gloo_ranks_equals_the_definitions_on_all_data() -> None:
    results = run_ranks(_logger_body, 2)
    assert results[0] == pytest.approx(results[1])  # every rank gets the synced values
    got = results[0]
    # each rank's window (4 samples): rank 0 its newest batch (samples 4..8), rank 1 both of its 2-sample batches
    window = [4, 5, 6, 7, 8, 9, 10, 11]
    for t, task in enumerate(TASKS):
        cols = _columns(t, 0, 12)
        win = tuple([c[i] for i in window] for c in cols)
        for name, definition in (("ne", ne_def), ("accuracy", accuracy_def), ("mse", mse_def), ("mae", mae_def)):
            assert got[f"metric/lifetime_{name}/{task}"] == pytest.approx(definition(*cols), rel=1e-9)
            assert got[f"metric/window_{name}/{task}"] == pytest.approx(definition(*win), rel=1e-9)
        groups = [(0, 4), (4, 8), (8, 10), (10, 12)]
        want, counted = gauc_def([_columns(t, lo, hi) for lo, hi in groups])
        assert got[f"metric/lifetime_gauc/{task}"] == pytest.approx(want)
        assert got[f"metric/lifetime_gauc_num_samples/{task}"] == counted
        want_window, _ = gauc_def([_columns(t, lo, hi) for lo, hi in groups[1:]])
        assert got[f"metric/window_gauc/{task}"] == pytest.approx(want_window)
        assert got[f"metric/lifetime_mean_prediction/{task}"] == pytest.approx(sum(cols[0]) / 12)
        assert got[f"metric/window_mean_prediction/{task}"] == pytest.approx(sum(win[0]) / len(window))
