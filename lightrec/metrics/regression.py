"""Weighted regression errors: ``MSE`` and ``MAE`` (ratings, watch times), synced across ranks.

With predictions ``p_i``, labels ``y_i`` (any real numbers) and sample weights ``w_i``::

    MSE = sum_i w_i * (p_i - y_i)^2 / sum_i w_i          RMSE = sqrt(MSE)
    MAE = sum_i w_i * |p_i - y_i|   / sum_i w_i

Each keeps two float64 sums (reduced with ``sum``), like the ratio metrics of ``rates.py``; with
no weight seen ``compute`` warns and returns NaN.

:class:`MSEMetricComputation` and :class:`MAEMetricComputation` are torchrec's forms
(``torchrec.metrics.mse`` / ``.mae``): several tasks, lifetime and windowed, 0 when no weight was
seen; MSE also reports RMSE and, with ``include_r_squared=True``, the weighted R^2
``1 - sum w (y - p)^2 / (sum w y^2 - (sum w y)^2 / sum w)`` (1 when the labels do not vary, within
float64 rounding; 0, not NaN, when no weight was seen, like the other values).
"""

from __future__ import annotations

import abc
from typing import Any

import torch
from torch import Tensor

from lightrec.metrics._validation import MetricInputError, check_binary_inputs
from lightrec.metrics.computation import MetricComputationReport, RecMetricComputation
from lightrec.metrics.metrics_config import RecMetricEnum
from lightrec.metrics.metrics_namespace import MetricName, MetricPrefix
from lightrec.metrics.rates import _WeightedRatio, weighted_ratio_or_zero
from lightrec.metrics.rec_metric import read_sqrt, read_value, register_rec_metric

__all__ = ["MAE", "MAEMetric", "MAEMetricComputation", "MSE", "MSEMetric", "MSEMetricComputation"]


def _regression_inputs(name: str, preds: Tensor, labels: Tensor, weights: Tensor | None, validate: bool) -> tuple[
    Tensor, Tensor, Tensor
]:
    """``[B]`` float64 inputs (shapes checked); with ``validate``: finite values and weights >= 0."""
    p, y, w = check_binary_inputs(name, preds, labels, weights, preds_are_probabilities=False, validate_args=False)
    if validate and p.numel() > 0:
        bad = torch.stack([(~torch.isfinite(p)).any(), (~torch.isfinite(y)).any(), (~torch.isfinite(w) | (w < 0)).any()])
        flags = bad.tolist()
        for flag, arg in zip(flags, ("preds", "labels", "weights")):
            if flag:
                raise MetricInputError(f"{name}: `{arg}` must be finite{' and >= 0' if arg == 'weights' else ''}.")
    return p, y, w


class _WeightedError(_WeightedRatio):
    """``sum_i w_i * error(p_i, y_i) / sum_i w_i``; subclasses name the states and the error."""

    higher_is_better = False
    plot_lower_bound = 0.0
    _empty_reason = "no samples (or only zero weights) were seen"

    @staticmethod
    @abc.abstractmethod
    def _error(diff: Tensor) -> Tensor:
        """The per-sample error of ``diff`` (prediction minus label, or the reverse): squared or absolute."""

    def update(self, preds: Tensor, labels: Tensor, weights: Tensor | None = None) -> None:
        """Adds a batch: ``preds`` [B], ``labels`` [B], ``weights`` [B] or None."""
        p, y, w = _regression_inputs(type(self).__name__, preds, labels, weights, self.validate_args)
        self._add(w * self._error(p - y), w)


class MSE(_WeightedError):
    """Weighted mean squared error (:meth:`rmse` gives its square root).

    Args:
        validate_args: check values on every update (one device sync per update on accelerators).
        **kwargs: forwarded to :class:`torchmetrics.Metric`.
    """

    _numerator_state = "mse_weighted_squared_errors"
    _denominator_state = "mse_weights"

    @staticmethod
    def _error(diff: Tensor) -> Tensor:
        return diff.square()

    def rmse(self) -> Tensor:
        """``sqrt(compute())`` (synced over ranks like ``compute``)."""
        return self.compute().sqrt()


class MAE(_WeightedError):
    """Weighted mean absolute error (arguments as :class:`MSE`)."""

    _numerator_state = "mae_weighted_abs_errors"
    _denominator_state = "mae_weights"

    @staticmethod
    def _error(diff: Tensor) -> Tensor:
        return diff.abs()


