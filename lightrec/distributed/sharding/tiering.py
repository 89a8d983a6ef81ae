"""Tiered tables, one translation: the user's ``"ssd"`` / ``"host"``, the plan's compute kernels
(torchrec's names) and the kernels' ``TieringConfig``.

Where a ``RecModule``'s tables live (``tables_on``, ``lightrec.lightning.TableTiering``) and what a plan
says of a table name the same two tiers::

    tables_on   plan compute kernel    TieringConfig(backing=...)   every row in
    ---------   -------------------    --------------------------   --------------------------------
    "memory"    the planner's choice   --                           memory (not tiered)
    "host"      fused_uvm_caching      "host"                       host memory (GPU: a cache in HBM)
    "ssd"       key_value              "ssd"                        a row file per table, on SSD

A tiered table keeps a cache of hot rows on the rank's device. Each setting is read from the plan
first, then from the sharder's ``fused_params`` (torchrec's keys), then from the default -- which is
``TieringConfig``'s own (``lightrec.kernels.tiered.config``), applied here and nowhere else::

    setting           ParameterSharding                        sharder fused_params      default
    ---------------   ---------------------------------------  ------------------------  --------------
    cache size        cache_params.load_factor                 "cache_load_factor"        0.2
    eviction          cache_params.algorithm                   "cache_algorithm"          LRU
    prefetch          cache_params.prefetch_pipeline           "prefetch_pipeline"        True
    SSD directory     key_value_params.ssd_storage_directory   "ssd_storage_directory"    the temp dir
    smallest cache    --                                       "cache_min_rows"           4096 rows

``@local_rank`` / ``@rank`` in the directory become the rank's local / global rank (torchrec's
convention), so ranks of one host can put their row files on different disks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.planner.plan import EmbeddingComputeKernel, ParameterSharding
from lightrec.kernels.tiered.config import TieringConfig
from lightrec.modules.embedding_configs import BaseEmbeddingConfig

__all__ = [
    "TABLE_TIERS",
    "TIERING_FUSED_PARAMS",
    "check_table_tier",
    "compute_kernel_of",
    "tiering_config",
    "tiering_for",
    "tiering_fused_params",
    "tiering_params",
]

#: Where a model's tables may live (``tables_on``): in memory, or tiered over host memory or SSD.
TABLE_TIERS = ("memory", "host", "ssd")
# The plan's compute kernel of each tiered ``tables_on`` (= the TieringConfig backing), and back.
_KERNEL_OF_TIER = {"host": EmbeddingComputeKernel.FUSED_UVM_CACHING.value, "ssd": EmbeddingComputeKernel.KEY_VALUE.value}
_TIER_OF_KERNEL = {kernel: tier for tier, kernel in _KERNEL_OF_TIER.items()}

#: The sharder ``fused_params`` keys that configure tiered tables (not the optimizer).
TIERING_FUSED_PARAMS = (
    "cache_load_factor",
    "cache_algorithm",
    "ssd_storage_directory",
    "prefetch_pipeline",
    "cache_min_rows",
)


def check_table_tier(tables_on: str) -> None:
    """Raises ``ValueError`` naming the choices when ``tables_on`` is not one of :data:`TABLE_TIERS`."""
    if tables_on not in TABLE_TIERS:
        raise ValueError(
            f"tables_on must be one of {list(TABLE_TIERS)} ('ssd': every row on SSD with a cache in memory), "
            f"got {tables_on!r}"
        )


def compute_kernel_of(tables_on: str) -> str | None:
    """The plan's compute kernel of every table of a ``tables_on`` tier (None in memory: the planner's choice)."""
    check_table_tier(tables_on)
    return _KERNEL_OF_TIER.get(tables_on)


def tiering_config(
    tables_on: str,
    cache_load_factor: float | None = None,
    cache_algorithm: Any = None,
    ssd_storage_directory: str | None = None,
    prefetch: bool | None = None,
    min_cache_rows: int | None = None,
) -> TieringConfig | None:
    """The ``TieringConfig`` of a ``tables_on`` tier (None in memory); a None setting takes
    ``TieringConfig``'s default.

    Raises:
        ValueError: an unknown tier, algorithm, or a value ``TieringConfig`` refuses.
    """
    check_table_tier(tables_on)
    if tables_on == "memory":
        return None
    given = {
        "cache_load_factor": cache_load_factor,
        "algorithm": cache_algorithm,
        "ssd_storage_directory": ssd_storage_directory,
        "prefetch": prefetch,
        "min_cache_rows": min_cache_rows,
    }
    return TieringConfig(backing=tables_on, **{k: v for k, v in given.items() if v is not None})


def tiering_fused_params(
    tables_on: str, cache_load_factor: float | None, cache_algorithm: str, ssd_storage_directory: str | None
) -> dict[str, str | float]:
    """The sharders' ``fused_params`` keys of a ``tables_on`` tier (empty in memory; None settings left
    out, so the planner or the default decides)."""
    check_table_tier(tables_on)
    if tables_on == "memory":
        return {}
    params: dict[str, str | float] = {"cache_algorithm": cache_algorithm}
    if cache_load_factor is not None:
        params["cache_load_factor"] = cache_load_factor
    if ssd_storage_directory is not None:
        params["ssd_storage_directory"] = ssd_storage_directory
    return params


def tiering_params(fused_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The tiering keys of a sharder's ``fused_params`` (see :data:`TIERING_FUSED_PARAMS`)."""
    return {k: v for k, v in (fused_params or {}).items() if k in TIERING_FUSED_PARAMS and v is not None}


