"""Review of lightrec.metrics' windows and saved state: torchrec's window of a rank (``ceil(window_size /
world_size)`` samples in whole batches, at most 1000 batches) after many updates, inputs reused by the
caller, reset, and the lifetime values surviving a ``state_dict`` round trip of a ``RecMetricModule``."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
import torch

from lightrec.metrics import SlidingWindow
from lightrec.metrics.metric_module import RecMetricModule, generate_metric_module
from lightrec.metrics.metrics_config import MetricsConfig, RecMetricDef, RecMetricEnum, RecTaskInfo
from lightrec.metrics.rec_metric import RecMetric


def torchrec_window(
    batch_sizes: list[int], window_size: int, world_size: int, max_batches: int = 1000
) -> list[int]:
    """Indices of the batches torchrec's WindowBuffer holds after ``batch_sizes`` (whole batches, newest last)."""
    limit = math.ceil(window_size / world_size)
    kept: deque[int] = deque()
    used = 0
    for i, size in enumerate(batch_sizes):
        if len(kept) == max_batches:
            used -= batch_sizes[kept.popleft()]
        kept.append(i)
        used += size
        while used > limit:
            used -= batch_sizes[kept.popleft()]
    return list(kept)


def ctr(y: np.ndarray, w: np.ndarray) -> float:
    return float((w * y).sum() / w.sum())


