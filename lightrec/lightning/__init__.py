"""Lightning integration: ``RecStrategy``, ``RecModule`` and callbacks.

Importing this package registers ``RecStrategy`` in Lightning's strategy registry as
``"lightrec"``, so ``Trainer(strategy="lightrec")`` works.
"""

from lightning.pytorch.strategies import StrategyRegistry

from lightrec._compat import silence_known_warnings
from lightrec.lightning.managed_collision_monitor import ManagedCollisionMonitor
from lightrec.lightning.nonfinite import NonFiniteLossError
from lightrec.lightning.plan_report import PlanReport
from lightrec.lightning.quantized_export import QuantizedExport
from lightrec.lightning.rec_module import RecModule, dlrm_lr_lambda
from lightrec.lightning.rec_strategy import RecStrategy
from lightrec.lightning.rec_throughput_monitor import RecThroughputMonitor, ThroughputMonitor
from lightrec.lightning.sparse_dist_prefetch import SparseDistPrefetch
from lightrec.lightning.table_tiering import TableTiering
from lightrec.lightning.tiered_table_monitor import TieredTableMonitor

silence_known_warnings()  # two Lightning-internal deprecations every rank would print
if RecStrategy.strategy_name not in StrategyRegistry:
    RecStrategy.register_strategies(StrategyRegistry)

__all__ = [
    "ManagedCollisionMonitor",
    "NonFiniteLossError",
    "PlanReport",
    "QuantizedExport",
    "RecModule",
    "RecStrategy",
    "RecThroughputMonitor",
    "SparseDistPrefetch",
    "TableTiering",
    "ThroughputMonitor",  # the old name of RecThroughputMonitor (it shadowed Lightning's own)
    "TieredTableMonitor",
    "dlrm_lr_lambda",
]