def _directory(template: str | None, env: ShardingEnv) -> str | None:
    if template is None:
        return None
    local = int(os.environ.get("LOCAL_RANK", env.rank))
    return template.replace("@local_rank", str(local)).replace("@rank", str(env.rank))


def tiering_for(
    sharding: ParameterSharding, config: BaseEmbeddingConfig, defaults: Mapping[str, Any], env: ShardingEnv
) -> TieringConfig | None:
    """The ``TieringConfig`` of a table's shards on this rank, or None for an in-memory kernel.

    Args:
        sharding: the table's entry of the plan.
        config: the table (for messages and its data type).
        defaults: :func:`tiering_params` of the sharder's ``fused_params``.
        env: this rank.

    Raises:
        ValueError: a cache precision other than the table's own data type; a ``cache_min_rows``
            that is not a positive int.
    """
    tier = _TIER_OF_KERNEL.get(sharding.compute_kernel)
    if tier is None:
        return None
    cache, kv = sharding.cache_params, sharding.key_value_params
    precision = None if cache is None else cache.precision
    # DataType.FP32 or its name in any case ("fp32"), as torchrec's CacheParams takes either
    if precision is not None and str(getattr(precision, "name", precision)).upper() != config.data_type.name:
        raise ValueError(
            f"table {config.name!r}: CacheParams(precision={precision!r}) -- lightrec caches rows in the table's "
            f"own data type ({config.data_type.name}); drop precision or set the table's data_type"
        )

    def pick(plan_value: Any, key: str) -> Any:
        return plan_value if plan_value is not None else defaults.get(key)

    prefetch = pick(None if cache is None else cache.prefetch_pipeline, "prefetch_pipeline")
    directory = pick(None if kv is None else kv.ssd_storage_directory, "ssd_storage_directory")
    min_rows = defaults.get("cache_min_rows")
    if min_rows is not None and (isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows <= 0):
        raise ValueError(
            f"fused_params['cache_min_rows'] must be a positive int (the smallest cache of a tiered table, rows), "
            f"got {min_rows!r}"
        )
    return tiering_config(
        tier,
        cache_load_factor=pick(None if cache is None else cache.load_factor, "cache_load_factor"),
        cache_algorithm=pick(None if cache is None else cache.algorithm, "cache_algorithm"),
        ssd_storage_directory=_directory(directory, env),
        prefetch=None if prefetch is None else bool(prefetch),
        min_cache_rows=min_rows,
    )
