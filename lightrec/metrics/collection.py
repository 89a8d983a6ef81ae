"""``rec_metrics``: one ``MetricCollection`` with the usual click-prediction metrics.

::

    metrics = rec_metrics(prefix="val/")           # auc, ne, calibration, ctr, accuracy
    metrics.update(torch.sigmoid(logits), labels)  # preds [B] probabilities, labels [B] 0/1 floats
    metrics.compute()  # {"val/auc": ..., "val/ne": ..., "val/calibration": ..., ...}, synced over ranks

Inside a LightningModule keep the collection as an attribute (so Lightning moves it to the device)
and log it with ``self.log_dict(self.val_metrics)`` at epoch end, or call ``compute`` yourself.
``RecallAtK`` takes different inputs (scores [B, C], target [B]) and is built separately.

``SlidingWindow``: a binary click metric over the last ``window`` samples, for progressive validation.

Online training scores every batch before it trains on it; the quality *now* is the metric of the
most recent predictions, not of everything since the start. ``SlidingWindow`` keeps the newest
``window`` samples of this rank in a ring buffer of fixed size -- three tensors, so its memory and
its sync cost do not grow with the stream -- and computes a fresh metric over them::

    auc = SlidingWindow("auc", window=100_000)
    for batch in stream:
        auc.update(torch.sigmoid(logits), batch.labels)     # [B] probabilities, [B] labels
        auc.compute()     # AUC of the last 100k samples of every rank (all ranks' windows together)

State (per rank; ``W = window``)::

    window_preds    [W] float   predictions, newest overwriting oldest (slot = sample count mod W)
    window_labels   [W] float   labels in [0, 1]
    window_weights  [W] float   sample weights; 0 marks a slot not filled yet
    window_seen     []  int64   samples seen since the last reset (all ranks: summed)

``compute`` gathers every rank's buffers (``cat``) and runs the metric on them with the weights, so
empty slots weigh nothing: with ``R`` ranks it covers the last ``W`` samples of each, ``R * W`` in all
once full. Every metric of :func:`~lightrec.metrics.rec_metrics` works by name (``"auc"``, ``"ne"``,
``"calibration"``, ``"ctr"``, ``"accuracy"``), as does any factory of a metric taking
``update(preds, labels, weights)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric, MetricCollection
from torchmetrics.utilities import rank_zero_warn

from lightrec.metrics._validation import check_binary_inputs, nan_result
from lightrec.metrics.auc import AUC
from lightrec.metrics.ne import DEFAULT_EPS, NE
from lightrec.metrics.rates import CTR, Accuracy, Calibration

DEFAULT_METRICS: tuple[str, ...] = ("auc", "ne", "calibration", "ctr", "accuracy")
"""Names ``rec_metrics`` understands, which are also the keys of the collection it returns."""


class UnknownMetricError(KeyError):
    """``rec_metrics`` was asked for a metric name it does not know."""

    def __str__(self) -> str:  # KeyError would print the repr of the message, quotes and all
        return str(self.args[0])


def rec_metrics(
    names: Sequence[str] | str = DEFAULT_METRICS,
    *,
    prefix: str | None = None,
    postfix: str | None = None,
    auc_num_bins: int | None = None,
    ne_eps: float = DEFAULT_EPS,
    accuracy_threshold: float = 0.5,
    validate_args: bool = True,
    **metric_kwargs: Any,
) -> MetricCollection:
    """Builds a ``MetricCollection`` of binary click metrics that share ``update(preds, labels, weights=None)``.

    Args:
        names: metric names, any of ``"auc"``, ``"ne"``, ``"calibration"``, ``"ctr"``, ``"accuracy"``
            (case-insensitive); a single string builds a one-metric collection.
        prefix: prepended to every key of ``compute()`` (e.g. ``"train/"``).
        postfix: appended to every key.
        auc_num_bins: None for the exact AUC, or the histogram resolution (see :class:`AUC`).
        ne_eps: clamp of :class:`NE`.
        accuracy_threshold: threshold of :class:`Accuracy`.
        validate_args: value checks on every update, for every metric.
        **metric_kwargs: forwarded to every :class:`torchmetrics.Metric` (``compute_on_cpu``,
            ``process_group``, ``dist_sync_on_step`` ...).

    Returns:
        A ``MetricCollection`` keyed by the given names (plus prefix/postfix). Compute groups are off:
        the metrics share no state, so grouping could only cost a comparison on the first update.

    Raises:
        UnknownMetricError: a name is not one of :data:`DEFAULT_METRICS`.
        ValueError: ``names`` is empty or repeats a name.
    """
    if isinstance(names, str):
        names = (names,)
    requested = [str(name).lower() for name in names]
    if not requested:
        raise ValueError(f"rec_metrics: `names` is empty; pass some of {DEFAULT_METRICS}.")
    duplicates = sorted({name for name in requested if requested.count(name) > 1})
    if duplicates:
        raise ValueError(f"rec_metrics: `names` repeats {duplicates}; list each metric once.")
    unknown = [name for name in requested if name not in DEFAULT_METRICS]
    if unknown:
        raise UnknownMetricError(
            f"rec_metrics: unknown metric name(s) {unknown}; choose from {DEFAULT_METRICS}. "
            "RecallAtK takes [B, C] scores and is built directly: lightrec.metrics.RecallAtK(k)."
        )
    builders = {
        "auc": lambda: AUC(num_bins=auc_num_bins, validate_args=validate_args, **metric_kwargs),
        "ne": lambda: NE(eps=ne_eps, validate_args=validate_args, **metric_kwargs),
        "calibration": lambda: Calibration(validate_args=validate_args, **metric_kwargs),
        "ctr": lambda: CTR(validate_args=validate_args, **metric_kwargs),
        "accuracy": lambda: Accuracy(
            threshold=accuracy_threshold, validate_args=validate_args, **metric_kwargs
        ),
    }
    metrics: dict[str, Metric | MetricCollection] = {name: builders[name]() for name in requested}
    return MetricCollection(metrics, prefix=prefix, postfix=postfix, compute_groups=False)


def _factory(metric: str | Callable[[], Metric], validate_args: bool) -> tuple[str, Callable[[], Metric]]:
    if callable(metric):
        return getattr(metric, "__name__", type(metric).__name__), metric
    name = str(metric).lower()
    if name not in DEFAULT_METRICS:
        raise UnknownMetricError(
            f"SlidingWindow: unknown metric {metric!r}; choose from {DEFAULT_METRICS} or pass a factory "
            "(a callable returning a Metric with update(preds, labels, weights))"
        )
    # validate_args: the window's own update checks its inputs once; its compute need not check them again
    return name, lambda: rec_metrics(name, validate_args=validate_args)[name]


class SlidingWindow(Metric):
    """A binary click metric over the newest ``window`` samples of each rank (module docstring).

    Args:
        metric: a name of :data:`~lightrec.metrics.DEFAULT_METRICS` or a zero-argument factory of a
            metric with ``update(preds, labels, weights)``.
        window: samples kept per rank (``>= 1``).
        validate_args: check values on every update (one device sync on accelerators).
        **kwargs: forwarded to :class:`torchmetrics.Metric` (``process_group``, ``compute_on_cpu`` ...).

    Raises:
        ValueError: ``window`` is not a positive int.
        UnknownMetricError: ``metric`` is an unknown name.
    """

    is_differentiable = False
    # True: calling the metric updates the window in place (a batch-only copy merged by ``cat`` would grow it)
    full_state_update = True
    window_preds: Tensor
    window_labels: Tensor
    window_weights: Tensor
    window_seen: Tensor

    def __init__(self, metric: str | Callable[[], Metric] = "auc", window: int = 100_000, validate_args: bool = True,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(**kwargs)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"SlidingWindow: window must be an int >= 1 (samples per rank), got {window!r}")
        self.metric_name, self._make = _factory(metric, validate_args=False)
        self.window = window
        self.validate_args = validate_args
        for name in ("window_preds", "window_labels", "window_weights"):
            self.add_state(name, default=torch.zeros(window), dist_reduce_fx="cat")
        self.add_state("window_seen", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, labels: Tensor, weights: Tensor | None = None) -> None:
        """Adds a batch: ``[B]`` (or ``[B, 1]``) probabilities, labels in ``[0, 1]`` and optional weights."""
        preds, labels, weights = check_binary_inputs(
            f"SlidingWindow({self.metric_name})", preds, labels, weights, preds_are_probabilities=True,
            validate_args=self.validate_args,
        )  # fmt: skip
        n = preds.numel()
        keep = min(n, self.window)  # a batch larger than the window: its newest samples
        slots = (self.window_seen + n - keep + torch.arange(keep, device=self.window_seen.device)) % self.window
        dtype = self.window_preds.dtype
        self.window_preds[slots] = preds[n - keep :].to(dtype)
        self.window_labels[slots] = labels[n - keep :].to(dtype)
        self.window_weights[slots] = weights[n - keep :].to(dtype)
        self.window_seen += n

    def compute(self) -> Tensor:
        """The metric over every rank's window, a float32 scalar (NaN with a warning when nothing was seen)."""
        if int(self.window_seen) == 0:
            rank_zero_warn(f"SlidingWindow({self.metric_name}) is undefined because no samples were seen; "
                           "returning NaN.", UserWarning)  # fmt: skip
            return nan_result(self.device)
        inner = self._make().to(self.device)
        # the buffers are every rank's already: the inner metric must not sync again (a second sum over the
        # ranks, on the default group whatever this metric's process_group)
        inner.sync_on_compute = False
        inner._to_sync = False
        # synced across R ranks the buffers are [R, W] (torchmetrics stacks what it gathers): flatten
        inner.update(self.window_preds.reshape(-1), self.window_labels.reshape(-1), self.window_weights.reshape(-1))
        return inner.compute().to(torch.float32)
