"""torchrec's ``torchrec.metrics.metrics_config``: which metrics a :class:`RecMetricModule` computes.

::

    config = MetricsConfig(
        rec_tasks=[RecTaskInfo(name="click", label_name="label", prediction_name="prediction")],
        rec_metrics={RecMetricEnum.NE: RecMetricDef(rec_task_indices=[0], window_size=100_000),
                     RecMetricEnum.AUC: RecMetricDef(rec_task_indices=[0])},
        throughput_metric=ThroughputDef(window_size=100, warmup_steps=10),
    )
    module = generate_metric_module(RecMetricModule, config, batch_size=512, world_size=2, my_rank=rank,
                                    state_metrics_mapping={}, device=torch.device("cpu"))

``RecMetricEnum`` lists torchrec's names; lightrec computes NE, LOG_LOSS, CTR, AUC, CALIBRATION,
MSE, MAE and ACCURACY (``SUPPORTED_METRICS``) with its torchmetrics metrics, and
``generate_metric_module`` refuses the others by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from lightrec.metrics.metrics_namespace import StrValue

__all__ = [
    "DefaultMetricsConfig",
    "DefaultTaskInfo",
    "EmptyMetricsConfig",
    "MetricsConfig",
    "RecComputeMode",
    "RecMetricDef",
    "RecMetricEnum",
    "RecTaskInfo",
    "StateMetricEnum",
    "SUPPORTED_METRICS",
    "ThroughputDef",
]


class RecMetricEnum(StrValue):
    """torchrec's metric names (values are the key namespaces)."""

    NE = "ne"
    LOG_LOSS = "log_loss"
    CTR = "ctr"
    AUC = "auc"
    AUPRC = "auprc"
    RAUC = "rauc"
    CALIBRATION = "calibration"
    MSE = "mse"
    MAE = "mae"
    MULTICLASS_RECALL = "multiclass_recall"
    RECALL_SESSION_LEVEL = "recall_session_level"
    WEIGHTED_AVG = "weighted_avg"
    TOWER_QPS = "tower_qps"
    ACCURACY = "accuracy"
    NDCG = "ndcg"
    XAUC = "xauc"
    SCALAR = "scalar"


SUPPORTED_METRICS: frozenset[RecMetricEnum] = frozenset(
    {
        RecMetricEnum.NE,
        RecMetricEnum.LOG_LOSS,
        RecMetricEnum.CTR,
        RecMetricEnum.AUC,
        RecMetricEnum.CALIBRATION,
        RecMetricEnum.MSE,
        RecMetricEnum.MAE,
        RecMetricEnum.ACCURACY,
    }
)
"""The :class:`RecMetricEnum` members lightrec computes."""


@dataclass(unsafe_hash=True, eq=True)
class RecTaskInfo:
    """One prediction task: where its labels, predictions and weights are in the model output dict.

    Args:
        name: task name (the middle part of the metric keys).
        label_name, prediction_name, weight_name: keys of ``model_out`` (a missing weight means 1).
        is_negative_task: accepted for torchrec's signature; lightrec does not flip labels.
        weighted: read ``weight_name`` (False: every sample weighs 1).
    """

    name: str = "DefaultTask"
    label_name: str = "label"
    prediction_name: str = "prediction"
    weight_name: str = "weight"
    is_negative_task: bool = False
    weighted: bool = True


class RecComputeMode(Enum):
    """Accepted for torchrec's signature; lightrec computes every task separately."""

    FUSED_TASKS_COMPUTATION = 1
    UNFUSED_TASKS_COMPUTATION = 2


_DEFAULT_WINDOW_SIZE = 10_000_000
_DEFAULT_THROUGHPUT_WINDOW_SECONDS = 100
_DEFAULT_THROUGHPUT_WARMUP_STEPS = 100


@dataclass
class RecMetricDef:
    """One metric's tasks and window.

    Args:
        rec_tasks: the tasks (or name them by index into ``MetricsConfig.rec_tasks``: exactly one of
            the two must be given).
        rec_task_indices: see ``rec_tasks``.
        window_size: samples of the window, over all ranks (each rank keeps ``window_size //
            world_size`` of its own, at least one batch).
        arguments: keyword arguments of the lightrec metric (e.g. ``{"num_bins": 1000}`` for AUC).
    """

    rec_tasks: list[RecTaskInfo] = field(default_factory=list)
    rec_task_indices: list[int] = field(default_factory=list)
    window_size: int = _DEFAULT_WINDOW_SIZE
    arguments: dict[str, object] | None = None


class StateMetricEnum(StrValue):
    """Components whose ``get_metrics()`` a metric module reports."""

    OPTIMIZERS = "optimizers"
    MODEL_CONFIGURATOR = "model_configurator"


@dataclass
class ThroughputDef:
    """Throughput window (seconds) and warm-up steps (not timed)."""

    window_size: int = _DEFAULT_THROUGHPUT_WINDOW_SECONDS
    warmup_steps: int = _DEFAULT_THROUGHPUT_WARMUP_STEPS


@dataclass
class MetricsConfig:
    """Everything :func:`generate_metric_module` builds (torchrec's fields; see the module docstring).

    ``rec_compute_mode``, ``fused_update_limit`` and ``compute_on_all_ranks`` are accepted and have no
    effect: lightrec computes each task on its own and returns the values on every rank.
    """

    rec_tasks: list[RecTaskInfo] = field(default_factory=list)
    rec_metrics: dict[RecMetricEnum, RecMetricDef] = field(default_factory=dict)
    throughput_metric: ThroughputDef | None = None
    rec_compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION
    fused_update_limit: int = 0
    state_metrics: list[StateMetricEnum] = field(default_factory=list)
    compute_interval_steps: int = 100
    min_compute_interval: float = 0.0
    max_compute_interval: float = float("inf")
    compute_on_all_ranks: bool = False
    should_validate_update: bool = False


DefaultTaskInfo = RecTaskInfo(name="DefaultTask", label_name="label", prediction_name="prediction", weight_name="weight")

DefaultMetricsConfig = MetricsConfig(
    rec_tasks=[DefaultTaskInfo],
    rec_metrics={RecMetricEnum.NE: RecMetricDef(rec_tasks=[DefaultTaskInfo], window_size=_DEFAULT_WINDOW_SIZE)},
    throughput_metric=ThroughputDef(),
    state_metrics=[],
)

EmptyMetricsConfig = MetricsConfig(rec_tasks=[], rec_metrics={}, throughput_metric=None, state_metrics=[])
