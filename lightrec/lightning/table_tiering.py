"""Where a ``RecModule``'s tables live: in memory, or tiered over host memory or SSD.

``RecModule(tables_on="ssd", cache_load_factor=0.05)`` (the recipes' ``--model.tables_on ssd
--model.cache_load_factor 0.05``) keeps every row of every table it builds, with its optimizer
state, in row files under ``ssd_storage_directory`` and a cache of hot rows in memory
(docs/tiered-tables.md)::

    tables_on   sharded (RecStrategy)                            one process
    ---------   -----------------------------------------------  ---------------------------------
    "memory"    the planner's choice (tiered only when the        FusedEmbeddingBagCollection
                tables do not fit in memory)
    "ssd"       every table key_value (the planner shards them    the same, tiering=TieringConfig(
                and sizes the cache, unless cache_load_factor     "ssd", ...)
                fixes it)
    "host"      every table fused_uvm_caching (GPU: rows in       tiering=TieringConfig("host", ...)
                host memory, a cache in HBM)

:class:`TableTiering` is that choice as one object: the sharders' ``fused_params`` keys, the
planner's constraints and the unsharded collection's ``TieringConfig``. The translation of
``"ssd"`` / ``"host"`` and its defaults live in :mod:`lightrec.distributed.sharding.tiering`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lightrec.distributed.planner import ParameterConstraints
from lightrec.distributed.sharding.tiering import (
    TABLE_TIERS,
    check_table_tier,
    compute_kernel_of,
    tiering_config,
    tiering_fused_params,
)
from lightrec.kernels.tiered.config import TieringConfig, coerce_algorithm

__all__ = ["TABLE_TIERS", "TableTiering"]


@dataclass(frozen=True)
class TableTiering:
    """Where the tables a ``RecModule`` builds keep their rows (see the module docstring).

    Args:
        tables_on: ``"memory"``, ``"ssd"`` (``key_value``) or ``"host"`` (``fused_uvm_caching``).
        cache_load_factor: share of each table's rows cached in memory; None lets the planner choose
            (sharded), or 0.2 (one process).
        cache_algorithm: ``"lru"`` or ``"lfu"``.
        ssd_storage_directory: where the row files go (a local SSD); default: the temp directory.

    Raises:
        ValueError: an unknown ``tables_on`` or algorithm, or a load factor outside (0, 1].
    """

    tables_on: str = "memory"
    cache_load_factor: float | None = None
    cache_algorithm: str = "lru"
    ssd_storage_directory: str | None = None

    def __post_init__(self) -> None:
        check_table_tier(self.tables_on)
        object.__setattr__(self, "cache_algorithm", coerce_algorithm(self.cache_algorithm))
        if self.cache_load_factor is not None:  # (in memory too: the value would be silently ignored)
            TieringConfig(cache_load_factor=self.cache_load_factor)  # validates the load factor
        self.tiering()

    @property
    def tiered(self) -> bool:
        return self.tables_on != "memory"

    @property
    def compute_kernel(self) -> str | None:
        """The plan's compute kernel of every table (None: the planner's choice)."""
        return compute_kernel_of(self.tables_on)

    def fused_params(self) -> dict[str, str | float]:
        """The sharders' ``fused_params`` keys of the tiered tables (empty in memory)."""
        return tiering_fused_params(
            self.tables_on, self.cache_load_factor, self.cache_algorithm, self.ssd_storage_directory
        )

    def constraints(self, tables: Iterable[str]) -> dict[str, ParameterConstraints]:
        """``{table: ParameterConstraints(compute_kernels=[the tiered kernel])}`` (empty in memory)."""
        kernel = self.compute_kernel
        return {} if kernel is None else {t: ParameterConstraints(compute_kernels=[kernel]) for t in tables}

    def tiering(self) -> TieringConfig | None:
        """The ``TieringConfig`` of an unsharded collection (None in memory)."""
        return tiering_config(
            self.tables_on, self.cache_load_factor, self.cache_algorithm, self.ssd_storage_directory
        )
