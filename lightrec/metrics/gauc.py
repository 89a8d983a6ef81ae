"""Grouped AUC (GAUC, "session AUC"): the AUC of each group of candidates, averaged over the groups
(torchrec's ``torchrec.metrics.gauc``).

A batch holds several groups -- the candidates shown to one user in one session -- one after the
other; ``num_candidates`` says how many samples each group has::

    predictions  [n_tasks, N]    labels [n_tasks, N]    weights [n_tasks, N]
    num_candidates [G]           sum(num_candidates) == N        group g: samples offsets[g] .. offsets[g+1]

For one group with positive weight mass ``W+`` and negative mass ``W-`` its AUC is the weighted
probability that a positive is ranked above a negative, ties counting one half::

    AUC_g = sum over positives i, negatives j of w_i w_j ([p_i > p_j] + 1/2 [p_i == p_j]) / (W+ W-)

(a soft label ``y`` counts ``w y`` as positive and ``w (1 - y)`` as negative mass). A group counts
only when it holds both classes and its predictions are not all equal; GAUC is the mean AUC of the
groups that count -- ``(sum of their AUCs + 1e-9) / (their number + 2e-9)``, torchrec's smoothing,
so 0.5 when none counts. torchrec breaks prediction ties by sort order and also skips a group
whose predictions are all equal *or zero* (it pads groups with zeros); lightrec needs no padding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightrec.metrics.computation import MetricComputationReport, RecMetricComputation, RecMetricException
from lightrec.metrics.metrics_namespace import MetricName, MetricPrefix

__all__ = ["GAUCMetricComputation", "compute_gauc_states", "grouped_auc"]


def _padded(values: Tensor, num_candidates: Tensor, fill: float) -> Tensor:
    """``[n_tasks, N]`` -> ``[n_tasks, G, L]`` (``L``: the largest group), padded with ``fill``."""
    groups, longest = num_candidates.numel(), int(num_candidates.max())
    starts = torch.cumsum(num_candidates, 0) - num_candidates
    group = torch.repeat_interleave(torch.arange(groups, device=values.device), num_candidates)
    position = torch.arange(values.size(-1), device=values.device) - starts[group]
    out = values.new_full((values.size(0), groups, longest), fill)
    out[:, group, position] = values
    return out


def grouped_auc(
    predictions: Tensor, labels: Tensor, weights: Tensor, num_candidates: Tensor
) -> tuple[Tensor, Tensor]:
    """The AUC of every group (module docstring) and whether it counts.

    Args:
        predictions, labels, weights: ``[n_tasks, N]``.
        num_candidates: ``[G]`` samples of each group, summing to ``N``.

    Returns:
        ``(auc [n_tasks, G] float64, counts [n_tasks, G] bool)``.
    """
    valid = _padded(torch.ones_like(predictions, dtype=torch.bool), num_candidates, False)
    # padding sorts last (+inf) and weighs nothing, so it never changes a group's sums
    p = _padded(predictions.double(), num_candidates, float("inf"))
    w = _padded(weights.double(), num_candidates, 0.0)
    y = _padded(labels.double(), num_candidates, 0.0)
    p, order = torch.sort(p, dim=-1)
    pos, neg = (w * y).gather(-1, order), (w * (1.0 - y)).gather(-1, order)
    # tie blocks: equal predictions share a block; a positive beats the negative mass of the blocks
    # before its own and half of its own block's
    new_block = torch.ones_like(p, dtype=torch.bool)
    new_block[..., 1:] = p[..., 1:] != p[..., :-1]
    block = torch.cumsum(new_block.long(), -1) - 1
    block_neg = torch.zeros_like(neg).scatter_add_(-1, block, neg)
    below = torch.cumsum(block_neg, -1) - block_neg
    beaten = below.gather(-1, block) + 0.5 * block_neg.gather(-1, block)
    w_pos, w_neg = pos.sum(-1), neg.sum(-1)
    auc = (pos * beaten).sum(-1) / (w_pos * w_neg).clamp(min=1e-300)
    real = _padded(predictions.double(), num_candidates, float("nan"))
    first = real[..., :1]
    all_equal = ((real == first) | ~valid).all(-1)
    counts = (w_pos > 0) & (w_neg > 0) & ~all_equal
    return torch.where(counts, auc, torch.zeros_like(auc)), counts


def compute_gauc_states(
    predictions: Tensor, labels: Tensor, weights: Tensor, num_candidates: Tensor
) -> dict[str, Tensor]:
    """``{"auc_sum": [n_tasks], "num_samples": [n_tasks]}``: the summed AUC of the groups that count,
    and their number (the states GAUC keeps)."""
    if num_candidates.numel() == 0:
        zeros = torch.zeros(predictions.size(0), dtype=torch.double, device=predictions.device)
        return {"auc_sum": zeros, "num_samples": zeros.clone()}
    auc, counts = grouped_auc(predictions, labels, weights, num_candidates)
    return {"auc_sum": auc.sum(-1), "num_samples": counts.double().sum(-1)}


def _gauc(auc_sum: Tensor, num_groups: Tensor) -> Tensor:
    return (auc_sum + 1e-9) / (num_groups + 2e-9)


class GAUCMetricComputation(RecMetricComputation):
    """GAUC per task, lifetime and windowed (module docstring), and the number of groups that counted.

    States (``[n_tasks]`` float64 with window twins, summed over ranks): ``auc_sum``, ``num_samples``
    (groups that counted).

    ``update`` takes ``num_candidates`` (``[G]``, the size of each group) besides torchrec's three tensors.
    """

    auc_sum: Tensor
    num_samples: Tensor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("auc_sum", "num_samples"):
            self._add_state(name, torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=True,
                            dist_reduce_fx="sum", persistent=True)  # fmt: skip

    def update(  # type: ignore[override]  # num_candidates: GAUC's extra input, as in torchrec
        self,
        *,
        predictions: Tensor | None,
        labels: Tensor,
        weights: Tensor | None,
        num_candidates: Tensor,
        **kwargs: Any,
    ) -> None:
        p, y, w = self._inputs(predictions, labels, weights)
        num_candidates = num_candidates.reshape(-1).long().to(p.device)
        if int(num_candidates.sum()) != p.size(-1) or bool((num_candidates < 0).any()):
            raise RecMetricException(
                f"GAUCMetricComputation: num_candidates {num_candidates.tolist()} must be sizes >= 0 that add up to "
                f"the {p.size(-1)} samples of the batch"
            )
        self._update_states(compute_gauc_states(p, y, w, num_candidates[num_candidates > 0]), p.size(-1))

    def _compute(self) -> list[MetricComputationReport]:
        lifetime = (self.auc_sum, self.num_samples)
        window = (self.get_window_state("auc_sum"), self.get_window_state("num_samples"))
        return [
            MetricComputationReport(MetricName.GAUC, MetricPrefix.LIFETIME, _gauc(*lifetime)),
            MetricComputationReport(MetricName.GAUC, MetricPrefix.WINDOW, _gauc(*window)),
            MetricComputationReport(MetricName.GAUC_NUM_SAMPLES, MetricPrefix.LIFETIME, lifetime[1].clone()),
            MetricComputationReport(MetricName.GAUC_NUM_SAMPLES, MetricPrefix.WINDOW, window[1].clone()),
        ]
