"""Planner inputs: the cluster (:class:`Topology`), per-table hints (:class:`ParameterConstraints`)
and the error raised when no plan fits (:class:`PlannerError`); torchrec's planner objects
(:class:`ShardingOption`, :class:`Shard`, :class:`Storage`, :class:`Perf` and the interfaces
:class:`Enumerator`, :class:`ShardEstimator`, :class:`Proposer`, :class:`Partitioner`,
:class:`StorageReservation`, :class:`PerfModel`), through which custom planner parts plug in
(docs/planner.md, "torchrec's planner classes").

All sizes are bytes, all bandwidths bytes per second, all costs seconds per training step. A rank
has three tiers: *fast* memory, where tables and caches live (HBM on ``cuda``, DDR on ``cpu``),
*host* memory behind a GPU (DDR, the backing tier of ``fused_uvm_caching`` tables) and *SSD* (the
backing tier of ``key_value`` tables). The defaults of a ``Topology`` per compute device and the
optimizer state the storage model counts are in ``constants.py`` (``GiB`` and ``OPTIMIZER_STATE``
are re-exported here, where they were first).
"""

from __future__ import annotations

import abc
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import torch
from torch import nn

from lightrec.distributed.planner.constants import DEVICE_DEFAULTS, OPTIMIZER_STATE, GiB, optimizer_name
from lightrec.distributed.planner.plan import (
    CacheParams,
    EmbeddingComputeKernel,
    KeyValueParams,
    ModuleSharder,
    ShardingPlan,
    ShardingType,
    enum_value,
)
from lightrec.distributed.planner.sharder_data import SharderData, SharderDataMap

__all__ = [
    "Enumerator",
    "GiB",
    "OPTIMIZER_STATE",
    "ParameterConstraints",
    "Partitioner",
    "Perf",
    "PerfModel",
    "PlannerError",
    "PlannerErrorType",
    "Proposer",
    "Shard",
    "ShardEstimator",
    "SharderData",
    "SharderDataMap",
    "ShardingOption",
    "ShardingPlan",
    "Storage",
    "StorageReservation",
    "Topology",
    "device_hbm_caps",
]


def device_hbm_caps(world_size: int, local_world_size: int) -> list[int] | None:
    """HBM bytes of every rank's GPU, read from the visible devices; None without CUDA.

    Rank ``r`` uses local device ``r % local_world_size`` (the usual one process per GPU); the
    devices of other hosts cannot be seen from here, so each host is assumed to hold the same GPUs
    as this one, and a local index beyond this host's devices takes device 0's size.
    """
    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    if count == 0:
        return None
    local = [int(torch.cuda.get_device_properties(i).total_memory) for i in range(count)]
    return [
        local[r % local_world_size] if r % local_world_size < count else local[0] for r in range(world_size)
    ]


