"""torchrec's performance-estimator types: what one kind of hardware is like
(:class:`HardwarePerfConfig`) and everything known of one shard before its time is estimated
(:class:`ShardPerfContext`).

A ``HardwarePerfConfig`` subclass describes a machine: its memory bandwidths (class attributes,
torchrec's units: **bytes per millisecond**), overrides per ``(device, kernel)``, the sharding
types it supports, multipliers of the backward pass. :meth:`HardwarePerfConfig.get_device_bw`
answers "how fast does this kernel read its rows here", in this order::

    kernel_device_bandwidths[(device, kernel)]  ->  device_bw  ->  kernel_bw_lookup(...)

``ShardPerfContext.build_shard_perf_contexts(config, shard_sizes, option, topology, constraints,
sharder)`` gathers, per shard of a ``ShardingOption``, the inputs of a perf formula: batch sizes,
poolings and pooling factors per feature, world and host size, the byte sizes of ids, rows,
outputs and of the quantized collectives (``SharderData``), the bandwidths and the cache's
expected miss rate. lightrec's ``Topology`` holds bandwidths in bytes per second; contexts hold
them in torchrec's bytes per millisecond (divided by 1000), so formulas written for torchrec give
torchrec's numbers. lightrec's own planner costs shards with its vectorised model
(``shard_estimators.py``); these types serve estimators written against torchrec's, which can
plug into lightrec's planner as a ``ShardEstimator`` (their ``shard.perf`` is planned with).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from lightrec.distributed.planner.constants import (
    BIGINT_DTYPE,
    BWD_COMPUTE_MULTIPLIER,
    DDR_MEM_BW,
    HBM_MEM_BW,
    SSD_MEM_BW,
    WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER,
    kernel_bw_lookup,
)
from lightrec.distributed.planner.plan import ModuleSharder
from lightrec.distributed.planner.sharder_data import SharderData, build_sharder_data
from lightrec.distributed.planner.types import ParameterConstraints, Perf, ShardingOption, Topology
from lightrec.distributed.planner.utils import (
    extract_comm_data_type_size_v2,
    get_num_poolings,
    is_prefetch_pipelined_v2,
)

__all__ = ["HardwarePerfConfig", "ShardPerfContext"]

_MS_PER_S = 1000.0


class HardwarePerfConfig:
    """Performance settings of one kind of hardware (subclass and set the class attributes).

    Attributes:
        name: the hardware's name (``"H100"``, ...).
        hbm_mem_bw, ddr_mem_bw, ssd_mem_bw: memory bandwidths, bytes/ms.
        device_bw: one bandwidth for every kernel (None: per kernel, ``kernel_bw_lookup``).
        hbm_to_ddr_mem_bw, intra_host_bw, inter_host_bw: overrides of the topology's (None: the topology's).
        kernel_device_bandwidths: ``{(device, kernel): bytes/ms}``, the first thing looked up.
    """

    name: ClassVar[str] = "default"
    hbm_mem_bw: ClassVar[float] = HBM_MEM_BW
    ddr_mem_bw: ClassVar[float] = DDR_MEM_BW
    ssd_mem_bw: ClassVar[float] = SSD_MEM_BW
    device_bw: ClassVar[float | None] = None
    hbm_to_ddr_mem_bw: ClassVar[float | None] = None
    intra_host_bw: ClassVar[float | None] = None
    inter_host_bw: ClassVar[float | None] = None
    kernel_device_bandwidths: ClassVar[dict[tuple[str, str], float]] = {}
    #: Sharding types the hardware runs (None: all).
    _supported_sharding_types: ClassVar[frozenset[str] | None] = None
    #: Bytes of an output element when the option names no output dtype (None: the table's element size).
    _default_output_data_type_size: ClassVar[float | None] = None
    _bwd_compute_multiplier: ClassVar[float | None] = None
    _weighted_feature_bwd_compute_multiplier: ClassVar[float | None] = None
    _use_linear_regression_prefetch_estimate: ClassVar[bool] = False

    def get_bwd_compute_multiplier(self, ctx_multiplier: float) -> float:
        """This hardware's backward/forward compute ratio, else the context's."""
        return ctx_multiplier if self._bwd_compute_multiplier is None else self._bwd_compute_multiplier

    def get_weighted_feature_bwd_compute_multiplier(self, ctx_multiplier: float) -> float:
        """The extra backward factor of weighted features on this hardware, else the context's."""
        own = self._weighted_feature_bwd_compute_multiplier
        return ctx_multiplier if own is None else own

    def is_sharding_type_supported(self, sharding_type: str) -> bool:
        supported = self._supported_sharding_types
        return supported is None or sharding_type.lower() in supported

    def validate_sharding_type(self, sharding_type: str) -> None:
        """Raise ``ValueError`` naming the supported types when ``sharding_type`` is not one."""
        if not self.is_sharding_type_supported(sharding_type):
            raise ValueError(
                f"sharding type {sharding_type!r} is not supported by {type(self).__name__}; it supports "
                f"{sorted(self._supported_sharding_types or [])}"
            )

    def post_process_perfs(
        self,
        shard_perfs: list[Perf],
        shard_sizes: list[list[int]],
        sharding_type: str,
        uneven_sharding_perf_multiplier: float = 1.0,
    ) -> list[Perf]:
        """Adjust the shards' estimates across shards (default: unchanged)."""
        return shard_perfs

    def get_device_bw(
        self,
        compute_device: str,
        compute_kernel: str,
        hbm_mem_bw: float,
        ddr_mem_bw: float,
        ssd_mem_bw: float,
        hbm_to_ddr_mem_bw: float,
        caching_ratio: float | None = None,
        prefetch_pipeline: bool = False,
    ) -> float:
        """Bandwidth (bytes/ms) the kernel reads rows at (see the module docstring).

        Raises:
            ValueError: no bandwidth is known for the device and kernel.
        """
        kernel = compute_kernel
        if prefetch_pipeline and compute_device.lower() == "cuda" and kernel == "fused_uvm_caching":
            kernel = "fused"
        key = (compute_device.lower(), kernel.lower())
        if key in self.kernel_device_bandwidths:
            return self.kernel_device_bandwidths[key]
        if self.device_bw is not None:
            return self.device_bw
        bw = kernel_bw_lookup(compute_device, compute_kernel, hbm_mem_bw, ddr_mem_bw, hbm_to_ddr_mem_bw,
                              caching_ratio, prefetch_pipeline, ssd_mem_bw)  # fmt: skip
        if bw is None:
            raise ValueError(
                f"no bandwidth is known for compute kernel {compute_kernel!r} on {compute_device!r}; "
                f"set {type(self).__name__}.kernel_device_bandwidths[({compute_device!r}, {compute_kernel!r})]"
            )
        return bw


