"""Recall@k for retrieval models (two-tower): is the true item among the top ``k`` candidates?

Inputs per batch::

    scores  [B, C]  floating   score of each of C candidates for each query (higher = better)
    target  [B]     int64      index in [0, C) of the relevant candidate of each query

With in-batch negatives (``scores = query_emb @ item_emb.T``, ``C == B``) the target is
``torch.arange(B)``.

Ties are resolved by their expectation under a uniformly random order, like AUC's one half: if
``g`` candidates score strictly above the target and ``e`` others score exactly the same as it,
the query contributes ``clamp((k - g) / (e + 1), 0, 1)``. Without ties that is ``[g < k]``, the
usual hit indicator; unlike ``torch.topk``'s arbitrary tie order it is deterministic, and a
constant scorer gets ``k / C`` rather than a perfect score.

    RecallAtK = sum_queries hit_i / number_of_queries
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import rank_zero_warn

from lightrec.metrics._validation import MetricInputError, nan_result


def recall_at_k_hits(scores: Tensor, target: Tensor, k: int) -> Tensor:
    """Per-query (tie-averaged) hit value of recall@k.

    Args:
        scores: ``[B, C]`` candidate scores.
        target: ``[B]`` int64 index of the relevant candidate of each row.
        k: cut-off, >= 1.

    Returns:
        ``[B]`` float64 tensor with values in ``[0, 1]``.
    """
    target_score = scores.gather(1, target.view(-1, 1))
    greater = (scores > target_score).sum(dim=1).to(torch.float64)
    tied_others = (scores == target_score).sum(dim=1).to(torch.float64) - 1.0
    return ((k - greater) / (tied_others + 1.0)).clamp(0.0, 1.0)


class RecallAtK(Metric):
    """Recall@k over every query seen since the last ``reset``, synced across ranks.

    Args:
        k: cut-off, an int >= 1.
        validate_args: check targets are in range and scores have no NaN on every update (one
            device sync per update on accelerators).
        **kwargs: forwarded to :class:`torchmetrics.Metric`.

    ``compute`` returns a float32 scalar; NaN with a warning when no query was seen.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    recall_hits: Tensor
    recall_queries: Tensor

    def __init__(self, k: int = 10, validate_args: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"RecallAtK: `k` must be an int >= 1, got {k!r}.")
        self.k = k
        self.validate_args = validate_args
        zero = torch.tensor(0.0, dtype=torch.float64)
        self.add_state("recall_hits", default=zero.clone(), dist_reduce_fx="sum")
        self.add_state("recall_queries", default=zero.clone(), dist_reduce_fx="sum")

    def update(self, scores: Tensor, target: Tensor) -> None:
        """Adds a batch of queries.

        Args:
            scores: ``[B, C]`` floating candidate scores.
            target: ``[B]`` integer index in ``[0, C)`` of each query's relevant candidate.
        """
        scores, target = self._check(scores, target)
        if scores.shape[0] == 0:
            return
        hits = recall_at_k_hits(scores.detach(), target, self.k)
        self.recall_hits += hits.sum().to(self.recall_hits.dtype)
        self.recall_queries += float(scores.shape[0])

    def compute(self) -> Tensor:
        """Returns recall@k of every query seen (all ranks) as a float32 scalar; NaN when empty."""
        queries = self.recall_queries.double()
        if queries <= 0:
            rank_zero_warn("RecallAtK is undefined because no queries were seen; returning NaN.", UserWarning)
            return nan_result(self.device)
        return (self.recall_hits.double() / queries).to(torch.float32)

    def _check(self, scores: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        for arg, value in (("scores", scores), ("target", target)):
            if not isinstance(value, Tensor):
                raise TypeError(f"RecallAtK: `{arg}` must be a torch.Tensor, got {type(value).__name__}.")
        if scores.dim() != 2:
            raise MetricInputError(
                f"RecallAtK: `scores` must have shape [B, C] (queries x candidates), got {list(scores.shape)}."
            )
        if not torch.is_floating_point(scores):
            raise TypeError(f"RecallAtK: `scores` must be floating point, got dtype {scores.dtype}.")
        if target.dim() == 2 and target.shape[1] == 1:
            target = target[:, 0]
        if target.dim() != 1 or target.shape[0] != scores.shape[0]:
            raise MetricInputError(
                f"RecallAtK: `target` must have shape [B] = [{scores.shape[0]}] (one candidate index per "
                f"row of `scores`), got {list(target.shape)}."
            )
        if torch.is_floating_point(target) or target.dtype == torch.bool or target.is_complex():
            raise TypeError(
                f"RecallAtK: `target` must hold integer candidate indices, got dtype {target.dtype}."
            )
        target = target.to(device=scores.device, dtype=torch.long)
        if self.validate_args and target.numel() > 0:
            num_candidates = scores.shape[1]
            bad_target = (target < 0) | (target >= num_candidates)
            flags = torch.stack([bad_target.any(), torch.isnan(scores).any()]).tolist()
            if flags[0]:
                raise MetricInputError(
                    f"RecallAtK: `target` must be indices in [0, {num_candidates}) (the number of columns "
                    f"of `scores`); got values such as {target[bad_target][:5].tolist()}."
                )
            if flags[1]:
                raise MetricInputError("RecallAtK: `scores` contains NaN; check the model outputs.")
        return scores, target
