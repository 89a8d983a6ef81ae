"""Weighted regression errors: ``MSE`` and ``MAE`` (ratings, watch times), synced across ranks.

With predictions ``p_i``, labels ``y_i`` (any real numbers) and sample weights ``w_i``::

    MSE = sum_i w_i * (p_i - y_i)^2 / sum_i w_i          RMSE = sqrt(MSE)
    MAE = sum_i w_i * |p_i - y_i|   / sum_i w_i

Each keeps two float64 sums (reduced with ``sum``), like the ratio metrics of ``rates.py``; with
no weight seen ``compute`` warns and returns NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightrec.metrics._validation import MetricInputError, check_binary_inputs
from lightrec.metrics.rates import _WeightedRatio

__all__ = ["MAE", "MSE"]


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
    def _error(diff: Tensor) -> Tensor:
        raise NotImplementedError

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