@dataclass
class ShardPerfContext:
    """The inputs of one shard's performance estimate (bandwidths in bytes/ms, sizes in bytes)."""

    sharding_type: str = ""
    compute_kernel: str = ""
    hash_size: int = 0
    emb_dim: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    num_poolings: list[float] = field(default_factory=list)
    input_lengths: list[float] = field(default_factory=list)
    world_size: int = 1
    local_world_size: int = 1
    input_data_type_size: float = BIGINT_DTYPE
    table_data_type_size: float = 4.0
    output_data_type_size: float = 4.0
    fwd_a2a_comm_data_type_size: float = 4.0
    bwd_a2a_comm_data_type_size: float = 4.0
    fwd_sr_comm_data_type_size: float = 4.0
    bwd_sr_comm_data_type_size: float = 4.0
    device_bw: float = HBM_MEM_BW
    hbm_to_ddr_mem_bw: float = HBM_MEM_BW
    intra_host_bw: float = 0.0
    inter_host_bw: float = 0.0
    is_inference: bool = False
    is_weighted: bool = False
    is_pooled: bool = True
    has_feature_processor: bool = False
    bwd_compute_multiplier: float = BWD_COMPUTE_MULTIPLIER
    weighted_feature_bwd_compute_multiplier: float = WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER
    use_linear_regression_prefetch_estimate: bool = False
    use_batch_inputs_for_expected_cache_fetches: bool = False
    caching_ratio: float | None = None
    table_name: str = ""
    hash_size_for_clamping: int = 0
    cache_stats_expected_lookups: float | None = None
    expected_miss_rate: float | None = None

    @classmethod
    def build_shard_perf_contexts(
        cls, config: HardwarePerfConfig, shard_sizes: list[list[int]], sharding_option: ShardingOption,
        topology: Topology, constraints: dict[str, ParameterConstraints] | None, sharder: ModuleSharder,
        *flags: bool, **named_flags: bool,
    ) -> list[ShardPerfContext]:  # fmt: skip
        """One context per shard size, reading the sharder live; ``flags``: the boolean arguments
        of :meth:`build_shard_perf_contexts_v2` (``is_inference``, ...), positional or named."""
        sharder_data = build_sharder_data(sharder)
        return cls.build_shard_perf_contexts_v2(
            config, shard_sizes, sharding_option, topology, constraints, sharder_data, *flags, **named_flags
        )

    @classmethod
    def build_shard_perf_contexts_v2(
        cls,
        config: HardwarePerfConfig,
        shard_sizes: list[list[int]],
        sharding_option: ShardingOption,
        topology: Topology,
        constraints: dict[str, ParameterConstraints] | None,
        sharder_data: SharderData,
        is_inference: bool = False,
        use_batch_inputs_for_expected_cache_fetches: bool = False,
        use_linear_regression_prefetch_estimate: bool = False,
    ) -> list[ShardPerfContext]:
        """One context per ``[rows, cols]`` of ``shard_sizes`` of ``sharding_option``.

        Raises:
            ValueError: the hardware does not support the option's sharding type, or the
                constraint's per-feature lists disagree in length with the option's features.
        """
        config.validate_sharding_type(str(sharding_option.sharding_type))
        option, name = sharding_option, sharding_option.name
        c = (constraints or {}).get(name)
        num_poolings = get_num_poolings(constraints, option)
        batch_sizes = list(c.batch_sizes) if c is not None and c.batch_sizes else [option.batch_size] * option.num_inputs
        if not len(option.input_lengths) == len(num_poolings) == len(batch_sizes):
            raise ValueError(
                f"table {name!r}: pooling factors ({len(option.input_lengths)}), num_poolings ({len(num_poolings)}) "
                f"and batch_sizes ({len(batch_sizes)}) must give one value per feature"
            )
        clf = option.cache_load_factor
        if clf is None and sharder_data.fused_params.get("cache_load_factor") is not None:
            clf = float(sharder_data.fused_params["cache_load_factor"])
        a2a_fwd, a2a_bwd, rs_fwd, rs_bwd = extract_comm_data_type_size_v2(option, sharder_data)
        prefetch = is_prefetch_pipelined_v2(option, sharder_data)
        element = float(option.tensor.element_size())
        output = config._default_output_data_type_size or element
        per_ms = 1.0 / _MS_PER_S
        hbm_bw, ddr_bw = float(topology.hbm_mem_bw or 0.0) * per_ms, float(topology.ddr_mem_bw or 0.0) * per_ms
        ssd_bw = float(topology.ssd_mem_bw or 0.0) * per_ms
        h2d = config.hbm_to_ddr_mem_bw or float(topology.hbm_to_ddr_mem_bw or 0.0) * per_ms
        device_bw = config.get_device_bw(str(topology.compute_device), str(option.compute_kernel),
                                         hbm_bw or config.hbm_mem_bw, ddr_bw or config.ddr_mem_bw,
                                         ssd_bw or config.ssd_mem_bw, h2d, clf, prefetch)  # fmt: skip
        stats = option.cache_params.stats if option.cache_params is not None else None
        miss = float(stats.expected_miss_rate(clf)) if stats is not None and clf is not None else None
        lookups = float(stats.expected_lookups) if stats is not None else None
        weighted = bool(c is not None and c.is_weighted)
        return [
            cls(
                sharding_type=str(option.sharding_type), compute_kernel=str(option.compute_kernel),
                hash_size=int(rows), emb_dim=int(cols), batch_sizes=[int(b) for b in batch_sizes],
                num_poolings=[float(p) for p in num_poolings], input_lengths=[float(x) for x in option.input_lengths],
                world_size=topology.world_size, local_world_size=topology.local_size,
                table_data_type_size=element, output_data_type_size=float(output),
                fwd_a2a_comm_data_type_size=a2a_fwd, bwd_a2a_comm_data_type_size=a2a_bwd,
                fwd_sr_comm_data_type_size=rs_fwd, bwd_sr_comm_data_type_size=rs_bwd,
                device_bw=device_bw, hbm_to_ddr_mem_bw=h2d,
                intra_host_bw=config.intra_host_bw or float(topology.intra_host_bw or 0.0) * per_ms,
                inter_host_bw=config.inter_host_bw or float(topology.inter_host_bw or 0.0) * per_ms,
                is_inference=is_inference, is_weighted=weighted, is_pooled=option.is_pooled,
                bwd_compute_multiplier=config.get_bwd_compute_multiplier(BWD_COMPUTE_MULTIPLIER),
                weighted_feature_bwd_compute_multiplier=config.get_weighted_feature_bwd_compute_multiplier(
                    WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER
                ),
                use_linear_regression_prefetch_estimate=use_linear_regression_prefetch_estimate,
                use_batch_inputs_for_expected_cache_fetches=use_batch_inputs_for_expected_cache_fetches,
                caching_ratio=clf, table_name=name, hash_size_for_clamping=int(option.tensor.shape[0]),
                cache_stats_expected_lookups=lookups, expected_miss_rate=miss,
            )
            for rows, cols in shard_sizes
        ]  # fmt: skip

    @property
    def batch_inputs(self) -> float:
        """Ids looked up per rank per step: sum over features of pooling factor x poolings x batch."""
        return sum(x * p * b for x, p, b in zip(self.input_lengths, self.num_poolings, self.batch_sizes))

    @property
    def batch_outputs(self) -> float:
        """Rows returned per rank per step: one per pooling (pooled) or per id (sequence)."""
        if self.is_pooled:
            return sum(p * b for p, b in zip(self.num_poolings, self.batch_sizes))
        return self.batch_inputs

