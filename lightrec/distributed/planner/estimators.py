"""Storage and performance estimators, vectorised over shards.

Every formula is written once here and documented in docs/planner.md. Inputs are numpy arrays
with one entry per shard (table index, sharding type code, kernel code, shard rows, shard cols);
outputs are bytes of the table memory (HBM on cuda, DDR on cpu) and seconds per training step on
the rank that holds the shard. Symbols (per table):

=====  ==================================================================
W, L   world size, ranks per host
N      ids looked up per rank per step (sum over features of batch x pooling factor)
Bf     bags per rank per step (sum over features of batch)
E      bytes per weight element (4 for FP32, 2 for FP16/BF16, 1 INT8 ...)
r, c   rows and columns of the shard; R the table's rows
=====  ==================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrec.distributed.planner.plan import EmbeddingComputeKernel, ShardingType
from lightrec.distributed.planner.types import Topology

__all__ = ["KERNELS", "SHARDING_TYPES", "TableArrays", "estimate_shards"]

# Integer codes used in the numpy arrays; the order of SHARDING_TYPES is also the tie-break order
# of equally cheap options (table-wise first: the simplest plan wins ties).
SHARDING_TYPES: list[str] = [
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
    ShardingType.DATA_PARALLEL.value,
]
TW, CW, RW, TWRW, TWCW, DP = range(6)
KERNELS: list[str] = [
    k.value
    for k in (EmbeddingComputeKernel.FUSED, EmbeddingComputeKernel.DENSE, EmbeddingComputeKernel.QUANT)
]
FUSED, DENSE, QUANT = range(3)

ID_BYTES = 8  # int64 ids on the wire and in the lookup input
LENGTH_BYTES = 4  # int32 lengths
GRAD_BYTES = 4  # activations, gradients and optimizer state are fp32


@dataclass
class TableArrays:
    """Per-table planner inputs as parallel arrays (index = table position in ``keys``).

    Attributes:
        keys: ``(module path, table name)`` per table.
        rows, cols: table shape ``[R, D]``.
        elem_bytes: bytes per weight element (E).
        row_overhead: extra bytes per row under the quant kernel (INT scale + bias).
        ids, bags: N and Bf above (per rank per step).
        pooled: whether lookups are pooled (EmbeddingBag) or return one row per id.
        opt_elem, opt_row: fp32 optimizer values per weight element / per row.
        allowed: per table, ``[(sharding type code, [kernel codes])]`` in preference order.
        min_partition: narrowest column shard per table.
        row_state: bytes per row of other per-row state (a managed-collision id map and its
            eviction metadata), or None for none.
    """

    keys: list[tuple[str, str]]
    rows: np.ndarray
    cols: np.ndarray
    elem_bytes: np.ndarray
    row_overhead: np.ndarray
    ids: np.ndarray
    bags: np.ndarray
    pooled: np.ndarray
    opt_elem: np.ndarray
    opt_row: np.ndarray
    allowed: list[list[tuple[int, list[int]]]]
    min_partition: np.ndarray
    row_state: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.keys)


def estimate_shards(
    t: TableArrays,
    topo: Topology,
    table: np.ndarray,
    stype: np.ndarray,
    kernel: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Storage (bytes) and cost (seconds per step) of each shard.

    Args:
        t: the tables.
        topo: the cluster.
        table, stype, kernel: ``[S]`` int arrays (table index, sharding type code, kernel code).
        rows, cols: ``[S]`` shard shape; a data-parallel entry stands for one replica.

    Returns:
        ``(storage [S], cost [S])`` float64 arrays.
    """
    W = float(topo.world_size)
    L = float(topo.local_size)
    rows = rows.astype(np.float64)
    cols = cols.astype(np.float64)
    R = t.rows[table].astype(np.float64)
    N = t.ids[table]
    Bf = t.bags[table]
    E = t.elem_bytes[table]
    is_dp = stype == DP
    row_split = (stype == RW) | (stype == TWRW)
    training = kernel != QUANT

    # Ids this shard looks up per step: data parallel serves its local batch; the other types
    # serve the global batch (W * N ids), row-split ones only the ids that fall in their rows.
    frac = np.where(row_split, rows / np.maximum(R, 1.0), 1.0)
    looked_up = np.where(is_dp, N, W * N * frac)
    bags_in = np.where(is_dp, 0.0, W * Bf)
    ids_in = np.where(is_dp, 0.0, looked_up)
    # Output rows produced: one per bag (pooled; row-wise shards emit partial sums for every bag)
    # or one per id (unpooled).
    out_rows = np.where(t.pooled[table], np.where(is_dp, Bf, W * Bf), looked_up)
    out_elems = out_rows * cols

    # ---- storage -------------------------------------------------------------------------
    weights = rows * cols * E + np.where(kernel == QUANT, rows * t.row_overhead[table], 0.0)
    if t.row_state is not None:
        weights = weights + rows * t.row_state[table]  # e.g. the id map of a managed-collision table
    opt_state = np.where(
        training, GRAD_BYTES * (rows * cols * t.opt_elem[table] + rows * t.opt_row[table]), 0.0
    )
    dense_grad = np.where(kernel == DENSE, rows * cols * GRAD_BYTES, 0.0)
    passes = np.where(training, 2.0, 1.0)  # forward output, plus its gradient when training
    buffers = ids_in * ID_BYTES + bags_in * LENGTH_BYTES + out_elems * GRAD_BYTES * passes
    buffers = np.where(is_dp, N * ID_BYTES + Bf * LENGTH_BYTES + out_elems * GRAD_BYTES * passes, buffers)
    storage = weights + opt_state + dense_grad + buffers

    # ---- cost: lookup kernels ------------------------------------------------------------
    bw_m = topo.device_mem_bw
    fwd = (looked_up * cols * E + out_elems * GRAD_BYTES) / bw_m
    # fused: read the output gradient, read-modify-write every touched row and its optimizer state.
    bwd_fused = (
        out_elems * GRAD_BYTES
        + looked_up * cols * (2 * E + 2 * GRAD_BYTES * t.opt_elem[table])
        + looked_up * 2 * GRAD_BYTES * t.opt_row[table]
    ) / bw_m
    # dense: scatter into a dense gradient, then an optimizer step that sweeps the whole shard
    # (read+write weights and state, read and zero the gradient).
    bwd_dense = (
        out_elems * GRAD_BYTES
        + looked_up * cols * GRAD_BYTES
        + rows * cols * (2 * E + 2 * GRAD_BYTES + 2 * GRAD_BYTES * t.opt_elem[table])
        + rows * 2 * GRAD_BYTES * t.opt_row[table]
    ) / bw_m
    bwd = np.select([kernel == FUSED, kernel == DENSE], [bwd_fused, bwd_dense], 0.0)

    # ---- cost: communication -------------------------------------------------------------
    off_rank = (W - 1.0) / W  # share of the traffic that leaves the rank
    bw_c = topo.comm_bw
    input_dist = (ids_in * ID_BYTES + bags_in * LENGTH_BYTES) * off_rank / bw_c
    output_dist = out_elems * GRAD_BYTES * passes * off_rank / bw_c
    if topo.num_hosts > 1:
        # table-row-wise: reduce-scatter inside the host, then 1/L of the output crosses hosts.
        twrw_out = (
            out_elems
            * GRAD_BYTES
            * passes
            * (
                (L - 1.0) / L / float(topo.intra_host_bw or 0.0)
                + (W - L) / W / L / float(topo.inter_host_bw or 0.0)
            )
        )
        output_dist = np.where(stype == TWRW, twrw_out, output_dist)
    # data parallel: ring all-reduce of the dense gradient of the whole table every step.
    allreduce = np.where(training, 2.0 * off_rank * rows * cols * GRAD_BYTES / bw_c, 0.0)
    comm = np.where(is_dp, allreduce, input_dist + output_dist)

    cost = fwd + bwd + comm + float(topo.kernel_overhead_s or 0.0)
    return storage, cost
