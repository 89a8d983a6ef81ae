"""``ModuleSharder``: what the planner reads about a sharder of one module type.

The sharders that build sharded modules (``EmbeddingBagCollectionSharder`` ...) derive from it; the
planner, the fingerprint of a plan and the plan helpers read only the methods here, so none of them
depends on the sharded modules. What they read of a module is declared here too: its tables
(:class:`PooledTables` / :class:`SequenceTables`, :func:`tables_of`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

import torch
from torch import nn

from lightrec.distributed.planner.plan.option_enums import StorageUsageType
from lightrec.distributed.planner.plan.plan_types import (
    TIERED_KERNELS,
    UNIMPLEMENTED_SHARDING_TYPES,
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    ShardingType,
    enum_value,
)
from lightrec.modules.embedding_configs import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
)
from lightrec.optim.fused_spec import FusedOptimizerSpec

__all__ = [
    "FusedParams",
    "FusedParamsLike",
    "ModuleSharder",
    "PooledTableConfigs",
    "PooledTables",
    "SequenceTables",
    "default_sharders",
    "register_default_sharders",
    "table_configs",
    "tables_of",
]

FusedParams = Mapping[str, Any]
"""torchrec-style options of a fused kernel, e.g. ``{"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
"learning_rate": 0.02}`` plus the tiered tables' keys (``cache_load_factor`` ...): values of several
kinds (enums or their names, numbers, paths), each read by its key (``FusedOptimizerSpec.coerce``,
``sharding/tiering.py``)."""

FusedParamsLike = FusedParams | FusedOptimizerSpec | None
"""What a sharder or sharded collection takes as its fused optimizer (None: the default, SGD)."""


@runtime_checkable
class PooledTableConfigs(Protocol):
    """What the planner reads of a pooled collection: its tables (a torchrec-style user module may
    offer only this)."""

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]: ...


@runtime_checkable
class PooledTables(PooledTableConfigs, Protocol):
    """A pooled embedding collection: ``EmbeddingBagCollection`` and every kind of it (fused, sharded,
    quantized, feature-processed, managed-collision)."""

    def is_weighted(self) -> bool: ...


@runtime_checkable
class SequenceTables(Protocol):
    """A sequence (unpooled) embedding collection: ``EmbeddingCollection`` and every kind of it."""

    def embedding_configs(self) -> Sequence[EmbeddingConfig]: ...


def tables_of(module: object) -> list[BaseEmbeddingConfig] | None:
    """The configs of ``module``'s tables, in order: ``embedding_bag_configs()`` of a pooled collection,
    ``embedding_configs()`` of a sequence one; None for any other module."""
    if isinstance(module, PooledTableConfigs):
        return list(module.embedding_bag_configs())
    if isinstance(module, SequenceTables):
        return list(module.embedding_configs())
    return None

_COMPUTE_DEVICES = ("cpu", "cuda", "meta")


M = TypeVar("M", bound=nn.Module)


class ModuleSharder(abc.ABC, Generic[M]):
    """What the planner needs to know about a sharder of one module type.

    Generic in the module type, as torchrec's (``ModuleSharder[nn.Module]`` in annotations).

    Subclasses (``EmbeddingBagCollectionSharder``, ...) add the ``shard(...)`` method that builds
    the sharded module; the planner only reads the methods below.

    Args:
        fused_params: options of the fused kernel, e.g. ``{"optimizer": "rowwise_adagrad",
            "learning_rate": 0.01}``; the planner reads ``"optimizer"`` to size optimizer state.
    """

    #: Which storage rule the planner's estimators apply to this sharder's tables (torchrec tells
    #: by the sharder's base class; lightrec's embedding sharders say BASE, the quantized ones BASE_QUANT).
    storage_usage_type: ClassVar[StorageUsageType] = StorageUsageType.DEFAULT

    def __init__(self, fused_params: FusedParams | None = None) -> None:
        self._fused_params = dict(fused_params or {})

    @property
    @abc.abstractmethod
    def module_type(self) -> type[nn.Module]:
        """The module class this sharder shards."""

    @property
    def fused_params(self) -> dict[str, Any]:  # a FusedParams the caller may extend
        return self._fused_params

    @property
    def qcomm_codecs_registry(self) -> dict[str, Any] | None:
        """``{comm op: codecs}`` of the collectives this sharder quantizes (None: none)."""
        return None

    def sharding_types(self, compute_device_type: str) -> list[str]:
        """Sharding types offered on ``compute_device_type`` (every type lightrec builds, on CPU and CUDA)."""
        _check_device_type(compute_device_type)
        return [t.value for t in ShardingType if t.value not in UNIMPLEMENTED_SHARDING_TYPES]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        """Kernels offered for ``sharding_type``: data parallel uses the dense kernel (its gradient
        is all-reduced like any dense parameter); the others offer fused, the tiered kernels
        (``fused_uvm_caching`` on GPUs: rows in host memory; ``key_value``: rows on SSD; the planner
        picks them only when the tables do not fit in memory otherwise), then dense."""
        _check_device_type(compute_device_type)
        if enum_value(sharding_type, ShardingType, "sharding_type") == ShardingType.DATA_PARALLEL.value:
            return [EmbeddingComputeKernel.DENSE.value]
        tiered = [EmbeddingComputeKernel.KEY_VALUE.value]
        if compute_device_type == "cuda":
            tiered.insert(0, EmbeddingComputeKernel.FUSED_UVM_CACHING.value)
        return [EmbeddingComputeKernel.FUSED.value, *tiered, EmbeddingComputeKernel.DENSE.value]

    def finalize_module_plan(
        self, module: nn.Module, plan: EmbeddingModuleShardingPlan, world_size: int
    ) -> EmbeddingModuleShardingPlan:
        """The module's plan as the planner built it, adjusted to what the sharded module needs
        (the planner calls this last; e.g. managed-collision tables lay row blocks on whole buckets)."""
        return plan

    def row_state_bytes(self, module: nn.Module, device_type: str = "cpu") -> dict[str, float]:
        """``{table: bytes per row}`` of state a table keeps besides weights and optimizer state
        (e.g. a managed-collision id map) when it trains on ``device_type``; the planner counts it in
        the table's memory."""
        return {}

    def storage_usage(self, tensor: torch.Tensor, compute_device_type: str, compute_kernel: str) -> dict[str, int]:
        """``{"hbm" | "ddr": bytes}`` a table's weights take (torchrec's rule, read by
        ``calculate_shard_storages``): device memory on CUDA, host memory on CPU and for the
        tiered kernels, whose rows live behind a cache."""
        if compute_device_type not in ("cpu", "cuda", "mtia"):
            raise ValueError(
                f"compute_device_type must be 'cpu', 'cuda' or 'mtia', got {compute_device_type!r}"
            )
        size = tensor.element_size() * tensor.nelement()
        in_host = compute_device_type == "cpu" or compute_kernel in TIERED_KERNELS
        return {"ddr" if in_host else "hbm": size}

    def shardable_parameters(self, module: nn.Module) -> dict[str, BaseEmbeddingConfig]:
        """``{table name: config}`` of ``module``'s tables, read from ``embedding_bag_configs()``
        (pooled collections) or ``embedding_configs()`` (unpooled)."""
        configs = tables_of(module)
        if configs is not None:
            return {cfg.name: cfg for cfg in configs}
        raise TypeError(
            f"{type(module).__name__} has neither embedding_bag_configs() nor embedding_configs(); "
            f"{type(self).__name__} can only shard embedding collections"
        )


