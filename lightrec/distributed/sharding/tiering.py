"""From a plan's tiered compute kernel to the kernels' ``TieringConfig``: torchrec's names on one side,
lightrec's kernels on the other.

A table whose ``ParameterSharding.compute_kernel`` is ``fused_uvm_caching`` (every row in host
memory) or ``key_value`` (every row on SSD) keeps a cache of hot rows on the rank's device. Each
setting is read from the plan first, then from the sharder's ``fused_params`` (torchrec's keys),
then from the default::

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
from lightrec.kernels.tiered_config import DEFAULT_CACHE_LOAD_FACTOR, DEFAULT_MIN_CACHE_ROWS, TieringConfig
from lightrec.modules.embedding_configs import BaseEmbeddingConfig

__all__ = ["TIERING_FUSED_PARAMS", "tiering_for", "tiering_params"]

#: The sharder ``fused_params`` keys that configure tiered tables (not the optimizer).
TIERING_FUSED_PARAMS = (
    "cache_load_factor",
    "cache_algorithm",
    "ssd_storage_directory",
    "prefetch_pipeline",
    "cache_min_rows",
)


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
        ValueError: a cache precision other than the table's own data type.
    """
    kernel = sharding.compute_kernel
    if kernel not in (EmbeddingComputeKernel.FUSED_UVM_CACHING.value, EmbeddingComputeKernel.KEY_VALUE.value):
        return None
    cache, kv = sharding.cache_params, sharding.key_value_params
    precision = None if cache is None else cache.precision
    if precision is not None and str(getattr(precision, "name", precision)) != config.data_type.name:
        raise ValueError(
            f"table {config.name!r}: CacheParams(precision={precision!r}) -- lightrec caches rows in the table's "
            f"own data type ({config.data_type.name}); drop precision or set the table's data_type"
        )

    def pick(plan_value: Any, key: str, default: Any) -> Any:
        return plan_value if plan_value is not None else defaults.get(key, default)

    return TieringConfig(
        backing="host" if kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING.value else "ssd",
        cache_load_factor=pick(None if cache is None else cache.load_factor, "cache_load_factor", DEFAULT_CACHE_LOAD_FACTOR),
        min_cache_rows=int(defaults.get("cache_min_rows", DEFAULT_MIN_CACHE_ROWS)),
        algorithm=pick(None if cache is None else cache.algorithm, "cache_algorithm", "lru"),
        ssd_storage_directory=_directory(
            pick(None if kv is None else kv.ssd_storage_directory, "ssd_storage_directory", None), env
        ),
        prefetch=bool(pick(None if cache is None else cache.prefetch_pipeline, "prefetch_pipeline", True)),
    )