@dataclass
class Topology:
    """The cluster the plan is for.

    Args:
        world_size: number of ranks.
        compute_device: ``"cuda"`` or ``"cpu"``; ``None`` picks ``"cuda"`` when a GPU is visible.
            Tables live in HBM on ``cuda`` and in DDR on ``cpu``.
        local_world_size: ranks per host (default: ``world_size``, one host); must divide it.
        hbm_cap: device memory per rank, bytes (one int, or one per rank). With
            ``compute_device="cuda"`` and a visible GPU the default is read from the device
            (:func:`device_hbm_caps`), else 32 GiB.
        ddr_cap: host memory per rank, bytes (one int, or one per rank).
        hbm_mem_bw / ddr_mem_bw: memory bandwidth per rank, bytes/s.
        intra_host_bw / inter_host_bw: collective bandwidth per rank inside / across hosts, bytes/s.
            (torchrec's ``Topology`` takes bytes per millisecond, as the constants at torchrec's paths
            keep them: multiply those by 1000.)
        kernel_overhead_s: fixed cost of one shard's lookup (launch, bookkeeping), seconds.
        ssd_cap: local SSD bytes per rank for ``key_value`` tables (one int, or one per rank).
        ssd_mem_bw: the SSD's bandwidth for a tiered table's page reads and writes, bytes/s.
        hbm_to_ddr_mem_bw: host <-> GPU copy bandwidth (``fused_uvm_caching`` fetches), bytes/s.

    ``None`` fields take the defaults of ``compute_device`` (``constants.DEVICE_DEFAULTS``, docs/planner.md).
    """

    world_size: int
    compute_device: str | None = None
    local_world_size: int | None = None
    hbm_cap: int | list[int] | None = None
    ddr_cap: int | list[int] | None = None
    hbm_mem_bw: float | None = None
    ddr_mem_bw: float | None = None
    intra_host_bw: float | None = None
    inter_host_bw: float | None = None
    kernel_overhead_s: float | None = None
    ssd_cap: int | list[int] | None = None
    ssd_mem_bw: float | None = None
    hbm_to_ddr_mem_bw: float | None = None
    _caps: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size <= 0:
            raise ValueError(f"Topology(world_size=...) must be a positive int, got {self.world_size!r}")
        if self.compute_device is None:
            self.compute_device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.compute_device not in DEVICE_DEFAULTS:
            raise ValueError(
                f"Topology(compute_device=...) must be 'cuda' or 'cpu', got {self.compute_device!r}"
            )
        if self.local_world_size is None:
            self.local_world_size = self.world_size
        if (
            not isinstance(self.local_world_size, int)
            or self.local_world_size <= 0
            or self.world_size % self.local_world_size
        ):
            raise ValueError(
                f"Topology(local_world_size=...) must be a positive divisor of world_size={self.world_size}, "
                f"got {self.local_world_size!r}"
            )
        defaults = DEVICE_DEFAULTS[self.compute_device]
        if self.compute_device == "cuda" and self.hbm_cap is None:
            measured = device_hbm_caps(self.world_size, self.local_world_size)
            if measured is not None:
                self.hbm_cap = measured
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        for name in ("hbm_mem_bw", "ddr_mem_bw", "intra_host_bw", "inter_host_bw", "kernel_overhead_s", "ssd_mem_bw",
                     "hbm_to_ddr_mem_bw"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"Topology({name}=...) must be >= 0, got {getattr(self, name)!r}")
        for name in ("hbm_cap", "ddr_cap", "ssd_cap"):
            value = getattr(self, name)
            caps = np.asarray([value] * self.world_size if np.isscalar(value) else value, dtype=np.float64)
            if caps.shape != (self.world_size,) or (caps < 0).any():
                raise ValueError(
                    f"Topology({name}=...) must be a byte count >= 0 or a list of {self.world_size} of them, "
                    f"got {value!r}"
                )
            self._caps[name] = caps
        if self.device_mem_bw <= 0:
            raise ValueError(
                f"Topology: the memory bandwidth of compute_device={self.compute_device!r} must be > 0"
            )

    # The Optional fields (local_world_size, the bandwidths, kernel_overhead_s) are never None after
    # __post_init__; readers write `x or 0.0` / use local_size to say so to the type checker.
    @property
    def local_size(self) -> int:
        """Ranks per host: ``local_world_size`` as resolved by ``__post_init__`` (default ``world_size``)."""
        return self.local_world_size or self.world_size

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_size

    @property
    def hbm_caps(self) -> np.ndarray:
        """``[world_size]`` HBM bytes per rank."""
        return self._caps["hbm_cap"]

    @property
    def ddr_caps(self) -> np.ndarray:
        """``[world_size]`` DDR bytes per rank."""
        return self._caps["ddr_cap"]

    @property
    def ssd_caps(self) -> np.ndarray:
        """``[world_size]`` SSD bytes per rank."""
        return self._caps["ssd_cap"]

    @property
    def backing_caps(self) -> np.ndarray:
        """``[world_size, 2]`` bytes of the backing tiers per rank: host memory behind a GPU (none on
        ``cpu``, where DDR is the fast tier) and SSD."""
        host = self.ddr_caps if self.compute_device == "cuda" else np.zeros(self.world_size)
        return np.stack([host, self.ssd_caps], axis=1)

    @property
    def storage_caps(self) -> np.ndarray:
        """``[world_size]`` bytes of the memory tables live in (HBM on cuda, DDR on cpu)."""
        return self.hbm_caps if self.compute_device == "cuda" else self.ddr_caps

    @property
    def storage_kind(self) -> str:
        return "HBM" if self.compute_device == "cuda" else "DDR"

    @property
    def device_mem_bw(self) -> float:
        bandwidth = self.hbm_mem_bw if self.compute_device == "cuda" else self.ddr_mem_bw
        return float(bandwidth or 0.0)  # __post_init__ filled the device's default

    @property
    def comm_bw(self) -> float:
        """Bandwidth of a collective over all ranks: inter-host once the world spans hosts."""
        return float((self.intra_host_bw if self.num_hosts == 1 else self.inter_host_bw) or 0.0)