class _ErrorComputation(RecMetricComputation):
    """``error_sum`` and ``weighted_num_samples`` per task (and, for R^2, the label sums)."""

    _states: tuple[str, ...] = ("error_sum", "weighted_num_samples")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in self._states:
            self._add_state(name, torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=True,
                            dist_reduce_fx="sum", persistent=True)  # fmt: skip

    @staticmethod
    @abc.abstractmethod
    def _error(diff: Tensor) -> Tensor:
        """The per-sample error of ``diff`` (prediction minus label, or the reverse): squared or absolute."""

    def update(self, *, predictions: Tensor | None, labels: Tensor, weights: Tensor | None, **kwargs: Any) -> None:
        p, y, w = self._inputs(predictions, labels, weights)
        states = {
            "error_sum": (w * self._error(y - p)).sum(-1),
            "weighted_num_samples": w.sum(-1),
            "label_sum": (w * y).sum(-1),
            "label_squared_sum": (w * y.square()).sum(-1),
        }
        self._update_states({name: states[name] for name in self._states}, p.size(-1))

    def _sums(self, prefix: MetricPrefix, names: tuple[str, ...]) -> list[Tensor]:
        return [getattr(self, n) if prefix == MetricPrefix.LIFETIME else self.get_window_state(n) for n in names]


# Relative to ``sum w y^2``, the spread float64 cancellation leaves of labels that do not vary (about
# 1e-16 per added batch); a smaller spread is a constant label (std below 1e-6 of the mean: a few
# float32 steps), so no rounding residue is divided by.
_CONSTANT_LABELS = 1e-12


def _r_squared(error: Tensor, total: Tensor, label_sum: Tensor, label_squared_sum: Tensor) -> Tensor:
    """Weighted R^2 ``1 - error / spread`` per task (all ``[n_tasks]`` float64), with
    ``spread = sum w y^2 - (sum w y)^2 / sum w``: 1 where the labels do not vary (torchrec's value), 0
    where no weight was seen (torchrec's value for MSE, RMSE and MAE there; never NaN)."""
    seen = total > 0
    spread = label_squared_sum - label_sum.square() / torch.where(seen, total, torch.ones_like(total))
    constant = spread <= _CONSTANT_LABELS * label_squared_sum
    value = torch.where(constant, 1.0, 1.0 - error / torch.where(constant, torch.ones_like(spread), spread))
    return torch.where(seen, value, 0.0).double()


class MSEMetricComputation(_ErrorComputation):
    """Weighted mean squared error per task (and RMSE; R^2 with ``include_r_squared``).

    States: ``error_sum`` (``sum w (y - p)^2``), ``weighted_num_samples``; with ``include_r_squared``
    also ``label_sum`` and ``label_squared_sum``. All ``[n_tasks]`` float64 with window twins.
    """

    def __init__(self, *args: Any, include_r_squared: bool = False, **kwargs: Any) -> None:
        self._include_r_squared = include_r_squared
        if include_r_squared:
            self._states = (*_ErrorComputation._states, "label_sum", "label_squared_sum")
        super().__init__(*args, **kwargs)

    @staticmethod
    def _error(diff: Tensor) -> Tensor:
        return diff.square()

    def _compute(self) -> list[MetricComputationReport]:
        # torchrec's order: MSE and RMSE (lifetime, then window), then R^2 (lifetime, then window)
        reports, r_squared = [], []
        for prefix in (MetricPrefix.LIFETIME, MetricPrefix.WINDOW):
            error, total = self._sums(prefix, _ErrorComputation._states)
            mse = weighted_ratio_or_zero(error, total)
            reports += [MetricComputationReport(MetricName.MSE, prefix, mse),
                        MetricComputationReport(MetricName.RMSE, prefix, mse.sqrt())]  # fmt: skip
            if self._include_r_squared:
                label_sum, label_squared_sum = self._sums(prefix, ("label_sum", "label_squared_sum"))
                value = _r_squared(error, total, label_sum, label_squared_sum)
                r_squared.append(MetricComputationReport(MetricName.R_SQUARED, prefix, value))
        return reports + r_squared


class MAEMetricComputation(_ErrorComputation):
    """Weighted mean absolute error per task. States: ``error_sum`` (``sum w |y - p|``),
    ``weighted_num_samples`` (``[n_tasks]`` float64 with window twins)."""

    @staticmethod
    def _error(diff: Tensor) -> Tensor:
        return diff.abs()

    def _compute(self) -> list[MetricComputationReport]:
        return [
            MetricComputationReport(MetricName.MAE, prefix, weighted_ratio_or_zero(*self._sums(prefix, self._states)))
            for prefix in (MetricPrefix.LIFETIME, MetricPrefix.WINDOW)
        ]


# torchrec's per-metric classes (RecMetric of one metric, torchrec's constructor), registered with RecMetric
MSEMetric = register_rec_metric("MSEMetric", RecMetricEnum.MSE, MSE, [("mse", read_value), ("rmse", read_sqrt)], undefined=0.0)
MAEMetric = register_rec_metric("MAEMetric", RecMetricEnum.MAE, MAE, [("mae", read_value)], undefined=0.0)
