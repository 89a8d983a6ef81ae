"""lightrec's Lightning callbacks, one per file (as ``lightning.pytorch.callbacks`` does).

=================================  ==========================================================
module                             callback
=================================  ==========================================================
``sparse_dist_prefetch.py``        ``SparseDistPrefetch``: the next batch's input dist started
                                   while the current batch computes
``next_batch.py``                  the one adapter over Lightning's data fetcher that
                                   ``SparseDistPrefetch`` reads the next batch through
``plan_report.py``                 ``PlanReport``: the sharding plan's table and chart
                                   (console, TensorBoard); ``load_plan_from_events``
``rec_model_summary.py``           ``RecModelSummary``: the model summary with whole,
                                   fused-trained tables (``RecModule`` adds it)
``rec_throughput_monitor.py``      ``RecThroughputMonitor``: samples/s, step time, memory
``managed_collision_monitor.py``   ``ManagedCollisionMonitor``: occupancy, evictions,
                                   default-row share of managed-collision tables
``progressive_validation.py``      ``ProgressiveValidation``: online training's AUC / NE of
                                   every batch scored before it trains, over a sliding window
``tiered_table_monitor.py``        ``TieredTableMonitor``: cache hit rate, rows and bytes
                                   moved by tiered tables (``RecModule`` adds it)
``quantized_export.py``            ``QuantizedExport``: the trained model as a quantized
                                   serving artifact (the one bridge to ``lightrec.inference``)
``delta_publisher.py``             ``DeltaPublisher``: the rows training changed, published
                                   every few steps/seconds (``docs/deltas.md``)
``step_window.py``                 ``WindowedMonitor``: the base of the three monitors, one
                                   window of optimizer steps per logged row (one rule for all)
=================================  ==========================================================

:mod:`lightrec.lightning` exports the callbacks too (``lightrec.lightning.PlanReport`` is the name
the recipes' configs use).
"""

from lightrec.lightning.callbacks.delta_publisher import DeltaPublisher
from lightrec.lightning.callbacks.managed_collision_monitor import ManagedCollisionMonitor
from lightrec.lightning.callbacks.plan_report import PlanReport, load_plan_from_events
from lightrec.lightning.callbacks.progressive_validation import ProgressiveValidation
from lightrec.lightning.callbacks.quantized_export import QuantizedExport
from lightrec.lightning.callbacks.rec_model_summary import RecModelSummary
from lightrec.lightning.callbacks.rec_throughput_monitor import RecThroughputMonitor
from lightrec.lightning.callbacks.sparse_dist_prefetch import SparseDistPrefetch
from lightrec.lightning.callbacks.tiered_table_monitor import TieredTableMonitor

__all__ = [
    "DeltaPublisher",
    "ManagedCollisionMonitor",
    "PlanReport",
    "ProgressiveValidation",
    "QuantizedExport",
    "RecModelSummary",
    "RecThroughputMonitor",
    "SparseDistPrefetch",
    "TieredTableMonitor",
    "load_plan_from_events",
]
