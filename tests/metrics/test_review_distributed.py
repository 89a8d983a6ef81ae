"""Review of lightrec.metrics on 2 real gloo ranks with uneven batches: torchrec's RecMetricModule keys
(lifetime over every rank's samples, window over each rank's newest ``ceil(window_size / 2)`` samples in
whole batches) against numpy references, with [B, 1] float16 predictions and bool labels on one rank; and
SlidingWindow summing each rank's window once (its inner metric must not sync a second time)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.metrics.test_review_numbers import roc_trapezoid_auc, torchrec_ne
from tests.metrics.test_review_window import torchrec_window
from tests.multiprocess import run_ranks

SIZES = {0: [7, 0, 13], 1: [5, 11]}  # 3 steps on rank 0, 2 on rank 1; an empty batch
WINDOW = 25  # 13 per rank (a floor would give 12 and keep less than torchrec)


def _rank_data(rank: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(50 + rank)
    out = []
    for n in SIZES[rank]:
        p = (torch.rand(n, generator=g) * 8).round() / 8  # ties, and exact 0 and 1
        y = (torch.rand(n, generator=g) < p).float()
        w = torch.rand(n, generator=g) * 2
        out.append((p, y, w))
    return out


def _body(rank: int, world_size: int) -> dict:
    import warnings

    from torchmetrics import Metric

    from lightrec.metrics import SlidingWindow
    from lightrec.metrics.metric_module import RecMetricModule, generate_metric_module
    from lightrec.metrics.metrics_config import MetricsConfig, RecMetricDef, RecMetricEnum, RecTaskInfo

    warnings.simplefilter("ignore")
    enums = (
        RecMetricEnum.NE,
        RecMetricEnum.AUC,
        RecMetricEnum.CTR,
        RecMetricEnum.CALIBRATION,
        RecMetricEnum.MSE,
    )
    config = MetricsConfig(rec_tasks=[RecTaskInfo("t")],
                           rec_metrics={e: RecMetricDef(rec_task_indices=[0], window_size=WINDOW) for e in enums})  # fmt: skip
    module = generate_metric_module(RecMetricModule, config, 13, world_size, rank, {}, "cpu")

    class WeightSum(Metric):
        def __init__(self) -> None:
            super().__init__()
            self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

        def update(self, preds: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> None:
            self.total += weights.double().sum()

        def compute(self) -> torch.Tensor:
            return self.total

    window_sum = SlidingWindow(WeightSum, window=6)
    window_ctr = SlidingWindow("ctr", window=6)
    for p, y, w in _rank_data(rank):
        if rank == 1:  # a model head's [B, 1] half-precision output and bool labels
            module.update(
                {"prediction": p.half().view(-1, 1), "label": y.bool().view(-1, 1), "weight": w.view(-1, 1)}
            )
        else:
            module.update({"prediction": p, "label": y, "weight": w})
        window_sum.update(p, y, w)
        window_ctr.update(p, y, w)
    return {
        "values": {k: float(v) for k, v in module.compute().items()},
        "window_sum": float(window_sum.compute()),
        "window_ctr": float(window_ctr.compute()),
    }


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_body, world_size=2, timeout=240)


def _cat(batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> tuple[np.ndarray, ...]:
    return tuple(torch.cat([b[j] for b in batches]).double().numpy() for j in range(3))


def test_lifetime_and_window_keys_equal_the_references_on_every_rank(results: list[dict]) -> None:
    data = {r: _rank_data(r) for r in SIZES}
    p, y, w = _cat(data[0] + data[1])
    window = [data[r][k] for r in SIZES for k in torchrec_window(SIZES[r], WINDOW, 2)]
    assert [len(b[0]) for b in window] == [0, 13, 11]  # rank 0: the empty batch and 13; rank 1: 11
    wp, wy, ww = _cat(window)
    want = {
        "ne-t|lifetime_ne": torchrec_ne(p, y, w),
        "ne-t|window_ne": torchrec_ne(wp, wy, ww),
        "auc-t|lifetime_auc": roc_trapezoid_auc(p, y, w),
        "ctr-t|lifetime_ctr": (w * y).sum() / w.sum(),
        "ctr-t|window_ctr": (ww * wy).sum() / ww.sum(),
        "calibration-t|lifetime_calibration": (w * p).sum() / (w * y).sum(),
        "calibration-t|window_calibration": (ww * wp).sum() / (ww * wy).sum(),
        "mse-t|lifetime_mse": (w * (p - y) ** 2).sum() / w.sum(),
        "mse-t|window_rmse": math.sqrt((ww * (wp - wy) ** 2).sum() / ww.sum()),
    }
    for rank_result in results:
        for key, value in want.items():
            assert rank_result["values"][key] == pytest.approx(value, rel=1e-5), key
    assert results[0]["values"] == results[1]["values"]


def test_sliding_window_sums_each_ranks_window_once(results: list[dict]) -> None:
    data = {r: _rank_data(r) for r in SIZES}
    newest = [_cat(data[r]) for r in SIZES]
    y = np.concatenate([n[1][-6:] for n in newest])
    w = np.concatenate([n[2][-6:] for n in newest])
    for rank_result in results:
        assert rank_result["window_sum"] == pytest.approx(w.sum(), rel=1e-6)  # was twice that: synced twice
        assert rank_result["window_ctr"] == pytest.approx((w * y).sum() / w.sum(), rel=1e-6)
