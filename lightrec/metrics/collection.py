"""``rec_metrics``: one ``MetricCollection`` with the usual click-prediction metrics.

::

    metrics = rec_metrics(prefix="val/")           # auc, ne, calibration, ctr, accuracy
    metrics.update(torch.sigmoid(logits), labels)  # preds [B] probabilities, labels [B] 0/1 floats
    metrics.compute()  # {"val/auc": ..., "val/ne": ..., "val/calibration": ..., ...}, synced over ranks

Inside a LightningModule keep the collection as an attribute (so Lightning moves it to the device)
and log it with ``self.log_dict(self.val_metrics)`` at epoch end, or call ``compute`` yourself.
``RecallAtK`` takes different inputs (scores [B, C], target [B]) and is built separately.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchmetrics import Metric, MetricCollection

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
