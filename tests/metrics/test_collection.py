"""rec_metrics: one MetricCollection update feeds every metric; keys, options and errors."""

from __future__ import annotations

import pytest
from torchmetrics import MetricCollection

from lightrec.metrics import AUC, CTR, NE, Accuracy, Calibration, UnknownMetricError, rec_metrics
from tests.metrics.test_binary_metrics import make_data, reference


def test_default_collection_matches_references_over_batches() -> None:
    preds, labels, weights = make_data(400, seed=21, ties=True, weighted=True)
    metrics = rec_metrics(prefix="val/")
    assert isinstance(metrics, MetricCollection)
    for p, y, w in zip(preds.split(100), labels.split(100), weights.split(100), strict=True):
        metrics.update(p, y, w)
    result = metrics.compute()
    assert set(result) == {"val/auc", "val/ne", "val/calibration", "val/ctr", "val/accuracy"}
    for name in ("auc", "ne", "calibration", "ctr", "accuracy"):
        assert result[f"val/{name}"].item() == pytest.approx(
            reference(name, preds, labels, weights), rel=1e-6
        )
    metrics.reset()
    p2, y2, _ = make_data(50, seed=22, ties=False, weighted=False)
    metrics.update(p2, y2)
    assert metrics.compute()["val/ctr"].item() == pytest.approx(y2.mean().item())


def test_subset_options_and_metric_types() -> None:
    metrics = rec_metrics(("AUC", "accuracy"), postfix="_train", auc_num_bins=64, accuracy_threshold=0.3)
    assert set(metrics.keys()) == {"auc_train", "accuracy_train"}
    assert isinstance(metrics["auc"], AUC) and metrics["auc"].num_bins == 64
    assert isinstance(metrics["accuracy"], Accuracy) and metrics["accuracy"].threshold == 0.3
    single = rec_metrics("ne", ne_eps=1e-6)
    assert isinstance(single["ne"], NE) and single["ne"].eps == 1e-6
    full = rec_metrics()
    assert [type(full[n]) for n in ("auc", "ne", "calibration", "ctr", "accuracy")] == [
        AUC,
        NE,
        Calibration,
        CTR,
        Accuracy,
    ]


def test_validate_args_and_metric_kwargs_reach_every_metric() -> None:
    metrics = rec_metrics(validate_args=False, compute_on_cpu=True)
    for name in ("auc", "ne", "calibration", "ctr", "accuracy"):
        assert metrics[name].validate_args is False
        assert metrics[name].compute_on_cpu is True


def test_bad_names() -> None:
    with pytest.raises(UnknownMetricError, match="unknown metric name.*'recall'.*RecallAtK"):
        rec_metrics(("auc", "recall"))
    with pytest.raises(KeyError):  # UnknownMetricError is a KeyError
        rec_metrics(("gauc",))
    with pytest.raises(ValueError, match="repeats \\['auc'\\]"):
        rec_metrics(("auc", "AUC"))
    with pytest.raises(ValueError, match="empty"):
        rec_metrics(())
