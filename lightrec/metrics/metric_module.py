"""torchrec's ``RecMetricModule`` and ``generate_metric_module``: the metrics of a training script.

::

    metrics = generate_metric_module(RecMetricModule, config, batch_size=B, world_size=W, my_rank=rank,
                                     state_metrics_mapping={}, device=device)
    for batch in loader:
        loss, (_, logits, labels) = model(batch)
        metrics.update({"prediction": torch.sigmoid(logits), "label": labels, "weight": torch.ones_like(labels)})
        if metrics.should_compute():
            print(metrics.compute())     # {"ne-DefaultTask|lifetime_ne": ..., "ne-DefaultTask|window_ne": ...}

Three kinds of metrics, as in torchrec: rec metrics (:mod:`lightrec.metrics.rec_metric`, from the
model's labels / predictions / weights), throughput (:class:`ThroughputMetric`) and state metrics
(any object with ``get_metrics() -> dict``, e.g. an optimizer wrapper reporting learning rates).
``compute`` is collective (the rec metrics sync their states): call it on every rank.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightrec.metrics.metrics_config import (
    SUPPORTED_METRICS,
    MetricsConfig,
    RecMetricEnum,
    RecTaskInfo,
    StateMetricEnum,
)
from lightrec.metrics.metrics_namespace import compose_customized_metric_key, compose_metric_namespace
from lightrec.metrics.rec_metric import RecMetric, RecMetricException, RecMetricList
from lightrec.metrics.throughput import ThroughputMetric

__all__ = ["RecMetricModule", "StateMetric", "generate_metric_module"]


class StateMetric(abc.ABC):
    """A component that reports metrics about itself (learning rates, counters)."""

    @abc.abstractmethod
    def get_metrics(self) -> dict[str, Tensor | float]:
        """``{metric name: value}``."""


def _check_compute_intervals(low: float, high: float) -> None:
    """Raise unless ``0 <= low <= high``, ``high > 0`` and ``low`` finite (seconds; see :class:`RecMetricModule`).

    torchrec refuses a negative ``min_compute_interval`` and a ``max_compute_interval <= 0``; NaN, an
    infinite minimum and ``min > max`` pass its checks and make its interval adjustment meaningless.
    """
    for arg, value in (("min_compute_interval", low), ("max_compute_interval", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{arg} must be a number of seconds, got {value!r} ({type(value).__name__})")
    if not (0.0 <= low < math.inf):
        raise RecMetricException(
            f"min_compute_interval must be a finite number of seconds >= 0, got {low}; pass 0.0 (the default) "
            "for no lower bound"
        )
    if not high > 0.0:
        raise RecMetricException(
            f"max_compute_interval must be > 0 seconds, got {high}; pass float('inf') (the default) for no upper bound"
        )
    if low > high:
        raise RecMetricException(
            f"min_compute_interval {low} is above max_compute_interval {high}; pass a min_compute_interval "
            "<= max_compute_interval"
        )


class RecMetricModule(nn.Module):
    """Rec metrics + throughput + state metrics of one trainer (see the module docstring).

    Args:
        batch_size: samples per step on each rank.
        world_size: number of ranks.
        rec_tasks: the model's tasks (where their labels, predictions and weights are in ``model_out``).
        rec_metrics: the metrics.
        throughput_metric: the throughput counter, or None.
        state_metrics: ``{namespace: StateMetric}``.
        compute_interval_steps: :meth:`should_compute` is True every this many updates.
        min_compute_interval, max_compute_interval: seconds; accepted for torchrec's signature (lightrec
            keeps ``compute_interval_steps`` fixed) and checked as torchrec checks them, and more:
            ``0 <= min_compute_interval <= max_compute_interval``, ``max_compute_interval > 0``, min
            finite, neither NaN.

    Raises:
        RecMetricException: ``compute_interval_steps <= 0``, or a compute interval out of range (a
            ``ValueError``, as torchrec raises).
        TypeError: a compute interval that is not a number.
    """

    def __init__(
        self,
        batch_size: int,
        world_size: int,
        rec_tasks: list[RecTaskInfo] | None = None,
        rec_metrics: RecMetricList | None = None,
        throughput_metric: ThroughputMetric | None = None,
        state_metrics: dict[str, StateMetric] | None = None,
        compute_interval_steps: int = 100,
        min_compute_interval: float = 0.0,
        max_compute_interval: float = float("inf"),
    ) -> None:
        super().__init__()
        if compute_interval_steps <= 0:
            raise RecMetricException(
                f"compute_interval_steps must be > 0, got {compute_interval_steps}; pass the number of updates "
                "between two computes (torchrec's default is 100)"
            )
        _check_compute_intervals(min_compute_interval, max_compute_interval)
        self.batch_size = batch_size
        self.world_size = world_size
        self.rec_tasks = list(rec_tasks or [])
        self.rec_metrics = rec_metrics if rec_metrics is not None else RecMetricList([])
        self.throughput_metric = throughput_metric
        self.state_metrics = dict(state_metrics or {})
        self.compute_interval_steps = compute_interval_steps
        self.trained_batches = 0

    def _task_outputs(self, model_out: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], ...]:
        labels, predictions, weights = {}, {}, {}
        for task in self.rec_tasks:
            missing = [k for k in (task.label_name, task.prediction_name) if k not in model_out]
            if missing:
                raise RecMetricException(
                    f"model_out lacks {missing} for task {task.name!r}; it has keys {sorted(model_out)}. Pass "
                    "the model's outputs under the RecTaskInfo's label_name / prediction_name"
                )
            predictions[task.name] = model_out[task.prediction_name].detach()
            labels[task.name] = model_out[task.label_name].detach()
            w = model_out.get(task.weight_name) if task.weighted else None
            weights[task.name] = (
                torch.ones_like(predictions[task.name], dtype=torch.float64) if w is None else w.detach()
            )
        return labels, predictions, weights

    def update(self, model_out: Mapping[str, Tensor], **kwargs: Any) -> None:
        """Add one step: ``model_out`` holds every task's ``[B]`` labels, predictions (and weights)."""
        if len(self.rec_metrics) and self.rec_tasks:
            labels, predictions, weights = self._task_outputs(model_out)
            self.rec_metrics.update(predictions=predictions, labels=labels, weights=weights)
        if self.throughput_metric is not None:
            self.throughput_metric.update()
        self.trained_batches += 1

    def should_compute(self) -> bool:
        return self.trained_batches % self.compute_interval_steps == 0

    def compute(self) -> dict[str, Tensor | float]:
        """Every metric's values by torchrec key (collective over the rec metrics' process group)."""
        out: dict[str, Tensor | float] = {}
        out.update(self.rec_metrics.compute())
        if self.throughput_metric is not None:
            out.update(self.throughput_metric.compute())
        for namespace, component in self.state_metrics.items():
            for name, value in component.get_metrics().items():
                out[compose_customized_metric_key(namespace, name)] = value
        return out

    def local_compute(self) -> dict[str, Tensor | float]:
        """Not offered: lightrec's metrics always sync over the ranks (use ``compute``)."""
        raise RecMetricException("local_compute is not offered by lightrec; compute() returns the global values")

    def reset(self) -> None:
        self.rec_metrics.reset()


