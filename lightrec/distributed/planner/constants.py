"""The planner's numbers, in one place: the defaults of a ``Topology`` per compute device, the
optimizer state each fused optimizer keeps (the storage model), the cost model's default batch
size, the narrowest column shard and the cache sizes a tiered option may take.

docs/planner.md explains each. The cost model's own byte sizes (ids, lengths, cache slots, SSD
pages) stay beside its formulas, in ``shard_estimators.py``.

Below them, torchrec's constants under torchrec's names and in torchrec's units (bandwidths in
**bytes per millisecond**, sizes in bytes), for code that computes with them: torchrec's storage
formulas (``storage_formulas.py``), ``HardwarePerfConfig`` (``estimator/types.py``) and extensions
that import ``torchrec.distributed.planner.constants``. lightrec's own cost model reads
``DEVICE_DEFAULTS`` (bytes per second) and ignores them.
"""

from __future__ import annotations

from lightrec.distributed.planner.plan import EmbeddingComputeKernel
from lightrec.distributed.planner.plan.shard_layouts import MIN_CW_DIM

__all__ = [
    "BATCHED_COPY_PERF_FACTOR",
    "BATCH_SIZE",
    "BIGINT_DTYPE",
    "BWD_COMPUTE_MULTIPLIER",
    "CLF_CHOICES",
    "CROSS_NODE_BANDWIDTH",
    "DDR_CAP",
    "DDR_MEM_BW",
    "DP_ELEMENTWISE_KERNELS_PERF_FACTOR",
    "FULL_BLOCK_EMB_DIM",
    "GUARDED_COMPUTE_KERNELS",
    "HALF_BLOCK_PENALTY",
    "HBM_CAP",
    "HBM_MEM_BW",
    "HBM_TO_DDR_MEM_BW",
    "INTRA_NODE_BANDWIDTH",
    "KV_CACHING_RATIO",
    "MAX_SIZE",
    "MIN_CW_DIM",
    "NUM_POOLINGS",
    "POOLING_FACTOR",
    "QUARTER_BLOCK_PENALTY",
    "SSD_CAP",
    "SSD_MEM_BW",
    "UVM_CACHING_RATIO",
    "WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER",
    "WEIGHTED_KERNEL_MULTIPLIER",
    "kernel_bw_lookup",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MIN_PARTITION",
    "DEVICE_DEFAULTS",
    "GiB",
    "OPTIMIZER_STATE",
    "optimizer_name",
]

GiB = 1024**3

#: Topology defaults per compute device (``Topology`` fills its ``None`` fields from these).
# GPU numbers are those of a data-centre GPU of the A100/H100 class
# with NVLink inside a host and a 100 Gb/s NIC between hosts; CPU numbers are one core's share of
# DDR bandwidth and gloo over loopback TCP (inside a host) or 10 GbE (between hosts). SSD: a local
# NVMe drive's random-read bandwidth at queue depth (4 KiB pages), and 1 TiB of it per rank;
# host <-> GPU copies at PCIe 4.0 x16 speed.
DEVICE_DEFAULTS: dict[str, dict[str, float]] = {
    "cuda": {
        "hbm_cap": 32 * GiB,
        "ddr_cap": 128 * GiB,
        "hbm_mem_bw": 900e9,
        "ddr_mem_bw": 50e9,
        "intra_host_bw": 300e9,
        "inter_host_bw": 12.5e9,
        "kernel_overhead_s": 10e-6,
        "ssd_cap": 1024 * GiB,
        "ssd_mem_bw": 2e9,
        "hbm_to_ddr_mem_bw": 25e9,
    },
    "cpu": {
        "hbm_cap": 0,
        "ddr_cap": 128 * GiB,
        "hbm_mem_bw": 0.0,
        "ddr_mem_bw": 20e9,
        "intra_host_bw": 5e9,
        "inter_host_bw": 1.25e9,
        "kernel_overhead_s": 20e-6,
        "ssd_cap": 1024 * GiB,
        "ssd_mem_bw": 2e9,
        "hbm_to_ddr_mem_bw": 0.0,
    },
}

#: Optimizer state of the fused optimizer: (fp32 values per weight element, fp32 values per row).
OPTIMIZER_STATE: dict[str, tuple[float, float]] = {
    "sgd": (0.0, 0.0),
    "exact_sgd": (0.0, 0.0),
    "adagrad": (1.0, 0.0),
    "exact_adagrad": (1.0, 0.0),
    "rowwise_adagrad": (0.0, 1.0),
    "exact_rowwise_adagrad": (0.0, 1.0),
    "adam": (2.0, 0.0),
    "lamb": (2.0, 0.0),
    "partial_rowwise_adam": (1.0, 1.0),
    "partial_rowwise_lamb": (1.0, 1.0),
    "lars_sgd": (1.0, 0.0),
}


