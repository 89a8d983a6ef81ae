"""torchrec's ``RecMetric``: one metric over one or more tasks, lifetime and windowed, computed by
lightrec's torchmetrics metrics.

For every task a :class:`RecMetric` keeps

* a *lifetime* metric (e.g. :class:`~lightrec.metrics.NE`) updated with every batch, and
* a *window*: this rank's most recent batches, ``ceil(window_size / world_size)`` samples at most
  (torchrec's per-rank window; at least ``batch_size``) and ``MAX_BUFFER_COUNT`` batches at most, as
  torchrec's window states hold them (the newest batch is always kept), from which ``compute``
  builds a fresh metric.

``compute`` syncs both over the ranks (torchmetrics' sum / gather of states), so every rank gets
the global values; each rank's window covers its own last samples, together about ``window_size``.
Keys follow torchrec (:mod:`lightrec.metrics.metrics_namespace`)::

    {"ne-DefaultTask|lifetime_ne": ..., "ne-DefaultTask|window_ne": ...}

Values follow torchrec where a metric has nothing to divide by: 0 for CTR, calibration, accuracy,
MSE, RMSE and MAE, 0.5 for AUC, NaN for NE and log loss (lightrec's own metrics return NaN with a
warning there; :func:`register_rec_metric` names the value). The lifetime metrics' sums are saved in
the module's ``state_dict`` (torchrec's ``persistent=True``), so a resumed job keeps its lifetime
values; the exact AUC's predictions and every window are not (torchrec's choice too).

torchrec's building block for metrics of one's own, ``RecMetricComputation`` (and the
``MetricComputationReport`` it returns), lives in :mod:`lightrec.metrics.computation` and is
importable from here, torchrec's path for it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torchmetrics import Metric

from lightrec.metrics.computation import (
    MAX_BUFFER_COUNT,
    MetricComputationReport,
    RecMetricComputation,
    RecMetricException,
)
from lightrec.metrics.metrics_config import RecComputeMode, RecMetricEnum, RecTaskInfo
from lightrec.metrics.metrics_namespace import MetricPrefix, compose_metric_key

__all__ = [
    "MetricComputationReport",
    "NamedRecMetric",
    "read_sqrt",
    "read_value",
    "register_rec_metric",
    "RecMetric",
    "RecMetricComputation",
    "RecMetricException",
    "RecMetricList",
]


def read_value(metric: Metric) -> Tensor:
    """A metric's value, as a key reports it."""
    return metric.compute()


def read_sqrt(metric: Metric) -> Tensor:
    """The square root of a metric's value (RMSE from MSE)."""
    return metric.compute().sqrt()


Reader = Callable[[Metric], Tensor]
# enum -> (metric class, [(metric name in the key, how to read it from the metric)], value when undefined).
# Each metric's module registers its own (``register_rec_metric``): they import this module for
# ``NamedRecMetric``, so this one imports none of them; ``lightrec.metrics`` imports them all, before any
# of its modules is used.
_METRICS: dict[RecMetricEnum, tuple[type[Metric], list[tuple[str, Reader]], float | None]] = {}


