"""Area under the ROC curve for binary click prediction, exact by default.

``AUC`` equals the normalised Mann-Whitney U statistic: the probability that a random positive is
scored above a random negative, ties counting one half (sklearn's ``roc_auc_score``). With sample
weights ``w`` and labels ``y`` in ``[0, 1]`` each sample carries positive mass ``w * y`` and negative
mass ``w * (1 - y)``::

    AUC = sum_{i, j} pos_i * neg_j * ([s_i > s_j] + 0.5 [s_i == s_j])  /  (sum_i pos_i * sum_j neg_j)

Two state layouts, chosen at construction:

============  ====================================  ======================  =================
mode          states (per rank)                     cross-rank reduction    result
============  ====================================  ======================  =================
exact         preds, labels, weights: lists of [b]  ``cat`` (all_gather)    exact
num_bins=K    pos_mass [K], neg_mass [K] (float64)  ``sum`` (all_reduce)    within one bin
============  ====================================  ======================  =================

The exact mode keeps every prediction (3 floats per sample, in the metric dtype) until ``reset``;
the histogram mode uses constant memory and treats predictions falling in the same bin of width
``1 / K`` as tied, so it errs by at most ``0.5 * sum_k pos_k * neg_k / (P * N)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from lightrec.metrics._validation import check_binary_inputs, undefined_result
from lightrec.metrics.metrics_config import RecMetricEnum
from lightrec.metrics.rec_metric import read_value, register_rec_metric


def auc_from_grouped_masses(pos_mass: Tensor, neg_mass: Tensor) -> Tensor:
    """AUC from positive/negative mass per score group, groups sorted by ascending score.

    Samples inside one group are tied: each positive-negative pair inside a group counts one half.

    Args:
        pos_mass: ``[G]`` positive mass of each group (float64 recommended).
        neg_mass: ``[G]`` negative mass of each group.

    Returns:
        0-dim float64 tensor; NaN when either total mass is zero (AUC is undefined with one class).
    """
    total_pos = pos_mass.sum()
    total_neg = neg_mass.sum()
    # Negatives strictly below each group, plus half of the negatives tied with it.
    neg_below = torch.cumsum(neg_mass, dim=0) - neg_mass
    u_statistic = (pos_mass * (neg_below + 0.5 * neg_mass)).sum()
    denom = total_pos * total_neg
    return torch.where(
        denom > 0,
        u_statistic / denom.clamp_min(torch.finfo(denom.dtype).tiny),
        torch.full_like(denom, float("nan")),
    )


def binary_auc(preds: Tensor, labels: Tensor, weights: Tensor | None = None) -> Tensor:
    """Exact (weighted) ROC AUC of one set of predictions; O(n log n).

    Args:
        preds: ``[n]`` scores (any real values; only their order matters).
        labels: ``[n]`` labels in ``[0, 1]``.
        weights: ``[n]`` non-negative sample weights, or None for all ones.

    Returns:
        0-dim float64 tensor; NaN when all mass is positive or all negative.
    """
    preds = preds.reshape(-1)
    labels = labels.reshape(-1).to(torch.float64)
    w = torch.ones_like(labels) if weights is None else weights.reshape(-1).to(torch.float64)
    sorted_preds, order = torch.sort(preds)
    # Group identical scores so ties share their pairs half-half, as in the U statistic.
    _, group = torch.unique_consecutive(sorted_preds, return_inverse=True)
    num_groups = int(group.max().item()) + 1 if group.numel() > 0 else 0
    pos = (labels * w)[order]
    neg = ((1.0 - labels) * w)[order]
    pos_mass = torch.zeros(num_groups, dtype=torch.float64, device=preds.device).index_add_(0, group, pos)
    neg_mass = torch.zeros(num_groups, dtype=torch.float64, device=preds.device).index_add_(0, group, neg)
    return auc_from_grouped_masses(pos_mass, neg_mass)


class AUC(Metric):
    """Binary ROC AUC over every prediction seen since the last ``reset``, synced across ranks.

    Example::

        auc = AUC()
        for batch in loader:
            auc.update(torch.sigmoid(model(batch)), batch.labels)
        auc.compute()        # all ranks' predictions together under torch.distributed

    Args:
        num_bins: None (default) for the exact AUC; an int ``K >= 2`` for the constant-memory
            histogram approximation, which requires ``preds`` in ``[0, 1]``.
        validate_args: check values (NaN, label range, weights >= 0) on every update; costs one
            device sync per update on accelerators.
        **kwargs: forwarded to :class:`torchmetrics.Metric` (``compute_on_cpu``, ``process_group``,
            ``dist_sync_on_step`` ...).

    ``compute`` returns a float32 scalar, NaN (with a warning) when the data seen so far holds no
    positive or no negative mass: AUC is undefined with a single class.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    # Metric states (declared for type checkers; torchmetrics keeps them in `_defaults`). A list
    # state becomes one concatenated tensor while synced, which `dim_zero_cat` accepts.
    auc_preds: list[Tensor]
    auc_labels: list[Tensor]
    auc_weights: list[Tensor]
    auc_pos_mass: Tensor
    auc_neg_mass: Tensor

    def __init__(self, num_bins: int | None = None, validate_args: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if num_bins is not None and (
            isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 2
        ):
            raise ValueError(f"AUC: `num_bins` must be None (exact AUC) or an int >= 2, got {num_bins!r}.")
        self.num_bins = num_bins
        self.validate_args = validate_args
        if num_bins is None:
            # Lists of per-batch tensors; `cat` all_gathers them (uneven sizes are padded by torchmetrics).
            self.add_state("auc_preds", default=[], dist_reduce_fx="cat")
            self.add_state("auc_labels", default=[], dist_reduce_fx="cat")
            self.add_state("auc_weights", default=[], dist_reduce_fx="cat")
        else:
            zeros = torch.zeros(num_bins, dtype=torch.float64)
            self.add_state("auc_pos_mass", default=zeros.clone(), dist_reduce_fx="sum")
            self.add_state("auc_neg_mass", default=zeros.clone(), dist_reduce_fx="sum")

    def update(self, preds: Tensor, labels: Tensor, weights: Tensor | None = None) -> None:
        """Adds a batch.

        Args:
            preds: ``[B]`` or ``[B, 1]`` scores (probabilities when ``num_bins`` is set).
            labels: ``[B]`` or ``[B, 1]`` labels in ``[0, 1]``.
            weights: ``[B]`` or ``[B, 1]`` sample weights >= 0, or None.
        """
        preds, labels, weights = check_binary_inputs(
            "AUC",
            preds,
            labels,
            weights,
            preds_are_probabilities=self.num_bins is not None,
            validate_args=self.validate_args,
        )
        if self.num_bins is None:
            # Stored in the metric dtype (float32 unless `set_dtype`) so every rank, including one
            # that saw no data and is padded by torchmetrics with that dtype, gathers the same type.
            dtype = self.dtype
            self.auc_preds.append(preds.to(dtype))
            self.auc_labels.append(labels.to(dtype))
            self.auc_weights.append(weights.to(dtype))
            return
        bins = (preds * self.num_bins).long().clamp_(0, self.num_bins - 1)
        self.auc_pos_mass.index_add_(0, bins, (labels * weights).to(self.auc_pos_mass.dtype))
        self.auc_neg_mass.index_add_(0, bins, ((1.0 - labels) * weights).to(self.auc_neg_mass.dtype))

    def compute(self) -> Tensor:
        """Returns the AUC of everything seen (all ranks), a float32 scalar; NaN with one class."""
        if self.num_bins is None:
            if len(self.auc_preds) == 0:
                return self._undefined("no samples were seen")
            value = binary_auc(
                dim_zero_cat(self.auc_preds), dim_zero_cat(self.auc_labels), dim_zero_cat(self.auc_weights)
            )
        else:
            value = auc_from_grouped_masses(self.auc_pos_mass.double(), self.auc_neg_mass.double())
        if torch.isnan(value):
            return self._undefined("all samples seen so far belong to one class (or have zero weight)")
        return value.to(torch.float32)

    def _undefined(self, why: str) -> Tensor:
        return undefined_result(self, "AUC", why)


# torchrec's per-metric classes (RecMetric of one metric, torchrec's constructor), registered with RecMetric
AUCMetric = register_rec_metric("AUCMetric", RecMetricEnum.AUC, AUC, [("auc", read_value)], undefined=0.5)