@dataclass
class ParameterConstraints:
    """Hints and limits for one table (keyed by table name in the planner's ``constraints``).

    Args:
        sharding_types: allowed sharding types (default: all the sharder offers).
        compute_kernels: allowed kernels (default: all the sharder offers).
        min_partition: narrowest column shard for column-wise types (default 32, or the dim).
        pooling_factors: average ids per bag, one per feature of the table (or one for all).
        num_poolings: poolings per feature (one per feature, or one for all; default 1): each
            multiplies the feature's bags and outputs, as torchrec counts them.
        batch_sizes: per-rank batch size, one per feature (or one for all); default: the planner's.
        optimizer: fused optimizer name (sizes its state); default: the sharder's
            ``fused_params["optimizer"]``, else ``"sgd"``.
        cache_params: for the tiered kernels (``fused_uvm_caching``, ``key_value``): a fixed
            ``load_factor`` (else the planner picks one) and ``stats`` of the id stream (else ids
            are taken to follow a Zipf law, ``ZipfCacheStatistics``).
        key_value_params: the SSD directory of a ``key_value`` table (put in the plan as is).
        is_weighted: every id of the table comes with a float32 weight (as for a weighted
            collection): the cost model counts its bytes in the input dist and the buffers.
        enforce_hbm, stochastic_rounding, bounds_check_mode, feature_names, output_dtype,
        device_group, use_virtual_table: torchrec's fields, accepted and not used by the planner
            (docs/planner.md says why for each).
    """

    sharding_types: list[str] | None = None
    compute_kernels: list[str] | None = None
    min_partition: int | None = None
    pooling_factors: list[float] = field(default_factory=lambda: [1.0])
    num_poolings: list[float] | None = None
    batch_sizes: list[int] | None = None
    optimizer: str | None = None
    cache_params: CacheParams | None = None
    key_value_params: KeyValueParams | None = None
    is_weighted: bool = False
    # torchrec's fields that do not change a lightrec plan (accepted so its constraints load as they are)
    enforce_hbm: bool | None = None
    stochastic_rounding: bool | None = None
    bounds_check_mode: object = None
    feature_names: list[str] | None = None
    output_dtype: object = None
    device_group: str | None = None
    use_virtual_table: bool = False

    def __post_init__(self) -> None:
        for arg in ("sharding_types", "compute_kernels", "pooling_factors", "num_poolings", "batch_sizes"):
            value = getattr(self, arg)
            # A bare string or number is not a list: a string was read letter by letter ("got 'r'")
            # and a number failed with "'float' object is not iterable", neither naming the field.
            if value is not None and (isinstance(value, (str, bytes)) or not isinstance(value, Iterable)):
                raise TypeError(
                    f"ParameterConstraints.{arg} must be a list, got {type(value).__name__} {value!r}; "
                    f"write {arg}=[{value!r}]"
                )
        if self.sharding_types is not None:
            self.sharding_types = [
                enum_value(t, ShardingType, "ParameterConstraints.sharding_types")
                for t in self.sharding_types
            ]
        if self.compute_kernels is not None:
            self.compute_kernels = [
                enum_value(k, EmbeddingComputeKernel, "ParameterConstraints.compute_kernels")
                for k in self.compute_kernels
            ]
        if self.min_partition is not None and (
            not isinstance(self.min_partition, int) or isinstance(self.min_partition, bool) or self.min_partition <= 0
        ):
            raise ValueError(
                f"ParameterConstraints.min_partition must be a positive int, got {self.min_partition!r}"
            )
        self.pooling_factors = _floats(self.pooling_factors, "pooling_factors")
        if not self.pooling_factors or any(not math.isfinite(p) or p < 0 for p in self.pooling_factors):
            raise ValueError(
                f"ParameterConstraints.pooling_factors must be non-negative numbers, got {self.pooling_factors!r}"
            )
        if self.num_poolings is not None:
            self.num_poolings = _floats(self.num_poolings, "num_poolings")
            if not self.num_poolings or any(not math.isfinite(p) or p <= 0 for p in self.num_poolings):
                raise ValueError(
                    f"ParameterConstraints.num_poolings must be positive numbers, got {self.num_poolings!r}"
                )
        if self.batch_sizes is not None and (
            not self.batch_sizes or any(not isinstance(b, int) or b <= 0 for b in self.batch_sizes)
        ):
            raise ValueError(
                f"ParameterConstraints.batch_sizes must be positive ints, got {self.batch_sizes!r}"
            )
        if self.optimizer is not None:
            self.optimizer = optimizer_name(self.optimizer)


