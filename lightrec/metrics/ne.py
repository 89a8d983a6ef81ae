"""Normalized entropy (NE): log loss relative to the loss of always predicting the average CTR.

With predictions ``p_i``, labels ``y_i`` in ``[0, 1]`` and sample weights ``w_i``::

    q_i     = clamp(p_i, eps, 1 - eps)
    logloss = -sum_i w_i * (y_i * ln q_i + (1 - y_i) * ln(1 - q_i)) / sum_i w_i
    ctr     = clamp(sum_i w_i * y_i / sum_i w_i, eps, 1 - eps)
    NE      = logloss / -(ctr * ln ctr + (1 - ctr) * ln(1 - ctr))

NE < 1 means the model beats the constant predictor ``p = ctr``; lower is better. The clamp keeps a
confident wrong prediction (``p = 0`` for a click) finite, and keeps NE finite when every label seen
is 0 or 1 (the denominator is then about ``eps * (1 - ln eps)``, so NE becomes very large: a
warning points that out). All sums are kept in float64 and reduced across ranks with ``sum``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import rank_zero_warn

from lightrec.metrics._validation import check_binary_inputs, nan_result

DEFAULT_EPS = 1e-12


def _binary_entropy(p: Tensor) -> Tensor:
    return -(p * torch.log(p) + (1.0 - p) * torch.log1p(-p))


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
        """The summed weight, or None (after a warning) when nothing was seen."""
        total = self.ne_weights.double()
        if total <= 0:
            rank_zero_warn(
                f"{type(self).__name__} is undefined because no samples (or only zero weights) were seen; "
                "returning NaN.",
                UserWarning,
            )
            return None
        return total

    def compute(self) -> Tensor:
        """Returns NE of everything seen (all ranks) as a float32 scalar; NaN when nothing was seen."""
        total = self._total_weight()
        if total is None:
            return nan_result(self.device)
        raw_ctr = self.ne_weighted_labels.double() / total
        if raw_ctr <= self.eps or raw_ctr >= 1.0 - self.eps:
            rank_zero_warn(
                f"NE: every label seen is {int(raw_ctr.round().item())}, so the baseline entropy is ~0 and "
                f"NE is dominated by eps={self.eps}; the value is finite but not meaningful.",
                UserWarning,
            )
        ctr = raw_ctr.clamp(self.eps, 1.0 - self.eps)
        logloss = self.ne_weighted_logloss.double() / total
        return (logloss / _binary_entropy(ctr)).to(torch.float32)


class LogLoss(NE):
    """Weighted binary cross-entropy (log loss) of probabilities: the numerator of :class:`NE`.

    Same arguments, inputs and states as :class:`NE`; ``compute`` returns
    ``sum_i w_i * logloss_i / sum_i w_i`` (NaN with a warning when nothing was seen).
    """

    higher_is_better = False

    def compute(self) -> Tensor:
        total = self._total_weight()
        if total is None:
            return nan_result(self.device)
        return (self.ne_weighted_logloss.double() / total).to(torch.float32)
