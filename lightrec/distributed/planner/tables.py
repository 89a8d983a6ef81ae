"""Read the tables of a model into the planner's arrays.

A model is walked with ``named_modules()``; every module whose type a sharder handles is a
*shardable module* (its children are not visited further) and contributes the tables its sharder
reports via ``shardable_parameters``. Constraints are keyed by table name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from lightrec.distributed.planner.constants import (
    CLF_CHOICES,
    DEFAULT_MIN_PARTITION,
    GUARDED_COMPUTE_KERNELS,
    OPTIMIZER_STATE,
    optimizer_name,
)
from lightrec.distributed.planner.plan import (
    UNIMPLEMENTED_SHARDING_TYPES,
    CacheStatistics,
    EmbeddingComputeKernel,
    ModuleSharder,
    enum_value,
)
from lightrec.distributed.planner.plan.sharder import PooledTables, table_configs
from lightrec.distributed.planner.shard_estimators import (
    DENSE,
    FUSED,
    KERNELS,
    SHARDING_TYPES,
    TIERED,
    TableArrays,
)
from lightrec.distributed.planner.types import ParameterConstraints, Topology
from lightrec.kernels.tiered.config import DEFAULT_MIN_CACHE_ROWS
from lightrec.modules.embedding_configs import DATA_TYPE_NUM_BITS, BaseEmbeddingConfig, DataType, PoolingType
from lightrec.quant.collection_base import QuantCollectionBase

__all__ = ["ShardableModule", "collect_tables", "find_shardable_modules", "lookups_per_step"]

_ELEM_BYTES = {data_type: bits / 8 for data_type, bits in DATA_TYPE_NUM_BITS.items()}
_QUANT_ROW_BYTES = 4.0  # fp16 scale + fp16 bias stored with every quantized row


def _kernel_codes(offered: list[str], wanted: list[str] | None, table: str) -> list[int]:
    """Codes of the offered kernels the planner may choose for ``table``: those the constraint
    allows, without the guarded ones (``GUARDED_COMPUTE_KERNELS``) it does not name.

    Raises:
        ValueError: the constraint names a kernel lightrec's cost model does not know (an
            extension's ``customized_kernel``): such a table's plan is written by hand.
    """
    guarded = {enum_value(k, EmbeddingComputeKernel, "GUARDED_COMPUTE_KERNELS") for k in GUARDED_COMPUTE_KERNELS}
    codes = []
    for kernel in offered:
        named = wanted is not None and kernel in wanted
        if (wanted is not None and not named) or (kernel in guarded and not named):
            continue
        if kernel not in KERNELS:
            if named:
                raise ValueError(
                    f"table {table!r}: ParameterConstraints.compute_kernels names {kernel!r}, which lightrec's "
                    f"planner cannot cost (it plans {KERNELS}); write this table's ParameterSharding by hand "
                    "(construct_module_sharding_plan) and give it to DistributedModelParallel(plan=...)"
                )
            continue
        codes.append(KERNELS.index(kernel))
    return codes


def _without_tiered(opts: list[tuple[int, list[int]]]) -> list[tuple[int, list[int]]]:
    """The in-memory kernels of ``opts``; ``opts`` itself when it has none (a table that must be tiered)."""
    kept = [(code, [k for k in kernels if k not in TIERED]) for code, kernels in opts]
    kept = [(code, kernels) for code, kernels in kept if kernels]
    return kept or opts


@dataclass
class ShardableModule:
    path: str
    module: nn.Module
    sharder: ModuleSharder
    configs: dict[str, BaseEmbeddingConfig]


def _sharder_for(module: nn.Module, sharders: list[ModuleSharder]) -> ModuleSharder | None:
    for sharder in sharders:  # exact type first: a subclass may have a sharder of its own
        if type(module) is sharder.module_type:
            return sharder
    for sharder in sharders:
        if isinstance(module, sharder.module_type):
            return sharder
    return None


def find_shardable_modules(module: nn.Module, sharders: list[ModuleSharder]) -> list[ShardableModule]:
    """Shardable modules of ``module`` (itself included) in ``named_modules()`` order."""
    if not sharders:
        raise ValueError(
            "sharders must list at least one ModuleSharder (e.g. EmbeddingBagCollectionSharder())"
        )
    for s in sharders:
        if not isinstance(s, ModuleSharder):
            raise TypeError(f"sharders must be ModuleSharder instances, got {type(s).__name__}: {s!r}")
    found: list[ShardableModule] = []
    for path, sub in module.named_modules():
        if any(f.path == "" or path.startswith(f.path + ".") for f in found):
            continue  # inside a module that is sharded as a whole
        sharder = _sharder_for(sub, sharders)
        if sharder is not None:
            found.append(ShardableModule(path, sub, sharder, table_configs(sharder, sub)))
    return found


def _per_feature(values: list, n: int, arg: str, table: str) -> np.ndarray:
    if len(values) == 1:
        return np.full(n, float(values[0]))
    if len(values) != n:
        raise ValueError(
            f"ParameterConstraints.{arg} of table {table!r} has {len(values)} entries; give one per "
            f"feature ({n}) or a single value for all"
        )
    return np.asarray(values, dtype=np.float64)


def lookups_per_step(c: ParameterConstraints, n_features: int, batch_size: int, table: str) -> tuple[float, float]:
    """``(ids, bags)`` one rank looks up in ``table`` per step: ``sum_f batch_f * num_poolings_f *
    pooling_f`` and ``sum_f batch_f * num_poolings_f`` over its ``n_features`` features, from the
    constraint's per-feature lists (one entry: the same for every feature; ``batch_f`` defaults to
    ``batch_size``, ``num_poolings_f`` to 1). The cost model and the storage reservation both count these.
    """
    pf = _per_feature(c.pooling_factors, n_features, "pooling_factors", table)
    bs = _per_feature(c.batch_sizes or [batch_size], n_features, "batch_sizes", table)
    bs = bs * _per_feature(c.num_poolings or [1.0], n_features, "num_poolings", table)  # each pooling is a lookup
    return float((bs * pf).sum()), float(bs.sum())


def collect_tables(
    modules: list[ShardableModule],
    topo: Topology,
    constraints: dict[str, ParameterConstraints],
    batch_size: int,
    tiered: bool = True,
) -> TableArrays:
    """Build :class:`TableArrays` from the shardable modules, sharders and constraints.

    Args:
        tiered: offer the tiered kernels (``fused_uvm_caching``, ``key_value``) beside the
            in-memory ones; False offers them only to tables that allow nothing else.
    """
    for name, c in constraints.items():
        if not isinstance(c, ParameterConstraints):
            raise TypeError(f"constraints[{name!r}] must be a ParameterConstraints, got {type(c).__name__}")
    names = {name for m in modules for name in m.configs}
    unknown = sorted(set(constraints) - names)
    if unknown:
        raise KeyError(
            f"constraints name tables that are not in the model: {unknown}; tables are {sorted(names)[:20]}"
        )
    device = str(topo.compute_device)
    keys: list[tuple[str, str]] = []
    cols_: dict[str, list[float]] = {
        k: [] for k in ("rows", "cols", "eb", "ro", "ids", "bags", "pooled", "oe", "or", "mp", "rs", "w")
    }
    allowed: list[list[tuple[int, list[int]]]] = []
    clf_choices: list[list[float]] = []
    min_cache_rows: list[int] = []
    stats: list[CacheStatistics | None] = []
    for m in modules:
        default_opt = m.sharder.fused_params.get("optimizer")
        sharder_clf = m.sharder.fused_params.get("cache_load_factor")
        min_rows = int(m.sharder.fused_params.get("cache_min_rows", DEFAULT_MIN_CACHE_ROWS))
        offered = m.sharder.sharding_types(device)
        offered_kernels = {stype: m.sharder.compute_kernels(stype, device) for stype in offered}
        row_state = m.sharder.row_state_bytes(m.module, device)
        # A weighted collection sends a float32 weight with every id (torchrec's is_weighted).
        module_weighted = bool(isinstance(m.module, PooledTables) and m.module.is_weighted())
        for name, cfg in m.configs.items():
            c = constraints.get(name, ParameterConstraints())
            opts: list[tuple[int, list[int]]] = []
            for code, stype in enumerate(SHARDING_TYPES):
                if stype not in offered or (c.sharding_types is not None and stype not in c.sharding_types):
                    continue
                kernels = _kernel_codes(offered_kernels[stype], c.compute_kernels, name)
                if FUSED in kernels:
                    # The kernel decides which optimizer trains the table (fused: the sharder's
                    # fused optimizer; dense: the dense optimizer), so the planner never trades
                    # it for speed: dense only where fused is not allowed. Dense never saves memory.
                    kernels = [k for k in kernels if k != DENSE]
                if kernels:
                    opts.append((code, sorted(kernels)))
            if not opts:
                unbuilt = sorted(set(c.sharding_types or []) & set(UNIMPLEMENTED_SHARDING_TYPES))
                raise ValueError(
                    f"table {name!r} has no allowed (sharding type, compute kernel) pair: constraints allow "
                    f"sharding_types={c.sharding_types}, compute_kernels={c.compute_kernels}, and "
                    f"{type(m.sharder).__name__} offers {offered} on {device!r}; widen the constraints"
                    + (f" ({unbuilt}: lightrec does not build this sharding; table_row_wise or "
                       "table_column_wise keep a table's traffic inside a host)" if unbuilt else "")
                )
            ids, bags = lookups_per_step(c, max(1, len(cfg.feature_names)), batch_size, name)
            opt = c.optimizer or (optimizer_name(default_opt) if default_opt is not None else "sgd")
            # What the table is stored as: a quantized collection keeps its data_type; a training collection
            # allocates float32 whatever data_type says (modules/embedding_modules.py warns), as counted here.
            stored = cfg.data_type if isinstance(m.module, QuantCollectionBase) else DataType.FP32
            quant = stored in (DataType.INT8, DataType.INT4, DataType.INT2)
            keys.append((m.path, name))
            allowed.append(opts if tiered else _without_tiered(opts))
            fixed = c.cache_params.load_factor if c.cache_params is not None else None
            fixed = fixed if fixed is not None else sharder_clf
            clf_choices.append([float(fixed)] if fixed is not None else list(CLF_CHOICES))
            min_cache_rows.append(min_rows)
            stats.append(c.cache_params.stats if c.cache_params is not None else None)
            cols_["rows"].append(cfg.num_embeddings)
            cols_["cols"].append(cfg.embedding_dim)
            cols_["eb"].append(_ELEM_BYTES[stored])
            cols_["ro"].append(_QUANT_ROW_BYTES if quant else 0.0)
            cols_["ids"].append(ids)
            cols_["bags"].append(bags)
            cols_["pooled"].append(getattr(cfg, "pooling", PoolingType.SUM) != PoolingType.NONE)
            cols_["oe"].append(OPTIMIZER_STATE[opt][0])
            cols_["or"].append(OPTIMIZER_STATE[opt][1])
            cols_["mp"].append(min(c.min_partition or DEFAULT_MIN_PARTITION, cfg.embedding_dim))
            cols_["rs"].append(float(row_state.get(name, 0.0)))
            cols_["w"].append(bool(c.is_weighted or module_weighted))
    f64 = lambda k: np.asarray(cols_[k], dtype=np.float64)  # noqa: E731
    return TableArrays(
        keys=keys,
        rows=np.asarray(cols_["rows"], dtype=np.int64),
        cols=np.asarray(cols_["cols"], dtype=np.int64),
        elem_bytes=f64("eb"),
        row_overhead=f64("ro"),
        ids=f64("ids"),
        bags=f64("bags"),
        pooled=np.asarray(cols_["pooled"], dtype=bool),
        opt_elem=f64("oe"),
        opt_row=f64("or"),
        allowed=allowed,
        min_partition=np.asarray(cols_["mp"], dtype=np.int64),
        clf_choices=clf_choices,
        min_cache_rows=np.asarray(min_cache_rows, dtype=np.int64),
        stats=stats,
        row_state=f64("rs"),
        weighted=np.asarray(cols_["w"], dtype=bool),
    )
