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
torchrec weighs the pairs the same way (its older releases ignored ``weights``: pass ``weights=None``
for their value) and divides by ``W+ W- + 1e-10``: 1e-10 lower for one unit pair, and far lower where
the weights are tiny; lightrec divides by ``W+ W-`` itself.

:class:`GAUCMetric` is torchrec's per-metric class: the same values by task, under torchrec's keys::

    gauc = GAUCMetric(world_size=1, my_rank=0, batch_size=B, tasks=[DefaultTaskInfo])
    gauc.update(predictions={"DefaultTask": p}, labels={"DefaultTask": y}, weights=None,
                num_candidates=sizes)                    # or required_inputs={"num_candidates": sizes}
    gauc.compute()       # {"gauc-DefaultTask|lifetime_gauc": ..., "gauc-DefaultTask|window_gauc_num_samples": ...}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightrec.metrics.computation import MetricComputationReport, RecMetricComputation, RecMetricException
from lightrec.metrics.metrics_config import RecComputeMode, RecTaskInfo
from lightrec.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix, compose_metric_key
from lightrec.metrics.rec_metric import _pick

__all__ = ["GAUCMetric", "GAUCMetricComputation", "compute_gauc_states", "grouped_auc"]


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
        **kwargs: object,
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


class GAUCMetric(nn.Module):
    """torchrec's ``GAUCMetric``: GAUC of each task (module docstring) under torchrec's keys, lifetime and
    windowed, synced over the ranks.

    Args:
        world_size, my_rank, batch_size: the trainer layout; this rank's window holds
            ``ceil(window_size / world_size)`` samples (at least one batch), as :class:`RecMetric`'s do.
        tasks: the tasks (their names key the values).
        window_size: samples of the window over all ranks.
        process_group: the group the states are summed over (None: the default group).
        compute_mode, fused_update_limit, compute_on_all_ranks, should_validate_update, **kwargs:
            torchrec's arguments, accepted and unused (every task is computed on its own, on every rank).
    """

    # torchrec's constructor, as NamedRecMetric's; not a RecMetric: those feed one torchmetrics metric per
    # task with (preds, labels, weights), and GAUC needs the group sizes as well
    def __init__(self, world_size: int, my_rank: int, batch_size: int, tasks: list[RecTaskInfo],
                 compute_mode: RecComputeMode | None = None, window_size: int = 100, fused_update_limit: int = 0,
                 compute_on_all_ranks: bool = False, should_validate_update: bool = False,
                 process_group: dist.ProcessGroup | None = None, **kwargs: object) -> None:  # fmt: skip
        super().__init__()
        if not tasks:
            raise RecMetricException("GAUCMetric: tasks is empty; give at least one RecTaskInfo")
        self._tasks = list(tasks)
        window = max(math.ceil(window_size / max(world_size, 1)), batch_size, 1)
        self._computation = GAUCMetricComputation(
            my_rank=my_rank,
            batch_size=batch_size,
            n_tasks=len(tasks),
            window_size=window,
            process_group=process_group,
        )

    @property
    def tasks(self) -> list[RecTaskInfo]:
        return list(self._tasks)

    def _stack(self, value: Mapping[str, Tensor] | Tensor | None, arg: str) -> Tensor | None:
        """Per task ``[B]`` or ``[1, B]`` (a bare tensor: every task's) -> ``[n_tasks, B]``; None (for
        every task) stays None, a task's None is ones (weights)."""
        rows = [_pick(value, task.name, arg) for task in self._tasks]
        for task, row in zip(self._tasks, rows):
            if row is not None and not (row.dim() == 1 or (row.dim() == 2 and row.size(0) == 1)):
                raise RecMetricException(
                    f"GAUCMetric: {arg} of task {task.name!r} must be [B] or [1, B], got shape {list(row.shape)}; "
                    "pass one row per task in a dict by task name"
                )
        present = [row.reshape(-1) for row in rows if row is not None]
        if not present:
            return None
        return torch.stack([torch.ones_like(present[0]) if row is None else row.reshape(-1) for row in rows])

    def update(
        self,
        *,
        predictions: Mapping[str, Tensor] | Tensor,
        labels: Mapping[str, Tensor] | Tensor,
        weights: Mapping[str, Tensor] | Tensor | None,
        num_candidates: Tensor | None = None,
        required_inputs: Mapping[str, Tensor] | None = None,
        **kwargs: object,
    ) -> None:
        """Add a batch: per task ``[B]`` predictions, labels and weights (None: 1; a bare tensor: every
        task's, as :class:`RecMetric` takes them), and the ``[G]`` group sizes as ``num_candidates`` or
        ``required_inputs["num_candidates"]`` (where torchrec's module puts them)."""
        if num_candidates is None and required_inputs is not None:
            num_candidates = required_inputs.get("num_candidates")
        if num_candidates is None:
            raise RecMetricException(
                "GAUCMetric.update needs the group sizes: pass num_candidates=[G] tensor (summing to the batch "
                "size) or required_inputs={'num_candidates': ...}"
            )
        p, y = self._stack(predictions, "predictions"), self._stack(labels, "labels")
        if p is None or y is None:
            raise RecMetricException(
                "GAUCMetric.update needs predictions and labels for every task, got None"
            )
        self._computation.update(
            predictions=p, labels=y, weights=self._stack(weights, "weights"), num_candidates=num_candidates
        )

    def compute(self) -> dict[str, Tensor]:
        """``{"gauc-<task>|lifetime_gauc": ..., ...}`` (GAUC and its group count, lifetime and window;
        collective: call on every rank)."""
        out: dict[str, Tensor] = {}
        for report in self._computation.compute():
            for i, task in enumerate(self._tasks):
                out[
                    compose_metric_key(MetricNamespace.GAUC, task.name, report.name, report.metric_prefix)
                ] = report.value[i]
        return out

    def reset(self) -> None:
        self._computation.reset()
