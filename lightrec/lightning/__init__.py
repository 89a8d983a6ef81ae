"""Lightning integration: ``RecStrategy``, ``RecModule`` and callbacks.

``rec_strategy.py`` and ``rec_module.py`` (with ``nonfinite.py``, ``loop_state.py``,
``table_tiering.py``, ``fused_tables_checks.py``, ``fused_optimizer_states.py``, ``dlrm_schedule.py`` and
``class_reference.py``) at the top, the callbacks one per file in ``callbacks/``, the recipes' library
in ``recipe/``.

Importing this package registers ``RecStrategy`` in Lightning's strategy registry as
``"lightrec"``, so ``Trainer(strategy="lightrec")`` works.
"""

from lightning.pytorch.strategies import StrategyRegistry

from lightrec._compat import silence_known_warnings
from lightrec.lightning.callbacks import (
    DeltaPublisher,
    ManagedCollisionMonitor,
    PlanReport,
    ProgressiveValidation,
    QuantizedExport,
    RecThroughputMonitor,
    SparseDistPrefetch,
    TieredTableMonitor,
)
from lightrec.lightning.callbacks.rec_throughput_monitor import ThroughputMonitor
from lightrec.lightning.dlrm_schedule import dlrm_lr_lambda
from lightrec.lightning.nonfinite import NonFiniteLossError
from lightrec.lightning.rec_module import RecModule, ShardedCheckpointFolderError
from lightrec.lightning.rec_strategy import RecStrategy
from lightrec.lightning.table_tiering import TableTiering

silence_known_warnings()  # two Lightning-internal deprecations every rank would print
if RecStrategy.strategy_name not in StrategyRegistry:
    RecStrategy.register_strategies(StrategyRegistry)

__all__ = [
    "DeltaPublisher",
    "ManagedCollisionMonitor",
    "NonFiniteLossError",
    "PlanReport",
    "ProgressiveValidation",
    "QuantizedExport",
    "RecModule",
    "RecStrategy",
    "RecThroughputMonitor",
    "ShardedCheckpointFolderError",
    "SparseDistPrefetch",
    "TableTiering",
    "ThroughputMonitor",  # the old name of RecThroughputMonitor (it shadowed Lightning's own)
    "TieredTableMonitor",
    "dlrm_lr_lambda",
]
