"""Clear errors for bad inputs, and documented NaN-with-warning results when a metric is undefined."""

from __future__ import annotations

import math

import pytest
import torch

from lightrec.metrics import AUC, CTR, NE, Accuracy, Calibration, MetricInputError, RecallAtK

BINARY = [AUC, NE, Calibration, CTR, Accuracy]
PROBABILITY_METRICS = [NE, Calibration, Accuracy]


@pytest.mark.parametrize("cls", BINARY)
def test_shape_mismatch_names_the_argument(cls) -> None:
    with pytest.raises(MetricInputError, match="`labels` has 3 samples but `preds` has 4"):
        cls().update(torch.rand(4), torch.ones(3))
    with pytest.raises(MetricInputError, match="`weights` has 5 samples"):
        cls().update(torch.rand(4), torch.ones(4), torch.ones(5))
    with pytest.raises(MetricInputError, match=r"`preds` must have shape \[B\] or \[B, 1\], got \[4, 2\]"):
        cls().update(torch.rand(4, 2), torch.ones(4))


@pytest.mark.parametrize("cls", BINARY)
def test_labels_outside_unit_interval_are_rejected(cls) -> None:
    with pytest.raises(MetricInputError, match=r"`labels` must lie in \[0, 1\].*2.0"):
        cls().update(torch.rand(3), torch.tensor([0.0, 2.0, 1.0]))
    with pytest.raises(MetricInputError, match="`labels`"):
        cls().update(torch.rand(2), torch.tensor([-1.0, 0.0]))


@pytest.mark.parametrize("cls", BINARY)
def test_bad_preds_and_weights_are_rejected(cls) -> None:
    with pytest.raises(MetricInputError, match="`preds`.*nan"):
        cls().update(torch.tensor([0.2, float("nan")]), torch.tensor([0.0, 1.0]))
    with pytest.raises(MetricInputError, match="`weights` must be finite and >= 0.*-1.0"):
        cls().update(torch.rand(2), torch.tensor([0.0, 1.0]), torch.tensor([1.0, -1.0]))
    with pytest.raises(TypeError, match="`preds` must be floating point"):
        cls().update(torch.tensor([0, 1]), torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match="`labels` must be a torch.Tensor, got list"):
        cls().update(torch.rand(2), [0.0, 1.0])


@pytest.mark.parametrize("cls", PROBABILITY_METRICS)
def test_probability_metrics_reject_logits(cls) -> None:
    with pytest.raises(MetricInputError, match="sigmoid"):
        cls().update(torch.tensor([-2.0, 3.0]), torch.tensor([0.0, 1.0]))


def test_validate_args_false_skips_value_checks_but_not_shapes() -> None:
    ctr = CTR(validate_args=False)
    ctr.update(torch.rand(2), torch.tensor([0.0, 3.0]))  # not checked: the user opted out
    assert ctr.compute().item() == pytest.approx(1.5)
    with pytest.raises(MetricInputError):
        CTR(validate_args=False).update(torch.rand(2), torch.ones(3))


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")  # torchmetrics' own notice
@pytest.mark.parametrize("cls", BINARY + [RecallAtK])
def test_compute_without_data_warns_and_returns_nan(cls) -> None:
    metric = cls()
    with pytest.warns(UserWarning, match="undefined"):
        value = metric.compute()
    assert math.isnan(value.item())


@pytest.mark.parametrize("num_bins", [None, 32])
@pytest.mark.parametrize("label", [0.0, 1.0])
def test_auc_with_one_class_warns_and_returns_nan(num_bins, label) -> None:
    auc = AUC(num_bins=num_bins)
    auc.update(torch.rand(10), torch.full((10,), label))
    with pytest.warns(UserWarning, match="one class"):
        assert math.isnan(auc.compute().item())


def test_zero_total_weight_is_undefined() -> None:
    for cls in BINARY:
        metric = cls()
        metric.update(torch.rand(3), torch.tensor([0.0, 1.0, 1.0]), torch.zeros(3))
        with pytest.warns(UserWarning, match="undefined"):
            assert math.isnan(metric.compute().item()), cls.__name__


def test_calibration_without_positives_is_nan() -> None:
    cal = Calibration()
    cal.update(torch.rand(5), torch.zeros(5))
    with pytest.warns(UserWarning, match="no positive label"):
        assert math.isnan(cal.compute().item())


def test_ne_with_a_single_class_warns_but_stays_finite() -> None:
    ne = NE()
    ne.update(torch.full((4,), 0.1), torch.zeros(4))
    with pytest.warns(UserWarning, match="every label seen is 0"):
        assert math.isfinite(ne.compute().item())


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: AUC(num_bins=1), "num_bins"),
        (lambda: AUC(num_bins=10.0), "num_bins"),
        (lambda: NE(eps=0.0), "eps"),
        (lambda: NE(eps=0.7), "eps"),
        (lambda: Accuracy(threshold=1.5), "threshold"),
        (lambda: RecallAtK(k=0), "`k` must be an int >= 1"),
        (lambda: RecallAtK(k=True), "`k`"),
    ],
)
def test_bad_constructor_arguments(build, match) -> None:
    with pytest.raises(ValueError, match=match):
        build()
