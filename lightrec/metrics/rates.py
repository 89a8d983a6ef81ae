"""Weighted-ratio metrics for click prediction: ``Calibration``, ``CTR`` and ``Accuracy``.

Each keeps two float64 running sums, reduced across ranks with ``sum``, and returns their ratio.
With predictions ``p_i``, labels ``y_i`` in ``[0, 1]`` and sample weights ``w_i``::

    Calibration = sum_i w_i * p_i / sum_i w_i * y_i         (1.0 = calibrated; > 1 over-predicts)
    CTR         = sum_i w_i * y_i / sum_i w_i
    Accuracy    = sum_i w_i * (y_i * [p_i > t] + (1 - y_i) * [p_i <= t]) / sum_i w_i     (t = 0.5)

``Accuracy`` thresholds like ``torchmetrics.classification.BinaryAccuracy`` (``p > t`` is a
positive prediction). A soft label counts as ``y_i`` of a positive and ``1 - y_i`` of a negative.
When the denominator is zero (nothing seen; for Calibration: no positive label) ``compute`` warns
and returns NaN.

Every metric takes ``validate_args`` (check values on every update: one device sync per update on
accelerators) and ``**kwargs`` (forwarded to :class:`torchmetrics.Metric`).

State names are distinct per class so that a user's ``MetricCollection(compute_groups=True)`` can
never mistake two of these metrics for one.

:class:`AccuracyMetricComputation` is torchrec's form of accuracy (``torchrec.metrics.accuracy``):
several tasks, lifetime and windowed, with torchrec's rule -- a sample counts as correct when
``[p_i >= t] == y_i`` (a soft label is never matched) -- and 0 when no weight was seen. torchrec's
``AccuracyMetric`` (``RecMetric`` keys) counts by the same rule (:class:`TorchrecAccuracy`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from lightrec.metrics._validation import check_binary_inputs, undefined_result
from lightrec.metrics.computation import MetricComputationReport, RecMetricComputation
from lightrec.metrics.metrics_config import RecMetricEnum
from lightrec.metrics.metrics_namespace import MetricName, MetricPrefix
from lightrec.metrics.rec_metric import read_value, register_rec_metric


class _WeightedRatio(Metric):
    """Base class: ``compute`` = numerator state / denominator state; subclasses fill them."""

    is_differentiable = False
    full_state_update = False
    plot_lower_bound = 0.0
    _numerator_state: str
    _denominator_state: str
    _empty_reason: str

    def __init__(self, validate_args: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validate_args = validate_args
        zero = torch.tensor(0.0, dtype=torch.float64)
        self.add_state(self._numerator_state, default=zero.clone(), dist_reduce_fx="sum")
        self.add_state(self._denominator_state, default=zero.clone(), dist_reduce_fx="sum")

    def _checked(
        self, preds: Tensor, labels: Tensor, weights: Tensor | None, probabilities: bool = True
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``check_binary_inputs`` under this metric's name: ``(preds, labels, weights)``, weights filled."""
        return check_binary_inputs(
            type(self).__name__,
            preds,
            labels,
            weights,
            preds_are_probabilities=probabilities,
            validate_args=self.validate_args,
        )

    def _add(self, numerator: Tensor, denominator: Tensor) -> None:
        num = getattr(self, self._numerator_state)
        den = getattr(self, self._denominator_state)
        num += numerator.sum().to(num.dtype)
        den += denominator.sum().to(den.dtype)

    def compute(self) -> Tensor:
        """Returns numerator / denominator over all ranks as a float32 scalar; NaN when undefined."""
        num = getattr(self, self._numerator_state).double()
        den = getattr(self, self._denominator_state).double()
        if den <= 0:
            return undefined_result(self, type(self).__name__, self._empty_reason)
        return (num / den).to(torch.float32)


class _WeightedFraction(_WeightedRatio):
    """A weighted ratio whose numerator is part of its denominator: a value in ``[0, 1]``."""

    plot_upper_bound = 1.0
    _empty_reason = "no samples (or only zero weights) were seen"


class Calibration(_WeightedRatio):
    """Sum of predicted probabilities over sum of labels (weighted); 1.0 means calibrated.

    Args: ``validate_args`` and ``**kwargs``, as every metric here (module docstring).
    """

    higher_is_better = None
    _numerator_state = "calibration_weighted_preds"
    _denominator_state = "calibration_weighted_labels"
    _empty_reason = "no positive label mass was seen"

    def update(self, preds: Tensor, labels: Tensor, weights: Tensor | None = None) -> None:
        """Adds a batch: ``preds`` [B] probabilities, ``labels`` [B] in [0, 1], ``weights`` [B] or None."""
        preds, labels, weights = self._checked(preds, labels, weights)
        self._add(weights * preds, weights * labels)


