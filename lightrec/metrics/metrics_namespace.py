"""torchrec's metric keys: ``f"{namespace}-{task}|{prefix}{metric}"``.

::

    ne-DefaultTask|lifetime_ne        NE over every sample since the start (or the last reset)
    ne-DefaultTask|window_ne          NE over the last window_size samples (all ranks together)
    throughput-throughput|total_examples

These are the keys :class:`lightrec.metrics.metric_module.RecMetricModule` returns, so dashboards
and log parsers written for torchrec's keep working.
"""

from __future__ import annotations

from lightrec._enum import ValueEnum

__all__ = [
    "MetricName",
    "MetricNamespace",
    "MetricPrefix",
    "StrValue",
    "compose_customized_metric_key",
    "compose_metric_key",
    "compose_metric_namespace",
]


class StrValue(str, ValueEnum):
    """A string enum whose ``str()`` is its value (torchrec's ``StrValueMixin``)."""


class MetricName(StrValue):
    """Metric names (the last part of a key)."""

    DEFAULT = ""
    NE = "ne"
    LOG_LOSS = "logloss"
    THROUGHPUT = "throughput"
    TOTAL_EXAMPLES = "total_examples"
    CTR = "ctr"
    CALIBRATION = "calibration"
    MSE = "mse"
    RMSE = "rmse"
    MAE = "mae"
    AUC = "auc"
    ACCURACY = "accuracy"
    GAUC = "gauc"
    GAUC_NUM_SAMPLES = "gauc_num_samples"
    R_SQUARED = "r_squared"


class MetricNamespace(StrValue):
    """Metric namespaces (the first part of a key)."""

    DEFAULT = ""
    NE = "ne"
    THROUGHPUT = "throughput"
    CTR = "ctr"
    CALIBRATION = "calibration"
    MSE = "mse"
    MAE = "mae"
    AUC = "auc"
    ACCURACY = "accuracy"
    GAUC = "gauc"
    OPTIMIZERS = "optimizers"
    MODEL_CONFIGURATOR = "model_configurator"


class MetricPrefix(StrValue):
    """``lifetime_`` (since the start) or ``window_`` (the last ``window_size`` samples)."""

    DEFAULT = ""
    LIFETIME = "lifetime_"
    WINDOW = "window_"


def compose_metric_namespace(namespace: MetricNamespace | str, task_name: str) -> str:
    """``"ne-DefaultTask"``."""
    return f"{namespace}-{task_name}"


def compose_customized_metric_key(namespace: str, metric_name: str, description: str | None = None) -> str:
    """``f"{namespace}|{metric_name}{description}"`` (any strings: state metrics use it)."""
    return f"{namespace}|{metric_name}{description or ''}"


def compose_metric_key(
    namespace: MetricNamespace | str,
    task_name: str,
    metric_name: MetricName | str,
    metric_prefix: MetricPrefix | str = MetricPrefix.DEFAULT,
    description: str | None = None,
) -> str:
    """``"ne-DefaultTask|window_ne"``: the key of one metric value."""
    return compose_customized_metric_key(
        compose_metric_namespace(namespace, task_name), f"{metric_prefix}{metric_name}", description
    )
