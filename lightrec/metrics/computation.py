"""``RecMetricComputation``: torchrec's building block of a metric -- the states of one metric over
``n_tasks`` tasks, lifetime and windowed -- as a torchmetrics ``Metric`` that syncs across ranks.

Code built on torchrec (generative-recommenders' metric loggers, for one) makes its metrics out of
these classes directly::

    ne = NEMetricComputation(my_rank=rank, batch_size=B, n_tasks=2, window_size=10_000)
    ne.update(predictions=p, labels=y, weights=w)          # [n_tasks, B] each
    for report in ne.compute():                            # synced over the ranks
        report.name, report.metric_prefix, report.value    # "ne", "window_", [n_tasks] float64

A subclass declares its states with :meth:`RecMetricComputation._add_state` (``[n_tasks]`` tensors,
summed over ranks), adds each batch's contribution to a state *and* hands it to
:meth:`_aggregate_window_state`, and turns the states into :class:`MetricComputationReport` s in
``_compute``. ``add_window_state=True`` gives a state a twin, ``window_<name>``: the sum of the
contributions of this rank's most recent batches, at most ``window_size`` samples (the newest
batch always counts, however large) and at most ``MAX_BUFFER_COUNT`` batches. Window states are not
saved in the state dict (torchrec's choice: a resumed job starts a new window).

Unlike torchrec, ``compute()`` returns the reports on every rank (torchrec: on rank 0 unless
``compute_on_all_ranks=True``); the states are synced on every rank in both.
"""

from __future__ import annotations

import abc
import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics import Metric

from lightrec.metrics.metrics_namespace import MetricName, MetricPrefix

__all__ = ["MAX_BUFFER_COUNT", "MetricComputationReport", "RecMetricComputation", "RecMetricException"]

#: The most batches a window holds (torchrec's bound), whatever their sizes.
MAX_BUFFER_COUNT = 1000

# torchrec arguments a computation accepts and has no use for: lightrec computes every task on its
# own and returns values on every rank.
_TORCHREC_ONLY = ("enable_pt2_compile", "fuse_state_tensors")


class RecMetricException(ValueError):
    """A metric module was configured or fed wrongly (unknown metric, missing model output key)."""


@dataclass(frozen=True)
class MetricComputationReport:
    """One value of a computation: ``value`` is ``[n_tasks]`` (float64)."""

    name: MetricName | str
    metric_prefix: MetricPrefix
    value: Tensor
    description: str | None = None


class _WindowBuffer:
    """The contributions of this rank's newest batches to one window state."""

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self.parts: deque[tuple[Tensor, int]] = deque()
        self.samples = 0

    def add(self, window_state: Tensor, contribution: Tensor, num_samples: int) -> None:
        """Add ``contribution`` to ``window_state`` (in place) and drop the oldest batches past the bounds."""
        self.parts.append((contribution.detach().clone(), num_samples))
        self.samples += num_samples
        window_state += contribution.detach()
        while len(self.parts) > MAX_BUFFER_COUNT or (len(self.parts) > 1 and self.samples > self.max_samples):
            old, count = self.parts.popleft()
            window_state -= old.to(window_state.device)
            self.samples -= count