class _TaskWindow:
    """The newest batches of one task on this rank: at most ``size`` samples and ``MAX_BUFFER_COUNT``
    batches (torchrec's bounds of a window state), the newest batch always."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.batches: deque[tuple[Tensor, Tensor, Tensor]] = deque()
        self.samples = 0

    def add(self, preds: Tensor, labels: Tensor, weights: Tensor) -> None:
        # copies: a caller may reuse its output buffers (CUDA graphs replay into the same tensors)
        self.batches.append((preds.detach().clone(), labels.detach().clone(), weights.detach().clone()))
        self.samples += preds.numel()
        while len(self.batches) > MAX_BUFFER_COUNT or (len(self.batches) > 1 and self.samples > self.size):
            self.samples -= self.batches.popleft()[0].numel()

    def tensors(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        if not self.batches:
            empty = torch.empty(0, device=device)
            return empty, empty, empty
        parts = list(zip(*self.batches))
        return torch.cat(parts[0]), torch.cat(parts[1]), torch.cat(parts[2])


class RecMetric(nn.Module):
    """One :class:`RecMetricEnum` metric over ``tasks`` (see the module docstring).

    Args:
        metric: which metric (one of ``metrics_config.SUPPORTED_METRICS``).
        world_size, my_rank, batch_size: the trainer layout (the window is per rank).
        tasks: the tasks the metric is computed for.
        window_size: samples of the window over all ranks (each rank keeps ``ceil(window_size /
            world_size)``, at least ``batch_size``).
        process_group: group the states are synced over (None: the default group).
        **kwargs: arguments of the lightrec metric (e.g. ``num_bins`` for AUC); torchrec-only
            arguments (``compute_mode``, ``fused_update_limit``, ``compute_on_all_ranks``,
            ``should_validate_update``) are accepted and ignored.
    """

    _IGNORED = frozenset({"compute_mode", "fused_update_limit", "compute_on_all_ranks", "should_validate_update"})

    def __init__(
        self,
        metric: RecMetricEnum,
        world_size: int,
        my_rank: int,
        batch_size: int,
        tasks: list[RecTaskInfo],
        window_size: int = 10_000_000,
        process_group: dist.ProcessGroup | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if metric not in _METRICS:
            raise RecMetricException(
                f"metric {metric} is not computed by lightrec; use one of {sorted(m.name for m in _METRICS)}"
            )
        if not tasks:
            raise RecMetricException(f"{metric}: tasks is empty; give at least one RecTaskInfo")
        if window_size <= 0:
            raise RecMetricException(f"{metric}: window_size must be > 0, got {window_size}")
        self.metric_enum = metric
        self._metric_class, self._readers, self._undefined_value = _METRICS[metric]
        self._kwargs = {k: v for k, v in kwargs.items() if k not in self._IGNORED}
        if process_group is not None:
            self._kwargs["process_group"] = process_group
        self._tasks = list(tasks)
        self._lifetime_metrics: dict[str, Metric] = {t.name: self._new_metric(lifetime=True) for t in tasks}
        self._lifetime = nn.ModuleDict(self._lifetime_metrics)  # registered: .to(device) moves them
        self._window_size = max(math.ceil(window_size / max(world_size, 1)), batch_size, 1)
        self._windows = {t.name: _TaskWindow(self._window_size) for t in tasks}

    def _new_metric(self, lifetime: bool = False) -> Metric:
        metric = self._metric_class(**self._kwargs)
        metric.undefined_value = self._undefined_value  # torchrec's value where nothing can be divided
        if lifetime:
            # torchrec saves the lifetime sums in the state dict (``persistent=True``); torchmetrics' default
            # is not to. The exact AUC's list states stay out, as torchrec's AUC states do.
            for name, default in metric._defaults.items():
                if isinstance(default, Tensor):
                    metric._persistent[name] = True
        return metric

    @property
    def tasks(self) -> list[RecTaskInfo]:
        return list(self._tasks)

    def update(
        self,
        *,
        predictions: Mapping[str, Tensor] | Tensor,
        labels: Mapping[str, Tensor] | Tensor,
        weights: Mapping[str, Tensor] | Tensor | None,
        **kwargs: Any,
    ) -> None:
        """Add a batch: per task name ``[B]`` predictions, labels and weights (a tensor: the only task)."""
        for task in self._tasks:
            p, y, w = (_pick(x, task.name, arg) for x, arg in ((predictions, "predictions"), (labels, "labels"),
                                                                (weights, "weights")))  # fmt: skip
            if p is None or y is None:
                raise RecMetricException(f"{self.metric_enum}: no predictions/labels for task {task.name!r}")
            w = torch.ones_like(p, dtype=torch.float64) if w is None else w
            self._lifetime_metrics[task.name].update(p, y, w)
            self._windows[task.name].add(p.reshape(-1), y.reshape(-1), w.reshape(-1))

    def compute(self) -> dict[str, Tensor]:
        """``{key: value}`` of every task, lifetime and window (collective: call on every rank)."""
        out: dict[str, Tensor] = {}
        namespace = self.metric_enum.value
        for task in self._tasks:
            lifetime = self._lifetime_metrics[task.name]
            window = self._new_metric().to(lifetime.device)
            p, y, w = self._windows[task.name].tensors(lifetime.device)
            window.update(p, y, w)
            for name, read in self._readers:
                out[compose_metric_key(namespace, task.name, name, MetricPrefix.LIFETIME)] = read(lifetime)
                out[compose_metric_key(namespace, task.name, name, MetricPrefix.WINDOW)] = read(window)
        return out

    def reset(self) -> None:
        for task in self._tasks:
            self._lifetime_metrics[task.name].reset()
            self._windows[task.name] = _TaskWindow(self._window_size)


class NamedRecMetric(RecMetric):
    """torchrec's per-metric classes (``NEMetric``, ``AUCMetric``, ...): a :class:`RecMetric` of the subclass's
    ``metric`` with torchrec's constructor, ``(world_size, my_rank, batch_size, tasks, compute_mode,
    window_size, fused_update_limit, compute_on_all_ranks, should_validate_update, process_group, **kwargs)``
    (the torchrec-only arguments are accepted and ignored, as :class:`RecMetric` says)."""

    metric: ClassVar[RecMetricEnum]

    def __init__(
        self,
        world_size: int,
        my_rank: int,
        batch_size: int,
        tasks: list[RecTaskInfo],
        compute_mode: RecComputeMode | None = None,
        window_size: int = 100,
        fused_update_limit: int = 0,
        compute_on_all_ranks: bool = False,
        should_validate_update: bool = False,
        process_group: dist.ProcessGroup | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(self.metric, world_size, my_rank, batch_size, tasks, window_size, process_group, **kwargs)


def register_rec_metric(
    name: str,
    metric: RecMetricEnum,
    metric_class: type[Metric],
    readers: list[tuple[str, Reader]],
    undefined: float | None = None,
) -> type[NamedRecMetric]:
    """Make ``metric`` computable by :class:`RecMetric` (``metric_class`` per task, each key read by its reader)
    and return torchrec's class of it, ``name`` (e.g. ``NEMetric``), for the caller's module to define.

    ``undefined``: the value torchrec reports where the metric has nothing to divide by (set as the
    metrics' ``undefined_value``, see :func:`lightrec.metrics._validation.undefined_result`); None keeps
    NaN and its warning."""
    _METRICS[metric] = (metric_class, readers, undefined)
    doc = f"torchrec's ``{name}``: :class:`RecMetric` of ``{metric}`` with torchrec's constructor (``NamedRecMetric``)."
    return type(name, (NamedRecMetric,), {"metric": metric, "__doc__": doc, "__module__": metric_class.__module__})


def _pick(value: Mapping[str, Tensor] | Tensor | None, task: str, arg: str) -> Tensor | None:
    if value is None or isinstance(value, Tensor):
        return value
    if task not in value:
        raise RecMetricException(f"{arg} has no entry for task {task!r} (it has {sorted(value)})")
    return value[task]


class RecMetricList(nn.Module):
    """Several :class:`RecMetric` s updated and computed together."""

    def __init__(self, rec_metrics: list[RecMetric]) -> None:
        super().__init__()
        self._metrics = list(rec_metrics)
        self.rec_metrics = nn.ModuleList(rec_metrics)

    def __len__(self) -> int:
        return len(self.rec_metrics)

    def update(self, **kwargs: Any) -> None:
        for metric in self._metrics:
            metric.update(**kwargs)

    def compute(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for metric in self._metrics:
            out.update(metric.compute())
        return out

    def reset(self) -> None:
        for metric in self._metrics:
            metric.reset()
