"""Review of lightrec.metrics' numbers against independent numpy references written here: weighted AUC
with ties (a trapezoid on the weighted ROC), NE edge cases (torchrec's normaliser), undefined values on
the torchrec path, torchrec's accuracy rule, input dtypes and shapes, empty batches, GAUC by session."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from lightrec.metrics import AUC, CTR, MSE, NE, Accuracy, Calibration, LogLoss, SlidingWindow
from lightrec.metrics.gauc import GAUCMetricComputation
from lightrec.metrics.metrics_config import RecMetricEnum, RecTaskInfo
from lightrec.metrics.ne import NEMetricComputation
from lightrec.metrics.rates import AccuracyMetricComputation
from lightrec.metrics.rec_metric import RecMetric


# ------------------------------------------------------------------ references (numpy, written here)
def roc_trapezoid_auc(s: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """Area under the weighted ROC: one point per distinct score (highest first), joined by trapezoids."""
    s, y, w = (np.asarray(a, dtype=np.float64) for a in (s, y, w))
    pos, neg = w * y, w * (1.0 - y)
    tpr, fpr = [0.0], [0.0]
    for threshold in np.unique(s)[::-1]:
        above = s >= threshold
        tpr.append(pos[above].sum() / pos.sum())
        fpr.append(neg[above].sum() / neg.sum())
    return float(np.trapezoid(tpr, fpr))


def torchrec_ne(p: np.ndarray, y: np.ndarray, w: np.ndarray, eta: float = 1e-12) -> float:
    """torchrec.metrics.ne written out: cross entropy in bits over that of the clamped mean label."""
    p, y, w = (np.asarray(a, dtype=np.float64) for a in (p, y, w))
    q = np.clip(p, eta, 1 - eta)
    ce = (-w * y * np.log2(q) - w * (1 - y) * np.log2(1 - q)).sum()
    pos, neg = (w * y).sum(), (w * (1 - y)).sum()
    mean = np.clip(pos / max(w.sum(), eta), eta, 1 - eta)
    return float(ce / (-pos * np.log2(mean) - neg * np.log2(1 - mean)))


def session_auc(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """Weighted pairwise AUC of one session, a tie counting one half."""
    pos, neg = w * y, w * (1 - y)
    order = (p[:, None] > p[None, :]) + 0.5 * (p[:, None] == p[None, :])
    return float((pos[:, None] * neg[None, :] * order).sum() / (pos.sum() * neg.sum()))


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    s = np.round(rng.random(n) * 8) / 8  # a 1/8 grid: many ties
    y = (rng.random(n) < 0.1 + 0.8 * s).astype(np.float64)
    w = rng.choice([0.0, 0.5, 1.0, 3.0], n)
    return s, y, w


def _quiet_compute(metric):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return metric.compute()


# ------------------------------------------------------------------ AUC
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_auc_with_ties_is_the_trapezoid_on_the_weighted_roc(seed: int) -> None:
    s, y, w = _data(300, seed)
    want = roc_trapezoid_auc(s, y, w)
    exact, binned = AUC(), AUC(num_bins=8)  # grid values k/8 fall into bins of their own (but 7/8 and 1)
    for lo, hi in ((0, 100), (100, 100), (100, 300)):  # streamed, with an empty batch
        for m in (exact, binned):
            m.update(torch.tensor(s[lo:hi]).float(), torch.tensor(y[lo:hi]), torch.tensor(w[lo:hi]))
    assert float(exact.compute()) == pytest.approx(want, rel=1e-6)
    binned_s = np.minimum(np.floor(s * 8), 7)
    assert float(binned.compute()) == pytest.approx(roc_trapezoid_auc(binned_s, y, w), rel=1e-6)


def test_auc_dtypes_and_shapes_give_the_reference_of_the_cast_values() -> None:
    s, y, w = _data(200, 3)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        preds = torch.tensor(s).to(dtype)
        want = roc_trapezoid_auc(preds.double().numpy(), y, w)
        for labels in (torch.tensor(y).long(), torch.tensor(y).bool(), torch.tensor(y).view(-1, 1)):
            m = AUC()
            m.update(preds.view(-1, 1), labels, torch.tensor(w).view(-1, 1))
            assert float(m.compute()) == pytest.approx(want, rel=1e-6), (dtype, labels.dtype)


def test_auc_of_one_class_is_nan_and_torchrec_keys_report_one_half() -> None:
    m = AUC()
    m.update(torch.rand(10), torch.ones(10))
    with pytest.warns(UserWarning, match="one class"):
        assert math.isnan(float(m.compute()))
    rec = RecMetric(RecMetricEnum.AUC, 1, 0, 10, [RecTaskInfo("t")], window_size=100)
    rec.update(predictions=torch.rand(10), labels=torch.ones(10), weights=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torchrec's default is reported silently
        assert {k: float(v) for k, v in rec.compute().items()} == {
            "auc-t|lifetime_auc": 0.5,
            "auc-t|window_auc": 0.5,
        }


# ------------------------------------------------------------------ NE
def test_ne_with_predictions_exactly_zero_and_one_is_finite_and_torchrecs() -> None:
    p = np.array([0.0, 1.0, 1.0, 0.0, 0.5])
    y = np.array([1.0, 0.0, 1.0, 0.0, 1.0])
    w = np.array([1.0, 2.0, 1.0, 1.0, 0.5])
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        ne, computation = NE(), NEMetricComputation(my_rank=0, batch_size=5, n_tasks=1, window_size=10)
        ne.update(torch.tensor(p).to(dtype), torch.tensor(y), torch.tensor(w))
        computation.update(
            predictions=torch.tensor(p)[None], labels=torch.tensor(y)[None], weights=torch.tensor(w)[None]
        )
        value = float(ne.compute())
        assert math.isfinite(value) and value == pytest.approx(torchrec_ne(p, y, w), rel=1e-6)
        assert computation.compute()[0].value.item() == pytest.approx(value, rel=1e-6)


@pytest.mark.parametrize("label", [0.0, 1.0])
def test_ne_when_every_label_is_one_class_equals_torchrecs(label: float) -> None:
    """The baseline is the log loss of predicting the clamped mean label on the labels seen (torchrec's),
    not the entropy of the clamped mean (which is ~28.6 times larger there)."""
    p = np.array([0.3, 0.2, 0.01, 0.9])
    y, w = np.full(4, label), np.ones(4)
    ne = NE()
    ne.update(torch.tensor(p), torch.tensor(y))
    with pytest.warns(UserWarning, match=f"every label seen is {int(label)}"):
        value = float(ne.compute())
    # torchrec takes log2(1 - m) of m = 1e-12, which float64 holds to ~1e-4 relative; lightrec uses log1p
    assert math.isfinite(value) and value == pytest.approx(torchrec_ne(p, y, w), rel=1e-3)


def test_ne_and_logloss_soft_labels_and_empty_batches() -> None:
    p, y, w = np.array([0.7, 0.2, 0.9]), np.array([0.25, 0.0, 1.0]), np.array([1.0, 2.0, 0.5])
    ne, logloss = NE(), LogLoss()
    for m in (ne, logloss):
        m.update(torch.empty(0), torch.empty(0))  # an empty batch adds nothing
        m.update(torch.tensor(p), torch.tensor(y), torch.tensor(w))
        m.update(torch.empty(0, 1), torch.empty(0, 1), torch.empty(0, 1))
    assert float(ne.compute()) == pytest.approx(torchrec_ne(p, y, w), rel=1e-6)
    want = -(w * (y * np.log(p) + (1 - y) * np.log(1 - p))).sum() / w.sum()
    assert float(logloss.compute()) == pytest.approx(want, rel=1e-6)


# ------------------------------------------------------------------ ratios, torchrec path
def test_ratio_metrics_undefined_nan_here_torchrec_defaults_on_rec_metric_keys() -> None:
    preds, labels = torch.tensor([0.3, 0.2]), torch.zeros(2)
    cal = Calibration()
    cal.update(preds, labels)
    with pytest.warns(UserWarning, match="no positive label mass"):
        assert math.isnan(float(cal.compute()))
    for metric in (CTR(), Accuracy(), MSE()):
        metric.update(preds, labels, torch.zeros(2))
        with pytest.warns(UserWarning, match="undefined"):
            assert math.isnan(float(metric.compute()))
    want = {
        RecMetricEnum.CALIBRATION: ({"calibration": 0.0}, torch.ones(2)),
        RecMetricEnum.CTR: ({"ctr": 0.0}, torch.zeros(2)),
        RecMetricEnum.ACCURACY: ({"accuracy": 0.0}, torch.zeros(2)),
        RecMetricEnum.MSE: ({"mse": 0.0, "rmse": 0.0}, torch.zeros(2)),
        RecMetricEnum.MAE: ({"mae": 0.0}, torch.zeros(2)),
        RecMetricEnum.NE: ({"ne": math.nan}, torch.zeros(2)),  # torchrec's NE is 0/0 there too
    }
    for enum, (values, weights) in want.items():
        rec = RecMetric(enum, 1, 0, 2, [RecTaskInfo("t")], window_size=10)
        rec.update(predictions=preds, labels=labels, weights=weights)
        got = {k: float(v) for k, v in _quiet_compute(rec).items()}
        for name, value in values.items():
            for prefix in ("lifetime_", "window_"):
                key = f"{enum.value}-t|{prefix}{name}"
                assert got[key] == pytest.approx(value, nan_ok=True), key


def test_accuracy_metric_counts_by_torchrecs_rule() -> None:
    """torchrec's AccuracyMetric: correct when [p >= t] == y, so p == t is a positive and a soft label never
    matches; lightrec's own Accuracy keeps torchmetrics' p > t."""
    p = torch.tensor([0.5, 0.5, 0.7, 0.2, 0.9])
    y = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0])
    w = torch.tensor([1.0, 2.0, 1.0, 1.0, 3.0])
    rec = RecMetric(RecMetricEnum.ACCURACY, 1, 0, 5, [RecTaskInfo("t")], window_size=10)
    rec.update(predictions=p, labels=y, weights=w)
    computation = AccuracyMetricComputation(my_rank=0, batch_size=5, n_tasks=1, window_size=10)
    computation.update(predictions=p[None], labels=y[None], weights=w[None])
    want = float((w * ((p >= 0.5).double() == y).double()).sum() / w.sum())  # (1 + 1 + 3) / 8
    assert want == pytest.approx(5 / 8)
    assert float(rec.compute()["accuracy-t|lifetime_accuracy"]) == pytest.approx(want)
    assert computation.compute()[0].value.item() == pytest.approx(want)
    own = Accuracy()
    own.update(p, torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0]), w)
    assert float(own.compute()) == pytest.approx(7 / 8)  # p = 0.5 is a negative here: only sample 0 is wrong


def test_multiple_tasks_keep_their_own_values() -> None:
    tasks = [RecTaskInfo("a"), RecTaskInfo("b")]
    rec = RecMetric(RecMetricEnum.NE, 1, 0, 4, tasks, window_size=100)
    data = {name: _data(40, seed) for seed, name in enumerate("ab")}
    for lo in range(0, 40, 10):
        rec.update(
            predictions={
                k: torch.tensor(np.clip(s[lo : lo + 10], 0.05, 0.95)) for k, (s, _, _) in data.items()
            },
            labels={k: torch.tensor(y[lo : lo + 10]) for k, (_, y, _) in data.items()},
            weights={k: torch.tensor(w[lo : lo + 10]) for k, (_, _, w) in data.items()},
        )
    got = rec.compute()
    for k, (s, y, w) in data.items():
        assert float(got[f"ne-{k}|lifetime_ne"]) == pytest.approx(
            torchrec_ne(np.clip(s, 0.05, 0.95), y, w), rel=1e-6
        )


# ------------------------------------------------------------------ GAUC
def test_gauc_is_the_mean_session_auc_of_the_sessions_with_both_classes_and_unequal_scores() -> None:
    rng = np.random.default_rng(7)
    sizes = [5, 0, 3, 1, 6, 4, 2]
    n = sum(sizes)
    p = np.round(rng.random((2, n)) * 4) / 4
    y = (rng.random((2, n)) < 0.5).astype(np.float64)
    w = rng.choice([0.5, 1.0, 2.0], (2, n))
    p[:, 14:18] = 0.5  # session 5 (samples 14..17): all scores equal, never counts
    metric = GAUCMetricComputation(my_rank=0, batch_size=n, n_tasks=2, window_size=1000)
    metric.update(predictions=torch.tensor(p), labels=torch.tensor(y), weights=torch.tensor(w),
                  num_candidates=torch.tensor(sizes, dtype=torch.int32))  # fmt: skip
    reports = {f"{r.metric_prefix}{r.name}": r.value.tolist() for r in metric.compute()}
    starts = np.cumsum([0, *sizes])
    for t in range(2):
        aucs = []
        for lo, hi in zip(starts[:-1], starts[1:]):
            ps, ys, ws = p[t, lo:hi], y[t, lo:hi], w[t, lo:hi]
            if hi > lo and 0 < ys.sum() < hi - lo and len(set(ps)) > 1:
                aucs.append(session_auc(ps, ys, ws))
        assert reports["lifetime_gauc"][t] == pytest.approx((sum(aucs) + 1e-9) / (len(aucs) + 2e-9), rel=1e-9)
        assert reports["lifetime_gauc_num_samples"][t] == len(aucs)


def test_sliding_window_of_an_empty_stream_warns_and_is_nan() -> None:
    with pytest.warns(UserWarning, match="no samples were seen"):
        assert math.isnan(float(SlidingWindow("ne", window=3).compute()))