class CTR(_WeightedFraction):
    """Click-through rate: the weighted mean label. Predictions are accepted (and validated) but unused.

    Args: ``validate_args`` and ``**kwargs``, as every metric here (module docstring).
    """

    higher_is_better = None
    _numerator_state = "ctr_weighted_labels"
    _denominator_state = "ctr_weights"

    def update(self, preds: Tensor, labels: Tensor, weights: Tensor | None = None) -> None:
        """Adds a batch: ``preds`` [B] (shape-checked only), ``labels`` [B] in [0, 1], ``weights`` [B] or None."""
        # `preds` is part of the signature so that one MetricCollection call feeds every metric.
        _, labels, weights = self._checked(preds, labels, weights, probabilities=False)
        self._add(weights * labels, weights)


class Accuracy(_WeightedFraction):
    """Weighted fraction of samples whose thresholded prediction matches the label.

    Args:
        threshold: a prediction ``p > threshold`` counts as a positive; default 0.5.
        validate_args, **kwargs: as every metric here (module docstring).
    """

    higher_is_better = True
    _numerator_state = "accuracy_weighted_correct"
    _denominator_state = "accuracy_weights"

    def __init__(self, threshold: float = 0.5, validate_args: bool = True, **kwargs: Any) -> None:
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, (int, float))
            or not 0.0 <= threshold <= 1.0
        ):
            raise ValueError(f"Accuracy: `threshold` must be a float in [0, 1], got {threshold!r}.")
        super().__init__(validate_args=validate_args, **kwargs)
        self.threshold = float(threshold)

    def update(self, preds: Tensor, labels: Tensor, weights: Tensor | None = None) -> None:
        """Adds a batch: ``preds`` [B] probabilities, ``labels`` [B] in [0, 1], ``weights`` [B] or None."""
        preds, labels, weights = self._checked(preds, labels, weights)
        positive = (preds > self.threshold).to(torch.float64)
        correct = labels * positive + (1.0 - labels) * (1.0 - positive)
        self._add(weights * correct, weights)


class TorchrecAccuracy(Accuracy):
    """:class:`Accuracy` counted by torchrec's rule (``torchrec.metrics.accuracy``), for ``AccuracyMetric``:
    a sample is correct when ``[p_i >= t] == y_i`` -- a prediction equal to the threshold is a positive,
    and a soft label is never matched. Arguments, states and undefined value as :class:`Accuracy`."""

    def update(self, preds: Tensor, labels: Tensor, weights: Tensor | None = None) -> None:
        """Adds a batch: ``preds`` [B] probabilities, ``labels`` [B] in [0, 1], ``weights`` [B] or None."""
        preds, labels, weights = self._checked(preds, labels, weights)
        correct = ((preds >= self.threshold).to(torch.float64) == labels).to(torch.float64)
        self._add(weights * correct, weights)


def weighted_ratio_or_zero(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / denominator`` per task, 0 where the denominator is 0 (torchrec's convention), float64."""
    return torch.where(denominator == 0.0, torch.zeros_like(numerator), numerator / denominator).double()


class AccuracyMetricComputation(RecMetricComputation):
    """torchrec's accuracy computation: ``sum_i w_i [p_i >= t] == y_i / sum_i w_i`` per task.

    States (``[n_tasks]`` float64, with window twins): ``accuracy_sum``, ``weighted_num_samples``.

    Args:
        threshold: ``t`` (default 0.5).
        *args, **kwargs: :class:`~lightrec.metrics.computation.RecMetricComputation`'s.
    """

    accuracy_sum: Tensor
    weighted_num_samples: Tensor

    def __init__(self, *args: Any, threshold: float = 0.5, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._threshold = float(threshold)
        for name in ("accuracy_sum", "weighted_num_samples"):
            self._add_state(name, torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=True,
                            dist_reduce_fx="sum", persistent=True)  # fmt: skip

    def update(self, *, predictions: Tensor | None, labels: Tensor, weights: Tensor | None, **kwargs: Any) -> None:
        p, y, w = self._inputs(predictions, labels, weights)
        correct = ((p >= self._threshold).double() == y).double()
        self._update_states({"accuracy_sum": (w * correct).sum(-1), "weighted_num_samples": w.sum(-1)}, p.size(-1))

    def _compute(self) -> list[MetricComputationReport]:
        return [
            MetricComputationReport(MetricName.ACCURACY, prefix, weighted_ratio_or_zero(correct, total))
            for prefix, correct, total in (
                (MetricPrefix.LIFETIME, self.accuracy_sum, self.weighted_num_samples),
                (MetricPrefix.WINDOW, self.get_window_state("accuracy_sum"), self.get_window_state("weighted_num_samples")),
            )
        ]


# torchrec's per-metric classes (RecMetric of one metric, torchrec's constructor), registered with RecMetric
# (torchrec reports 0 where a ratio has nothing to divide by; AccuracyMetric counts torchrec's way, [p >= t] == y)
CTRMetric = register_rec_metric("CTRMetric", RecMetricEnum.CTR, CTR, [("ctr", read_value)], undefined=0.0)
CalibrationMetric = register_rec_metric("CalibrationMetric", RecMetricEnum.CALIBRATION, Calibration,
                                        [("calibration", read_value)], undefined=0.0)  # fmt: skip
AccuracyMetric = register_rec_metric("AccuracyMetric", RecMetricEnum.ACCURACY, TorchrecAccuracy,
                                     [("accuracy", read_value)], undefined=0.0)  # fmt: skip