def _check_device_type(compute_device_type: str) -> None:
    if compute_device_type not in _COMPUTE_DEVICES:
        raise ValueError(
            f"compute_device_type must be one of {_COMPUTE_DEVICES}, got {compute_device_type!r}"
        )


_DATA_TYPES = {torch.float32: DataType.FP32, torch.float16: DataType.FP16, torch.bfloat16: DataType.BF16,
               torch.uint8: DataType.INT8, torch.int8: DataType.INT8}  # fmt: skip


def table_configs(sharder: ModuleSharder, module: nn.Module) -> dict[str, BaseEmbeddingConfig]:
    """``{table: config}`` of ``module`` as the planner reads it.

    lightrec's sharders report configs; a torchrec-style extension sharder reports its parameters
    (``{name: nn.Parameter}``, torchrec's ``shardable_parameters``): each 2-D parameter is read as a
    table of its shape and dtype with one feature named after it.

    Raises:
        TypeError: ``shardable_parameters`` returned something else.
    """
    out: dict[str, BaseEmbeddingConfig] = {}
    for name, value in sharder.shardable_parameters(module).items():
        if isinstance(value, BaseEmbeddingConfig):
            out[name] = value
        elif isinstance(value, torch.Tensor) and value.dim() == 2 and value.dtype in _DATA_TYPES:
            rows, cols = (int(n) for n in value.shape)
            out[name] = BaseEmbeddingConfig(rows, cols, name, _DATA_TYPES[value.dtype], [name])
        else:
            raise TypeError(
                f"{type(sharder).__name__}.shardable_parameters() gave {name!r}: {type(value).__name__}; give an "
                "embedding config, or a 2-D float parameter (torchrec's form)"
            )
    return out


# The sharders used when a caller gives none (torchrec's ``collective_plan(module)``). They are
# sharded-module code, which the plan model and the planner do not import: the module that builds
# them (``lightrec.distributed.dmp.default_sharders``, loaded with ``lightrec.distributed``) registers them.
_default_sharders: Callable[[], list[ModuleSharder]] | None = None


def register_default_sharders(factory: Callable[[], list[ModuleSharder]]) -> None:
    """Make ``factory()`` the sharders used when none are given."""
    global _default_sharders
    _default_sharders = factory


def default_sharders() -> list[ModuleSharder]:
    """The registered default sharders (``lightrec.distributed.get_default_sharders()``)."""
    if _default_sharders is None:
        raise RuntimeError("no default sharders registered: import lightrec.distributed, or pass sharders=")
    return _default_sharders()
