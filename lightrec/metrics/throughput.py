"""torchrec's ``ThroughputMetric``: trained examples per second over all ranks.

Every ``update()`` is one step of ``batch_size`` samples on each of ``world_size`` ranks. The first
``warmup_steps`` steps are counted but not timed (compilation, caches); after them::

    lifetime_throughput = examples after warm-up / seconds after warm-up
    window_throughput   = examples of the steps in the last window_seconds / their seconds

``compute()`` returns ``{"throughput-throughput|total_examples": ...}`` and, once a step after
warm-up was timed, the two throughputs (float64 tensors). The counters are buffers, so they go
into the module's ``state_dict`` (a resumed run keeps counting).
"""

from __future__ import annotations

import time
from collections import deque

import torch
from torch import nn

from lightrec.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix, compose_metric_key

__all__ = ["ThroughputMetric"]

MAX_WINDOW_SECONDS = 2 * 60 * 60


class ThroughputMetric(nn.Module):
    """Examples per second of a training job (see the module docstring).

    Args:
        batch_size: samples per step on each rank.
        world_size: number of ranks.
        window_seconds: length of the window of ``window_throughput`` (capped at two hours).
        warmup_steps: steps before timing starts (>= 1).
    """

    total_examples: torch.Tensor
    warmup_examples: torch.Tensor
    time_lapse_after_warmup: torch.Tensor

    def __init__(self, *, batch_size: int, world_size: int, window_seconds: int, warmup_steps: int = 100) -> None:
        super().__init__()
        if window_seconds < 1:
            raise ValueError(f"window_seconds must be >= 1, got {window_seconds}")
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
        if batch_size <= 0 or world_size <= 0:
            raise ValueError(f"batch_size and world_size must be positive, got {batch_size} and {world_size}")
        self._batch_examples = batch_size * world_size
        self._window_seconds = min(window_seconds, MAX_WINDOW_SECONDS)
        self._warmup_steps = warmup_steps
        self.register_buffer("total_examples", torch.tensor(0, dtype=torch.long))
        self.register_buffer("warmup_examples", torch.tensor(0, dtype=torch.long))
        self.register_buffer("time_lapse_after_warmup", torch.tensor(0.0, dtype=torch.double))
        self._window: deque[float] = deque()
        self._window_time = 0.0
        self._previous = 0.0
        self._steps = 0
        name = str(MetricNamespace.THROUGHPUT)
        self._lifetime_key = compose_metric_key(name, name, MetricName.THROUGHPUT, MetricPrefix.LIFETIME)
        self._window_key = compose_metric_key(name, name, MetricName.THROUGHPUT, MetricPrefix.WINDOW)
        self._total_key = compose_metric_key(name, name, MetricName.TOTAL_EXAMPLES)

    def update(self) -> None:
        """Count one step (call once per training step, on every rank)."""
        now = time.monotonic()
        self._steps += 1
        self.total_examples += self._batch_examples
        if self._steps <= self._warmup_steps:
            self.warmup_examples += self._batch_examples
            if self._steps == self._warmup_steps:
                self._previous = now
            return
        lapse = now - self._previous
        self._previous = now
        self.time_lapse_after_warmup += lapse
        self._window.append(lapse)
        self._window_time += lapse
        while self._window_time > self._window_seconds and len(self._window) > 1:
            self._window_time -= self._window.popleft()

    def compute(self) -> dict[str, torch.Tensor]:
        """Total examples, and the lifetime / window throughputs once timing started."""
        out = {self._total_key: self.total_examples.clone()}
        seconds = float(self.time_lapse_after_warmup)
        if self._steps > self._warmup_steps and seconds > 0:
            timed = float(self.total_examples - self.warmup_examples)
            window = len(self._window) * self._batch_examples / self._window_time if self._window_time > 0 else 0.0
            out[self._lifetime_key] = torch.tensor(timed / seconds, dtype=torch.double)
            out[self._window_key] = torch.tensor(window, dtype=torch.double)
        return out
