"""Normalized entropy (NE): log loss relative to the loss of always predicting the average CTR.

With predictions ``p_i``, labels ``y_i`` in ``[0, 1]`` and sample weights ``w_i``::

    q_i     = clamp(p_i, eps, 1 - eps)
    logloss = -sum_i w_i * (y_i * ln q_i + (1 - y_i) * ln(1 - q_i)) / sum_i w_i
    c       = sum_i w_i * y_i / sum_i w_i           (the weighted CTR)
    ctr     = clamp(c, eps, 1 - eps)
    NE      = logloss / -(c * ln ctr + (1 - c) * ln(1 - ctr))

The denominator is the log loss of always predicting ``ctr`` -- the entropy of the CTR, as long as
the clamp does not move it -- so NE < 1 means the model beats that constant predictor; lower is
better. This is torchrec's NE (``torchrec.metrics.ne``, which works in bits; the ratio is the same).
The clamp keeps a confident wrong prediction (``p = 0`` for a click) finite, and keeps NE finite when
every label seen is 0 or 1 (the denominator is then about ``eps``, so NE becomes very large: a
warning points that out). All sums are kept in float64 and reduced across ranks with ``sum``.

:class:`NEMetricComputation` is torchrec's form of the same metric (``torchrec.metrics.ne``): several
tasks at once, lifetime and windowed (:mod:`lightrec.metrics.computation`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import rank_zero_warn

from lightrec.metrics._validation import check_binary_inputs, undefined_result
from lightrec.metrics.computation import MetricComputationReport, RecMetricComputation
from lightrec.metrics.metrics_config import RecMetricEnum
from lightrec.metrics.metrics_namespace import MetricName, MetricPrefix
from lightrec.metrics.rec_metric import read_value, register_rec_metric

DEFAULT_EPS = 1e-12


def _check_eps(name: str, eps: float) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < eps < 0.5:
        raise ValueError(f"{name}: `eps` must be a float in (0, 0.5), got {eps!r}.")
    return float(eps)


class NE(Metric):
    """Normalized entropy over every sample seen since the last ``reset``, synced across ranks.

    Args:
        eps: clamp applied to the predictions and to the average CTR (see module docstring);
            default ``1e-12`` (the arithmetic is float64, so the clamp is representable).
        validate_args: check values (``preds`` in [0, 1], labels in [0, 1], weights >= 0) on every
            update; costs one device sync per update on accelerators.
        **kwargs: forwarded to :class:`torchmetrics.Metric`.

    ``compute`` returns a float32 scalar: NaN with a warning when no weight was seen.
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False
    plot_lower_bound = 0.0
    ne_weighted_logloss: Tensor
    ne_weighted_labels: Tensor
    ne_weights: Tensor

    def __init__(self, eps: float = DEFAULT_EPS, validate_args: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.eps = _check_eps("NE", eps)
        self.validate_args = validate_args
        zero = torch.tensor(0.0, dtype=torch.float64)
        self.add_state("ne_weighted_logloss", default=zero.clone(), dist_reduce_fx="sum")
        self.add_state("ne_weighted_labels", default=zero.clone(), dist_reduce_fx="sum")
        self.add_state("ne_weights", default=zero.clone(), dist_reduce_fx="sum")

    def update(self, preds: Tensor, labels: Tensor, weights: Tensor | None = None) -> None:
        """Adds a batch.

        Args:
            preds: ``[B]`` or ``[B, 1]`` probabilities in ``[0, 1]``.
            labels: ``[B]`` or ``[B, 1]`` labels in ``[0, 1]``.
            weights: ``[B]`` or ``[B, 1]`` sample weights >= 0, or None.
        """
        preds, labels, weights = check_binary_inputs(
            "NE", preds, labels, weights, preds_are_probabilities=True, validate_args=self.validate_args
        )
        q = preds.clamp(self.eps, 1.0 - self.eps)
        logloss = -(labels * torch.log(q) + (1.0 - labels) * torch.log1p(-q))
        dtype = self.ne_weights.dtype
        self.ne_weighted_logloss += (weights * logloss).sum().to(dtype)
        self.ne_weighted_labels += (weights * labels).sum().to(dtype)
        self.ne_weights += weights.sum().to(dtype)

    def _total_weight(self) -> Tensor | None:
        """The summed weight, or None when nothing (or only zero weight) was seen."""
        total = self.ne_weights.double()
        return total if total > 0 else None

    def _nothing_seen(self) -> Tensor:
        return undefined_result(self, type(self).__name__, "no samples (or only zero weights) were seen")

    def compute(self) -> Tensor:
        """Returns NE of everything seen (all ranks) as a float32 scalar; NaN when nothing was seen."""
        total = self._total_weight()
        if total is None:
            return self._nothing_seen()
        raw_ctr = self.ne_weighted_labels.double() / total
        if raw_ctr <= self.eps or raw_ctr >= 1.0 - self.eps:
            rank_zero_warn(
                f"NE: every label seen is {int(raw_ctr.round().item())}, so the baseline entropy is ~0 and "
                f"NE is dominated by eps={self.eps}; the value is finite but not meaningful.",
                UserWarning,
            )
        ctr = raw_ctr.clamp(self.eps, 1.0 - self.eps)
        logloss = self.ne_weighted_logloss.double() / total
        # the log loss of always predicting ctr, on the labels seen (torchrec's normaliser): the entropy
        # of ctr, except when the clamp moved it (every label 0, or every label 1)
        baseline = -(raw_ctr * torch.log(ctr) + (1.0 - raw_ctr) * torch.log1p(-ctr))
        return (logloss / baseline).to(torch.float32)


class LogLoss(NE):
    """Weighted binary cross-entropy (log loss) of probabilities: the numerator of :class:`NE`.

    Same arguments, inputs and states as :class:`NE`; ``compute`` returns
    ``sum_i w_i * logloss_i / sum_i w_i`` (NaN with a warning when nothing was seen).
    """

    higher_is_better = False

    def compute(self) -> Tensor:
        total = self._total_weight()
        if total is None:
            return self._nothing_seen()
        return (self.ne_weighted_logloss.double() / total).to(torch.float32)


def _log2_entropy_sum(positives: Tensor, negatives: Tensor, eta: float) -> Tensor:
    """``-(P * log2 m + N * log2(1 - m))`` with ``m = P / (P + N)`` clamped to ``[eta, 1 - eta]``:
    the cross-entropy of always predicting the mean label (in bits, summed over the samples)."""
    mean = (positives / (positives + negatives).clamp(min=eta)).clamp(eta, 1.0 - eta)
    return -(positives * torch.log2(mean) + negatives * torch.log2(1.0 - mean))


class NEMetricComputation(RecMetricComputation):
    """torchrec's NE computation (``torchrec.metrics.ne``): NE of each task, lifetime and windowed.

    States (``[n_tasks]`` float64, summed over ranks; each with a window twin)::

        cross_entropy_sum     sum_i w_i * -(y_i log2 q_i + (1 - y_i) log2(1 - q_i)),  q_i = clamp(p_i, eta, 1 - eta)
        weighted_num_samples  sum_i w_i
        pos_labels            sum_i w_i y_i
        neg_labels            sum_i w_i (1 - y_i)

    NE = cross_entropy_sum / (the same sum for a constant prediction of the mean label): the ratio
    of :class:`NE` (natural logs cancel in it). ``include_logloss=True`` adds the log loss in bits,
    ``cross_entropy_sum / (pos_labels + neg_labels)``.

    Args:
        include_logloss: also report ``logloss``.
        allow_missing_label_with_zero_weight: a task without any weight reports ``eta`` instead of NaN.
        *args, **kwargs: :class:`~lightrec.metrics.computation.RecMetricComputation`'s.
    """

    def __init__(self, *args: Any, include_logloss: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._include_logloss = include_logloss
        self.eta = DEFAULT_EPS
        for name in ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels"):
            self._add_state(name, torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=True,
                            dist_reduce_fx="sum", persistent=True)  # fmt: skip

    def update(self, *, predictions: Tensor | None, labels: Tensor, weights: Tensor | None, **kwargs: Any) -> None:
        p, y, w = self._inputs(predictions, labels, weights)
        q = p.clamp(self.eta, 1.0 - self.eta)
        cross_entropy = -w * (y * torch.log2(q) + (1.0 - y) * torch.log2(1.0 - q))
        states = {
            "cross_entropy_sum": cross_entropy.sum(-1),
            "weighted_num_samples": w.sum(-1),
            "pos_labels": (w * y).sum(-1),
            "neg_labels": (w * (1.0 - y)).sum(-1),
        }
        self._update_states(states, p.size(-1))

    def _ne(self, ce: Tensor, weights: Tensor, pos: Tensor, neg: Tensor) -> Tensor:
        ne = ce / _log2_entropy_sum(pos, neg, self.eta)
        if self._allow_missing_label_with_zero_weight:
            ne = torch.where(weights > 0, ne, torch.full_like(ne, self.eta))
        return ne

    def _compute(self) -> list[MetricComputationReport]:
        names = ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels")
        lifetime = [getattr(self, n) for n in names]
        window = [self.get_window_state(n) for n in names]
        reports = [
            MetricComputationReport(MetricName.NE, MetricPrefix.LIFETIME, self._ne(*lifetime)),
            MetricComputationReport(MetricName.NE, MetricPrefix.WINDOW, self._ne(*window)),
        ]
        if self._include_logloss:
            for prefix, (ce, _, pos, neg) in ((MetricPrefix.LIFETIME, lifetime), (MetricPrefix.WINDOW, window)):
                reports.append(MetricComputationReport(MetricName.LOG_LOSS, prefix, ce / (pos + neg).clamp(min=self.eta)))
        return reports


# torchrec's per-metric classes (RecMetric of one metric, torchrec's constructor), registered with RecMetric
NEMetric = register_rec_metric("NEMetric", RecMetricEnum.NE, NE, [("ne", read_value)])
LogLossMetric = register_rec_metric("LogLossMetric", RecMetricEnum.LOG_LOSS, LogLoss, [("logloss", read_value)])