def _batches(sizes: list[int], seed: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        p = torch.rand(n, generator=g, dtype=torch.float64)
        out.append(
            (
                p,
                (torch.rand(n, generator=g, dtype=torch.float64) < p).double(),
                torch.rand(n, generator=g, dtype=torch.float64),
            )
        )
    return out


@pytest.mark.parametrize(("window_size", "world_size"), [(100, 3), (70, 1), (35, 2)])
def test_window_after_many_updates_holds_torchrecs_batches(window_size: int, world_size: int) -> None:
    """Per rank ceil(window_size / world_size) samples (100 on 3 ranks: 34, where a floor would give 33 and
    drop a batch of 17 torchrec keeps)."""
    rng = np.random.default_rng(window_size)
    sizes = [17, 17] + [int(s) for s in rng.integers(1, 18, size=60)]
    batches = _batches(sizes, seed=window_size)
    metrics = {e: RecMetric(e, world_size, 0, 17, [RecTaskInfo("t")], window_size=window_size)
               for e in (RecMetricEnum.CTR, RecMetricEnum.CALIBRATION, RecMetricEnum.MSE)}  # fmt: skip
    checked = 0
    for i, (p, y, w) in enumerate(batches):
        for m in metrics.values():
            m.update(predictions=p, labels=y, weights=w)
        if i in (1, 10, len(batches) - 1):
            kept = torchrec_window(sizes[: i + 1], window_size, world_size)
            py, yy, wy = (torch.cat([batches[k][j] for k in kept]).numpy() for j in range(3))
            got = {k: float(v) for m in metrics.values() for k, v in m.compute().items()}
            assert got["ctr-t|window_ctr"] == pytest.approx(ctr(yy, wy), rel=1e-6)
            assert got["calibration-t|window_calibration"] == pytest.approx(
                (wy * py).sum() / (wy * yy).sum(), rel=1e-6
            )
            assert got["mse-t|window_mse"] == pytest.approx((wy * (py - yy) ** 2).sum() / wy.sum(), rel=1e-6)
            all_y, all_w = (torch.cat([b[j] for b in batches[: i + 1]]).numpy() for j in (1, 2))
            assert got["ctr-t|lifetime_ctr"] == pytest.approx(ctr(all_y, all_w), rel=1e-6)
            checked += 1
    assert checked == 3


def test_window_holds_at_most_1000_batches_as_torchrecs() -> None:
    sizes = [2] * 1203
    batches = _batches(sizes, seed=5)
    metric = RecMetric(RecMetricEnum.CTR, 1, 0, 2, [RecTaskInfo("t")], window_size=10_000_000)
    for p, y, w in batches:
        metric.update(predictions=p, labels=y, weights=w)
    kept = torchrec_window(sizes, 10_000_000, 1)
    assert kept == list(range(203, 1203))
    y, w = (torch.cat([batches[k][j] for k in kept]).numpy() for j in (1, 2))
    assert float(metric.compute()["ctr-t|window_ctr"]) == pytest.approx(
        ctr(y, w), rel=1e-6
    )  # float32 results


def test_window_keeps_its_own_copy_of_the_inputs_and_reset_empties_it() -> None:
    """A caller that reuses its output buffers (CUDA graphs replay into the same tensors) must not rewrite
    the window."""
    metric = RecMetric(RecMetricEnum.CTR, 1, 0, 4, [RecTaskInfo("t")], window_size=8)
    labels, weights = torch.ones(4), torch.ones(4)
    metric.update(predictions=torch.full((4,), 0.5), labels=labels, weights=weights)
    labels.zero_()  # the buffer is reused for the next batch
    metric.update(predictions=torch.full((4,), 0.5), labels=labels, weights=weights)
    got = metric.compute()
    assert float(got["ctr-t|window_ctr"]) == pytest.approx(0.5)
    assert float(got["ctr-t|lifetime_ctr"]) == pytest.approx(0.5)
    metric.reset()
    assert {k: float(v) for k, v in metric.compute().items()} == {
        "ctr-t|lifetime_ctr": 0.0,
        "ctr-t|window_ctr": 0.0,
    }


def _module() -> RecMetricModule:
    task = RecTaskInfo(name="click")
    config = MetricsConfig(
        rec_tasks=[task],
        rec_metrics={e: RecMetricDef(rec_task_indices=[0], window_size=20) for e in (
            RecMetricEnum.NE, RecMetricEnum.CTR, RecMetricEnum.CALIBRATION, RecMetricEnum.MSE, RecMetricEnum.AUC)},
    )  # fmt: skip
    return generate_metric_module(RecMetricModule, config, 10, 1, 0, {}, "cpu")


def test_lifetime_values_survive_a_state_dict_round_trip() -> None:
    """torchrec saves the lifetime sums (persistent=True); the window starts anew, as in torchrec, and so
    does the exact AUC (torchrec's AUC states are not saved either)."""
    module = _module()
    for p, y, w in _batches([10, 10, 10], seed=9):
        module.update({"prediction": p, "label": y, "weight": w})
    before = {k: float(v) for k, v in module.compute().items()}
    state = module.state_dict()
    assert "rec_metrics.rec_metrics.0._lifetime.click.ne_weighted_logloss" in state
    assert not any("auc_preds" in k for k in state)

    resumed = _module()
    resumed.load_state_dict(state)
    after = {k: float(v) for k, v in resumed.compute().items()}
    for key in ("ne-click|lifetime_ne", "ctr-click|lifetime_ctr", "calibration-click|lifetime_calibration",
                "mse-click|lifetime_mse", "mse-click|lifetime_rmse"):  # fmt: skip
        assert after[key] == pytest.approx(before[key], rel=1e-12), key
    assert after["ctr-click|window_ctr"] == 0.0 and after["auc-click|lifetime_auc"] == 0.5
    # the resumed sums keep adding up
    for p, y, w in _batches([10], seed=10):
        resumed.update({"prediction": p, "label": y, "weight": w})
        module.update({"prediction": p, "label": y, "weight": w})
    assert float(resumed.compute()["ne-click|lifetime_ne"]) == pytest.approx(
        float(module.compute()["ne-click|lifetime_ne"])
    )


def test_sliding_window_after_many_updates_is_the_metric_of_the_newest_samples() -> None:
    batches = _batches([3, 0, 5, 7, 1, 4, 6, 2, 9], seed=11)
    window = SlidingWindow("ctr", window=10)
    for p, y, w in batches:
        window.update(p.float(), y, w)
    y, w = (torch.cat([b[j] for b in batches])[-10:].numpy() for j in (1, 2))
    assert float(window.compute()) == pytest.approx(ctr(y, w), rel=1e-6)