def _floats(values: list, arg: str) -> list[float]:
    """``values`` as floats; a non-number is a ``ValueError`` naming ``ParameterConstraints.<arg>``."""
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        raise ValueError(f"ParameterConstraints.{arg} must be numbers, got {values!r}") from None


class PlannerErrorType(Enum):
    """Why planning failed (torchrec's ``PlannerError.error_type``): memory, the constraints, the partitioner."""

    INSUFFICIENT_STORAGE = "insufficient_storage"
    STRICT_CONSTRAINTS = "strict_constraints"
    PARTITION = "partition"
    OTHER = "other"


class PlannerError(ValueError):
    """No plan fits the topology. ``tables`` names the tables that do not fit (possibly all);
    ``needed_bytes`` / ``available_bytes`` give the memory per rank behind the verdict;
    ``error_type`` (torchrec's attribute) says why."""

    def __init__(
        self, message: str, tables: list[str], needed_bytes: float, available_bytes: float,
        error_type: PlannerErrorType = PlannerErrorType.OTHER,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.tables = tables
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.error_type = error_type

    def __reduce__(self) -> tuple:
        # Pickle with all constructor arguments (collective_plan broadcasts it to every rank).
        return (type(self), (str(self), self.tables, self.needed_bytes, self.available_bytes, self.error_type))


# ---- torchrec's planner objects -------------------------------------------------------------------
@dataclass
class Storage:
    """Bytes a shard needs in device memory (``hbm``) and host memory (``ddr``)."""

    hbm: int
    ddr: int

    def __add__(self, other: Storage) -> Storage:
        return Storage(self.hbm + other.hbm, self.ddr + other.ddr)


@dataclass
class Perf:
    """Seconds per step of one shard, split as torchrec splits them; ``total`` is their sum."""

    fwd_compute: float
    fwd_comms: float
    bwd_compute: float
    bwd_comms: float
    prefetch_compute: float = 0.0

    @property
    def total(self) -> float:
        return self.fwd_compute + self.fwd_comms + self.bwd_compute + self.bwd_comms + self.prefetch_compute


@dataclass
class Shard:
    """One shard of an option: ``size`` ``[rows, cols]`` at ``offset`` ``[row, col]``, its estimates
    and (after partitioning) its ``rank``."""

    size: list[int]
    offset: list[int]
    storage: Storage | None = None
    perf: Perf | None = None
    rank: int | None = None


@dataclass
class ShardingOption:
    """One way to shard one table (torchrec's planner option).

    Attributes:
        name: table name; ``module``: ``(path, module)`` of its collection.
        sharding_type, compute_kernel: the option's choice (string values).
        shards: its shards (one entry stands for every replica of a data-parallel table).
        input_lengths: pooling factor per feature; ``batch_size``: per rank.
        partition_by: ``"uniform"`` (one shard per rank, fixed), ``"host"`` (shards on one host) or
            ``"device"`` (each shard anywhere).
        cache_params: a tiered kernel's cache (``load_factor``: the option's cache size); None
            for the in-memory kernels.
    """

    name: str
    tensor: torch.Tensor
    module: tuple[str, nn.Module]
    input_lengths: list[float]
    batch_size: int
    sharding_type: str
    partition_by: str
    compute_kernel: str
    shards: list[Shard] = field(default_factory=list)
    is_pooled: bool = True
    feature_names: list[str] | None = None
    cache_params: CacheParams | None = None
    _option_index: int | None = field(default=None, repr=False, compare=False)
    _estimates: list[tuple[Storage, Perf]] | None = field(default=None, repr=False, compare=False)

    @property
    def fqn(self) -> str:
        return f"{self.module[0]}.{self.name}" if self.module[0] else self.name

    @property
    def path(self) -> str:
        return self.module[0]

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def cache_load_factor(self) -> float | None:
        return None if self.cache_params is None else self.cache_params.load_factor

    @property
    def num_inputs(self) -> int:
        return len(self.input_lengths)

    @property
    def total_storage(self) -> Storage:
        out = Storage(0, 0)
        for shard in self.shards:
            out = out + (shard.storage or Storage(0, 0))
        return out

    @property
    def total_perf(self) -> float:
        return sum(s.perf.total for s in self.shards if s.perf is not None)

    def storage_hash(self) -> int:
        """A stable id of the option before planning (table, sharding type, kernel, cache load factor,
        shard count): the key a stored plan's options are matched by (``planners.extract_plan``).
        torchrec's definition, so hashes agree across runs and processes."""
        key = f"{self.fqn}|{self.sharding_type}|{self.compute_kernel}|{self.cache_load_factor}|{self.num_shards}"
        return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=7).digest(), byteorder="big")