def generate_metric_module(
    metric_class: type[RecMetricModule],
    metrics_config: MetricsConfig,
    batch_size: int,
    world_size: int,
    my_rank: int,
    state_metrics_mapping: Mapping[StateMetricEnum, StateMetric],
    device: torch.device | str,
    process_group: dist.ProcessGroup | None = None,
) -> RecMetricModule:
    """Build ``metric_class`` from ``metrics_config`` (torchrec's signature), on ``device``.

    Raises:
        RecMetricException: a metric lightrec does not compute, or a ``RecMetricDef`` naming its
            tasks both ways or neither.
        KeyError: a state metric of the config is missing from ``state_metrics_mapping``.
    """
    unsupported = sorted(m.name for m in metrics_config.rec_metrics if m not in SUPPORTED_METRICS)
    if unsupported:
        raise RecMetricException(
            f"metrics {unsupported} are not computed by lightrec; supported: {sorted(m.name for m in SUPPORTED_METRICS)}"
        )
    metrics = []
    for metric_enum, definition in metrics_config.rec_metrics.items():
        if bool(definition.rec_tasks) == bool(definition.rec_task_indices):
            raise RecMetricException(
                f"RecMetricDef of {metric_enum.name} must give exactly one of rec_tasks and rec_task_indices"
            )
        tasks = definition.rec_tasks or [metrics_config.rec_tasks[i] for i in definition.rec_task_indices]
        metrics.append(
            RecMetric(
                RecMetricEnum(metric_enum), world_size, my_rank, batch_size, tasks, definition.window_size,
                process_group, **(definition.arguments or {}),
            )  # fmt: skip
        )
    throughput = None
    if metrics_config.throughput_metric is not None:
        throughput = ThroughputMetric(
            batch_size=batch_size,
            world_size=world_size,
            window_seconds=metrics_config.throughput_metric.window_size,
            warmup_steps=metrics_config.throughput_metric.warmup_steps,
        )
    state_metrics = {}
    for state_enum in metrics_config.state_metrics:
        if state_enum not in state_metrics_mapping:
            raise KeyError(
                f"metrics_config.state_metrics lists {state_enum} but state_metrics_mapping has no entry for it"
            )
        state_metrics[compose_metric_namespace(str(state_enum), str(state_enum))] = state_metrics_mapping[state_enum]
    tasks = list(metrics_config.rec_tasks)
    for metric in metrics:
        tasks += [t for t in metric.tasks if t not in tasks]
    module = metric_class(
        batch_size=batch_size,
        world_size=world_size,
        rec_tasks=tasks,
        rec_metrics=RecMetricList(metrics),
        throughput_metric=throughput,
        state_metrics=state_metrics,
        compute_interval_steps=metrics_config.compute_interval_steps,
        min_compute_interval=metrics_config.min_compute_interval,
        max_compute_interval=metrics_config.max_compute_interval,
    )
    return module.to(device)