def optimizer_name(optimizer: object) -> str:
    """Canonical optimizer key: accepts ``"adam"``, ``"EXACT_ROWWISE_ADAGRAD"``,
    ``"row_wise_adagrad"`` or an enum member (its name or value)."""
    spellings = (
        [optimizer]
        if isinstance(optimizer, str)
        else [getattr(optimizer, "name", None), getattr(optimizer, "value", None), str(optimizer)]
    )
    for spelling in spellings:
        if isinstance(spelling, str):
            key = spelling.lower().replace("row_wise", "rowwise")
            if key in OPTIMIZER_STATE:
                return key
    raise ValueError(
        f"optimizer {optimizer!r} is unknown to the planner's storage model; use one of {sorted(OPTIMIZER_STATE)}"
    )

#: Per-rank batch size of the cost model when neither the planner nor its enumerator gives one.
DEFAULT_BATCH_SIZE = 512
#: Narrowest column shard of the column-wise types (or the table's dim, when narrower).
DEFAULT_MIN_PARTITION = 32
#: Cache load factors the planner tries for a tiered option (unless one is given).
CLF_CHOICES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
#: Compute kernels the planner uses only for tables whose ``ParameterConstraints.compute_kernels``
#: name them (torchrec's ``enumerators.GUARDED_COMPUTE_KERNELS``; extensions add theirs). torchrec
#: guards ``key_value``; lightrec plans it by itself when the tables do not fit in memory otherwise.
GUARDED_COMPUTE_KERNELS: set[str] = {EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value}


# ---- torchrec's constants (torchrec's names, values and units: bytes/ms for bandwidths) ---------
MAX_SIZE: int = (1 << 63) - 1
INTRA_NODE_BANDWIDTH: float = 600 * 1024**3 / 1000
CROSS_NODE_BANDWIDTH: float = 12.5 * 1024**3 / 1000
POOLING_FACTOR: float = 1.0
NUM_POOLINGS: float = 1.0
#: Bytes of an id on the wire (int64).
BIGINT_DTYPE: int = 8
HBM_CAP: int = 32 * GiB
DDR_CAP: int = 128 * GiB
SSD_CAP: int = 2 * 1024 * GiB
DDR_MEM_BW: float = 51 * 1024**3 / 1000
HBM_MEM_BW: float = 897 * 1024**3 / 1000
SSD_MEM_BW: float = 100 * 1024**2 / 1000
HBM_TO_DDR_MEM_BW: float = 32 * 1024**3 / 1000
#: Cache load factor of a tiered table when nothing else gives one (torchrec's default).
UVM_CACHING_RATIO: float = 0.2
KV_CACHING_RATIO: float = 0.2
BATCH_SIZE: int = DEFAULT_BATCH_SIZE
BATCHED_COPY_PERF_FACTOR: float = 2.455
FULL_BLOCK_EMB_DIM: int = 128
HALF_BLOCK_PENALTY: float = 1.15
QUARTER_BLOCK_PENALTY: float = 1.75
BWD_COMPUTE_MULTIPLIER: float = 2
WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER: float = 1
WEIGHTED_KERNEL_MULTIPLIER: float = 1.1
DP_ELEMENTWISE_KERNELS_PERF_FACTOR: float = 9.22


def kernel_bw_lookup(
    compute_device: str, compute_kernel: str, hbm_mem_bw: float, ddr_mem_bw: float, hbm_to_ddr_mem_bw: float,
    caching_ratio: float | None = None, prefetch_pipeline: bool = False, ssd_mem_bw: float = SSD_MEM_BW,
) -> float | None:  # fmt: skip
    """The memory bandwidth a lookup kernel sees on a device (torchrec's rule; None: no such pair).

    A dense (autograd) lookup gets half the bandwidth of the fused one; a ``fused_uvm_caching``
    table ``caching_ratio`` of device bandwidth and the rest of host-to-device bandwidth, divided
    by 10 for the cache's bookkeeping (the fused bandwidth when ``prefetch_pipeline`` hides it);
    a ``key_value`` table the SSD's bandwidth.
    """
    ratio = caching_ratio if caching_ratio is not None else UVM_CACHING_RATIO
    fused, dense, quant = (EmbeddingComputeKernel.FUSED.value, EmbeddingComputeKernel.DENSE.value,
                           EmbeddingComputeKernel.QUANT.value)  # fmt: skip
    caching, key_value = EmbeddingComputeKernel.FUSED_UVM_CACHING.value, EmbeddingComputeKernel.KEY_VALUE.value
    table: dict[tuple[str, str], float] = {
        ("cpu", dense): 0.5 * ddr_mem_bw,
        ("cpu", fused): ddr_mem_bw,
        ("cpu", quant): ddr_mem_bw,
        ("mtia", dense): 0.5 * hbm_mem_bw,
        ("mtia", fused): hbm_mem_bw,
        ("mtia", quant): hbm_mem_bw,
        ("cuda", dense): 0.5 * hbm_mem_bw,
        ("cuda", fused): hbm_mem_bw,
        ("cuda", caching): (ratio * hbm_mem_bw + (1 - ratio) * hbm_to_ddr_mem_bw) / 10,
        ("cuda", quant): hbm_mem_bw,
        ("cuda", key_value): ssd_mem_bw,
    }
    if prefetch_pipeline and compute_device == "cuda" and compute_kernel == caching:
        return table[("cuda", fused)]
    return table.get((compute_device, compute_kernel))
