"""Recommendation metrics as torchmetrics ``Metric``s that sync across ranks (see docs/metrics.md).

Binary click metrics share ``update(preds [B], labels [B], weights [B] | None)``:
:class:`AUC` (exact by default), :class:`NE`, :class:`Calibration`, :class:`CTR`, :class:`Accuracy`;
:func:`rec_metrics` bundles them in one ``MetricCollection``. Retrieval: :class:`RecallAtK`
(``update(scores [B, C], target [B])``). Regression: :class:`MSE`, :class:`MAE`. Online training:
:class:`SlidingWindow` (any of the binary metrics over the newest samples only).

torchrec's entry points live at torchrec's paths: ``metric_module`` (``RecMetricModule``,
``generate_metric_module``), ``metrics_config`` (``RecMetricEnum``, ``RecTaskInfo``, ``MetricsConfig``
...), ``rec_metric`` and ``throughput`` (``ThroughputMetric``), computed by the metrics above.
"""

from lightrec.metrics._validation import MetricInputError
from lightrec.metrics.auc import AUC, auc_from_grouped_masses, binary_auc
from lightrec.metrics.collection import DEFAULT_METRICS, SlidingWindow, UnknownMetricError, rec_metrics
from lightrec.metrics.ne import NE, LogLoss
from lightrec.metrics.rates import CTR, Accuracy, Calibration
from lightrec.metrics.regression import MAE, MSE
from lightrec.metrics.retrieval import RecallAtK, recall_at_k_hits

__all__ = [
    "AUC",
    "CTR",
    "MAE",
    "MSE",
    "DEFAULT_METRICS",
    "NE",
    "Accuracy",
    "Calibration",
    "LogLoss",
    "MetricInputError",
    "RecallAtK",
    "SlidingWindow",
    "UnknownMetricError",
    "auc_from_grouped_masses",
    "binary_auc",
    "rec_metrics",
    "recall_at_k_hits",
]
