"""The planner's numbers, in one place: the defaults of a ``Topology`` per compute device, the
optimizer state each fused optimizer keeps (the storage model), the cost model's default batch
size, the narrowest column shard and the cache sizes a tiered option may take.

docs/planner.md explains each. The cost model's own byte sizes (ids, lengths, cache slots, SSD
pages) stay beside its formulas, in ``shard_estimators.py``.
"""

from __future__ import annotations

__all__ = [
    "CLF_CHOICES",
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