class Enumerator(abc.ABC):
    """Lists every ``ShardingOption`` of every table of a model."""

    @abc.abstractmethod
    def enumerate(self, module: nn.Module, sharders: list[ModuleSharder]) -> list[ShardingOption]: ...

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:  # noqa: B027 - optional hook
        """Fill ``shard.storage`` / ``shard.perf`` of ``sharding_options`` (default: nothing)."""


class ShardEstimator(abc.ABC):
    """Fills ``shard.perf`` or ``shard.storage`` of sharding options in place."""

    def __init__(self, topology: Topology, constraints: dict[str, ParameterConstraints] | None = None) -> None:
        self._topology = topology
        self._constraints = constraints

    @abc.abstractmethod
    def estimate(self, sharding_options: list[ShardingOption], sharder_map: dict[str, ModuleSharder] | None = None) -> None: ...


class Proposer(abc.ABC):
    """Proposes one option per table, learning from the planner's feedback on earlier proposals."""

    @abc.abstractmethod
    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None) -> None: ...

    @abc.abstractmethod
    def propose(self) -> list[ShardingOption] | None: ...

    @abc.abstractmethod
    def feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None = None,
        perf_rating: float | None = None,
        storage_constraint: Topology | None = None,
    ) -> None: ...


class Partitioner(abc.ABC):
    """Puts the shards of a proposal on ranks (sets ``shard.rank``); raises ``PlannerError`` when they do not fit."""

    @abc.abstractmethod
    def partition(self, proposal: list[ShardingOption], storage_constraint: Topology) -> list[ShardingOption]: ...


class StorageReservation(abc.ABC):
    """Returns the topology left for the tables once memory for everything else is set aside."""

    @abc.abstractmethod
    def reserve(
        self,
        topology: Topology,
        batch_size: int,
        module: nn.Module,
        sharders: list[ModuleSharder],
        constraints: dict[str, ParameterConstraints] | None = None,
    ) -> Topology: ...


class PerfModel(abc.ABC):
    """Rates a partitioned plan; the planner keeps the plan with the lowest rating."""

    @abc.abstractmethod
    def rate(self, plan: list[ShardingOption]) -> float: ...