class RecMetricComputation(Metric, abc.ABC):
    """The states of one metric over ``n_tasks`` tasks (see the module docstring).

    Args:
        my_rank: this trainer's rank.
        batch_size: samples per batch on this rank.
        n_tasks: tasks computed together; every state is ``[n_tasks]``.
        window_size: samples of this rank's window (0: no window states).
        process_group: the group the states are summed over (None: the default group).
        compute_on_all_ranks, should_validate_update, compute_mode, fused_update_limit,
            allow_missing_label_with_zero_weight: torchrec's arguments, accepted; lightrec returns
            values on every rank and computes each task on its own (subclasses may read
            ``allow_missing_label_with_zero_weight``).
        **kwargs: forwarded to :class:`torchmetrics.Metric`.
    """

    full_state_update = False
    is_differentiable = False

    def __init__(
        self,
        my_rank: int,
        batch_size: int,
        n_tasks: int,
        window_size: int,
        compute_on_all_ranks: bool = False,
        should_validate_update: bool = False,
        compute_mode: object = None,
        process_group: dist.ProcessGroup | None = None,
        fused_update_limit: int = 0,
        allow_missing_label_with_zero_weight: bool = False,
        **kwargs: Any,
    ) -> None:
        for name in _TORCHREC_ONLY:
            kwargs.pop(name, None)
        super().__init__(process_group=process_group, **kwargs)
        if not isinstance(n_tasks, int) or n_tasks < 1:
            raise RecMetricException(f"{type(self).__name__}: n_tasks must be a positive int, got {n_tasks!r}")
        if not isinstance(window_size, int) or window_size < 0:
            raise RecMetricException(f"{type(self).__name__}: window_size must be an int >= 0, got {window_size!r}")
        self._my_rank, self._batch_size, self._n_tasks, self._window_size = my_rank, batch_size, n_tasks, window_size
        # kept for subclasses written against torchrec, which may read them
        self._compute_on_all_ranks, self._compute_mode = compute_on_all_ranks, compute_mode
        self._should_validate_update = should_validate_update
        self._allow_missing_label_with_zero_weight = allow_missing_label_with_zero_weight
        self._windows: dict[str, _WindowBuffer] | None = {} if window_size > 0 else None
        # torchmetrics wraps compute() to squeeze one-element results to scalars and to clone them
        # through dataclasses; the reports keep their [n_tasks] shape, so this class syncs itself.
        self.compute = self._synced_compute  # type: ignore[method-assign]

    # ------------------------------------------------------------------ states
    @staticmethod
    def get_window_state_name(state_name: str) -> str:
        return f"window_{state_name}"

    def get_window_state(self, state_name: str) -> Tensor:
        """The window twin of ``state_name`` (``[n_tasks]``)."""
        value: Tensor = getattr(self, self.get_window_state_name(state_name))
        return value

    def _add_state(self, name: str, default: Tensor, add_window_state: bool, **kwargs: Any) -> None:
        """Declare a state (``self.<name>``) and, with ``add_window_state``, its window twin.

        Args:
            name: the state's attribute name.
            default: its value after ``reset`` (``torch.zeros(self._n_tasks, dtype=torch.double)``).
            add_window_state: also keep ``window_<name>`` (see :meth:`_aggregate_window_state`).
            **kwargs: ``dist_reduce_fx`` (``"sum"`` for sums) and ``persistent`` (saved in the
                state dict), as torchmetrics' ``add_state`` takes them.
        """
        self.add_state(name, default, **kwargs)
        if add_window_state:
            if self._windows is None:
                raise RecMetricException(
                    f"{type(self).__name__}: state {name!r} asks for a window but window_size=0; pass window_size > 0"
                )
            window_name = self.get_window_state_name(name)
            self.add_state(window_name, default.detach().clone(), **{**kwargs, "persistent": False})
            self._windows[window_name] = _WindowBuffer(self._window_size)

    def _aggregate_window_state(self, state_name: str, state: Tensor, num_samples: int) -> None:
        """Add one batch's contribution ``state`` (``[n_tasks]``) of ``num_samples`` samples to the
        window twin of ``state_name``, dropping the oldest batches beyond the window."""
        window_name = self.get_window_state_name(state_name)
        if self._windows is None or window_name not in self._windows:
            raise RecMetricException(
                f"{type(self).__name__}: state {state_name!r} has no window state (add it with add_window_state=True)"
            )
        self._windows[window_name].add(getattr(self, window_name), state, num_samples)

    def _update_states(self, states: dict[str, Tensor], num_samples: int) -> None:
        """Add a batch's ``{state: [n_tasks] contribution}`` to the states and their windows."""
        for name, value in states.items():
            state = getattr(self, name)
            state += value.to(state.dtype)
            if self._windows is not None and self.get_window_state_name(name) in self._windows:
                self._aggregate_window_state(name, value.to(state.dtype), num_samples)

    def _tasks_by_samples(self, name: str, value: Tensor | None) -> Tensor | None:
        """``value`` as ``[n_tasks, B]`` (a 1-D ``[B]`` is one task's batch)."""
        if value is None:
            return None
        if value.dim() == 1 and self._n_tasks == 1:
            return value.unsqueeze(0)
        if value.dim() != 2 or value.size(0) != self._n_tasks:
            raise RecMetricException(
                f"{type(self).__name__}: {name} must be [n_tasks, batch] = [{self._n_tasks}, B], got shape "
                f"{list(value.shape)}"
            )
        return value

    def _inputs(
        self, predictions: Tensor | None, labels: Tensor, weights: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(predictions, labels, weights)`` as float64 ``[n_tasks, B]`` (weights default to 1)."""
        if predictions is None:
            raise RecMetricException(f"{type(self).__name__}.update needs predictions, got None")
        p = self._tasks_by_samples("predictions", predictions)
        y = self._tasks_by_samples("labels", labels)
        w = self._tasks_by_samples("weights", weights)
        assert p is not None and y is not None
        if y.shape != p.shape or (w is not None and w.shape != p.shape):
            raise RecMetricException(
                f"{type(self).__name__}: predictions {list(p.shape)}, labels {list(y.shape)} and weights "
                f"{None if w is None else list(w.shape)} must have one shape"
            )
        return p.double(), y.double(), (torch.ones_like(p, dtype=torch.double) if w is None else w.double())

    # ------------------------------------------------------------------ the torchrec contract
    @abc.abstractmethod
    def update(
        self, *, predictions: Tensor | None, labels: Tensor, weights: Tensor | None, **kwargs: Any
    ) -> None:
        """Add one batch: ``[n_tasks, B]`` predictions, labels and weights."""

    @abc.abstractmethod
    def _compute(self) -> list[MetricComputationReport]:
        """The reports, from the (already synced) states."""

    def pre_compute(self) -> None:
        """torchrec's hook, called by ``compute`` before the reports are built (after the states were
        synced); a no-op unless a subclass needs one."""

    def compute(self) -> list[MetricComputationReport]:
        """Every report, with the states summed over the ranks (collective: call it on every rank)."""
        return self._synced_compute()

    def _synced_compute(self) -> list[MetricComputationReport]:
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self.sync_on_compute):
            self.pre_compute()
            return [dataclasses.replace(r, value=r.value.detach().clone()) for r in self._compute()]

    def local_compute(self) -> list[MetricComputationReport]:
        """The reports of this rank's states alone (no communication)."""
        with self.sync_context(should_sync=False):
            return self._compute()

    def reset(self) -> None:
        super().reset()
        if self._windows is not None:
            self._windows = {name: _WindowBuffer(self._window_size) for name in self._windows}
