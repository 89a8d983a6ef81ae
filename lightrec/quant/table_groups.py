"""Lookups of a run of quantized tables that pool the same way, reading one flat byte buffer.

A ``QuantEmbeddingBagCollection`` keeps all its tables back to back in one ``uint8`` buffer; each
table's ``embedding_bags.<t>.weight`` is a view of its part::

    flat  | table 0: rows_0 x row_bytes_0 | table 1: rows_1 x row_bytes_1 | ...
            ^ byte offset 0                 ^ byte offset rows_0 * row_bytes_0 (a multiple of row_alignment)

The tables are cut into *groups*: maximal runs of consecutive tables with the same pooling (SUM
or MEAN). A group's lookup reads the collection's bounds-checked ids (key-major, features in the
collection's order, so a group's ids are one contiguous run; ``value_offsets[t]`` is where table
``t``'s ids start) and returns its features' pooled blocks side by side, ``[B, sum D]``:

* :class:`FbgemmTableGroup`: **one** fbgemm IntN call for the whole group -- every feature is a
  TBE "table" pointing at its table's byte offset -- so a 26-table collection costs one kernel
  launch and no concatenation of per-table outputs;
* :class:`TritonTableGroup`: the same single launch on lightrec's Triton dequantize-and-pool
  kernel (:mod:`lightrec.quant.triton_lookup`), for CUDA without an fbgemm wheel;
* :class:`TorchTableGroup`: the pure-torch kernel table by table on views of the flat buffer
  (bit-identical results, see :mod:`lightrec.quant.pooled_kernels`).

:func:`check_ids_by_table` is the id check these lookups rely on (fbgemm's kernel would read any
row it is given): one ``aminmax`` per run of equal-sized tables and one host sync.
"""

# No `from __future__ import annotations`: these modules are fx-traced and scripted.

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import nn

from lightrec.modules.feature_checks import check_ids
from lightrec.quant.pooled_kernels import grouped_lookup_fbgemm, pooled_lookup_torch
from lightrec.quant.triton_lookup import alignment_hint, feature_meta
from lightrec.sparse._ops import complete_cumsum

__all__ = ["FbgemmTableGroup", "StoredTableLayout", "TorchTableGroup", "TritonTableGroup", "check_ids_by_table",
           "equal_rows_runs", "make_table_groups"]

# torch.fx.wrap patches the calling module's globals: the kernels are called from this module, so
# they are wrapped here (one graph node each; their bodies hold data-dependent loops / fbgemm calls).
torch.fx.wrap("pooled_lookup_torch")
torch.fx.wrap("grouped_lookup_fbgemm")


def grouped_lookup_triton(flat: torch.Tensor, meta: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor,
                          per_sample_weights: Optional[torch.Tensor], total_d: int, max_d: int, vec: int,
                          row_align: int, mean: bool) -> torch.Tensor:
    """The Triton custom op (``lightrec::triton_quant_pooled_lookup``) over a group of features."""
    return torch.ops.lightrec.triton_quant_pooled_lookup(flat, meta, ids, offsets, per_sample_weights, total_d,
                                                          max_d, vec, row_align, mean)


torch.fx.wrap("grouped_lookup_triton")


@dataclass(frozen=True)
class StoredTableLayout:
    """Where one stored table lies in a collection's flat buffer and how to decode it.

    Plain Python, read when the groups are built (never scripted).

    Attributes:
        byte_offset: of its first row in the flat buffer.
        rows, row_bytes: its ``rows`` x ``row_bytes`` stored bytes.
        dim: the decoded width.
        type_code: fbgemm's storage type (1 fp16, 2 int8, 3 int4).
        num_features: how many features read it.
        mean: whether it pools with MEAN.
    """

    byte_offset: int
    rows: int
    row_bytes: int
    dim: int
    type_code: int
    num_features: int
    mean: bool


class _OneCallGroup(nn.Module):
    """Tables ``[first, last)`` of a collection whose features are looked up together (one call)."""

    def __init__(self, first: int, feature_first: int, tables: List[StoredTableLayout]) -> None:
        super().__init__()
        self._first = first
        self._last = first + len(tables)
        self._feature_first = feature_first
        self._feature_last = feature_first + sum(t.num_features for t in tables)

    def _group_inputs(self, values: torch.Tensor, lengths: torch.Tensor, weights: Optional[torch.Tensor],
                      value_offsets: List[int], stride: int
                      ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """The group's ids, lengths and weights: contiguous runs of the collection's (no copy)."""
        start, end = value_offsets[self._first], value_offsets[self._last]
        group_weights: Optional[torch.Tensor] = None
        if weights is not None:
            group_weights = weights[start:end]
        return values[start:end], lengths[self._feature_first * stride : self._feature_last * stride], group_weights


class FbgemmTableGroup(_OneCallGroup):
    """Tables ``[first, last)`` of a collection, looked up with one fbgemm IntN call.

    Buffers (non-persistent, rebuilt from the table configs by :meth:`reset_constants`):
    ``weights_offsets`` ``[F]`` int64 (byte offset of each feature's table), ``weights_tys`` ``[F]``
    uint8 (type codes), ``d_offsets`` ``[F + 1]`` int32 (output column offsets).
    """

    weights_offsets: torch.Tensor
    weights_tys: torch.Tensor
    d_offsets: torch.Tensor

    def __init__(self, first: int, feature_first: int, tables: List[StoredTableLayout], row_alignment: int,
                 device: Optional[torch.device] = None) -> None:
        super().__init__(first, feature_first, tables)
        offsets: List[int] = []
        tys: List[int] = []
        dims: List[int] = []
        for t in tables:
            offsets += [t.byte_offset] * t.num_features
            tys += [t.type_code] * t.num_features
            dims += [t.dim] * t.num_features
        d_offsets = [0]
        for d in dims:
            d_offsets.append(d_offsets[-1] + d)
        self._constants = (offsets, tys, d_offsets)
        self.reset_constants(device)
        self._total_d = d_offsets[-1]
        self._max_int4_d = max([d for d, ty in zip(dims, tys) if ty == 3] + [0])
        self._max_int8_d = max([d for d, ty in zip(dims, tys) if ty == 2] + [0])
        self._max_fp16_d = max([d for d, ty in zip(dims, tys) if ty == 1] + [0])
        self._pooling_mode = 1 if tables[0].mean else 0  # fbgemm's PoolingMode: MEAN or SUM
        self._row_alignment = row_alignment
        # fbgemm's CPU kernel is ~10% faster on int32 ids and offsets; ids fit when every table has
        # < 2**31 rows (and a batch has < 2**31 ids).
        self._int32_indices = all(t.rows < 2**31 for t in tables)

    @torch.jit.unused
    def reset_constants(self, device: Optional[torch.device]) -> None:
        """(Re)build the constant buffers on ``device``. The owning collection calls this after every
        ``.to()`` / ``to_empty()``: a wrong offset here would make the kernel read out of bounds."""
        offsets, tys, d_offsets = self._constants
        self.register_buffer("weights_offsets", torch.tensor(offsets, dtype=torch.int64, device=device),
                             persistent=False)
        self.register_buffer("weights_tys", torch.tensor(tys, dtype=torch.uint8, device=device), persistent=False)
        self.register_buffer("d_offsets", torch.tensor(d_offsets, dtype=torch.int32, device=device),
                             persistent=False)

    def forward(self, flat: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                weights: Optional[torch.Tensor], value_offsets: List[int], stride: int) -> torch.Tensor:
        """Pool the group's features: its ids are one contiguous run of ``values`` (no copy)."""
        ids, group_lengths, group_weights = self._group_inputs(values, lengths, weights, value_offsets, stride)
        if self._int32_indices:
            group_lengths = group_lengths.to(torch.int32)
        offsets = complete_cumsum(group_lengths)
        return grouped_lookup_fbgemm(
            flat, self.weights_offsets, self.weights_tys, self.d_offsets, self._total_d, self._max_int4_d,
            self._max_int8_d, self._max_fp16_d, ids, offsets, group_weights, self._pooling_mode, self._row_alignment,
        )  # fmt: skip


class TritonTableGroup(_OneCallGroup):
    """Tables ``[first, last)`` of a collection, looked up with one launch of the Triton kernel.

    Buffer (non-persistent, rebuilt by :meth:`reset_constants`): ``meta`` ``[F, 6]`` int64 (see
    :func:`lightrec.quant.triton_lookup.feature_meta`).
    """

    meta: torch.Tensor

    def __init__(self, first: int, feature_first: int, tables: List[StoredTableLayout],
                 device: Optional[torch.device] = None) -> None:
        super().__init__(first, feature_first, tables)
        self._columns = [[t.byte_offset, t.row_bytes, t.type_code, t.dim, t.rows]
                         for t in tables for _ in range(t.num_features)]
        self.reset_constants(device)
        self._total_d = sum(c[3] for c in self._columns)
        self._max_d = max(c[3] for c in self._columns)
        self._vec = min(alignment_hint(c[3], 4) for c in self._columns)
        self._row_align = min(min(alignment_hint(c[0], 16), alignment_hint(c[1], 16)) for c in self._columns)
        self._mean = tables[0].mean

    @torch.jit.unused
    def reset_constants(self, device: Optional[torch.device]) -> None:
        """(Re)build ``meta`` on ``device`` (the owning collection calls this after ``.to()``)."""
        c = self._columns
        self.register_buffer("meta", feature_meta([x[0] for x in c], [x[1] for x in c], [x[2] for x in c],
                                                  [x[3] for x in c], [x[4] for x in c], device), persistent=False)

    def forward(self, flat: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                weights: Optional[torch.Tensor], value_offsets: List[int], stride: int) -> torch.Tensor:
        ids, group_lengths, group_weights = self._group_inputs(values, lengths, weights, value_offsets, stride)
        return grouped_lookup_triton(flat, self.meta, ids, complete_cumsum(group_lengths), group_weights,
                                     self._total_d, self._max_d, self._vec, self._row_align, self._mean)


class TorchTableGroup(nn.Module):
    """Tables ``[first, last)`` of a collection, looked up table by table in pure torch."""

    def __init__(self, first: int, feature_first: int, tables: List[StoredTableLayout]) -> None:
        super().__init__()
        self._first = first
        self._feature_starts: List[int] = [feature_first]
        for t in tables:
            self._feature_starts.append(self._feature_starts[-1] + t.num_features)
        self._byte_offsets: List[int] = [t.byte_offset for t in tables]
        self._rows: List[int] = [t.rows for t in tables]
        self._row_bytes: List[int] = [t.row_bytes for t in tables]
        self._dims: List[int] = [t.dim for t in tables]
        self._types: List[int] = [t.type_code for t in tables]
        self._num_features: List[int] = [t.num_features for t in tables]
        self._mean = tables[0].mean

    def forward(self, flat: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                weights: Optional[torch.Tensor], value_offsets: List[int], stride: int) -> torch.Tensor:
        pooled: List[torch.Tensor] = []
        for i in range(len(self._rows)):
            start, end = value_offsets[self._first + i], value_offsets[self._first + i + 1]
            table_weights: Optional[torch.Tensor] = None
            if weights is not None:
                table_weights = weights[start:end]
            table_lengths = lengths[self._feature_starts[i] * stride : self._feature_starts[i + 1] * stride]
            byte_start = self._byte_offsets[i]
            size = self._rows[i] * self._row_bytes[i]
            table = flat[byte_start : byte_start + size].view(self._rows[i], self._row_bytes[i])
            pooled.append(pooled_lookup_torch(table, self._types[i], self._dims[i], self._num_features[i],
                                              values[start:end], complete_cumsum(table_lengths), table_weights,
                                              self._mean))
        return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)


def equal_rows_runs(table_rows: List[int]) -> List[int]:
    """Start of every maximal run of consecutive tables with the same row count, then ``T``."""
    runs = [0]
    for t in range(1, len(table_rows)):
        if table_rows[t] != table_rows[t - 1]:
            runs.append(t)
    return runs + [len(table_rows)]


def check_ids_by_table(
    values: torch.Tensor,
    lengths: torch.Tensor,
    value_offsets: List[int],
    feature_offsets: List[int],
    table_rows: List[int],
    table_names: List[str],
    table_features: List[List[str]],
    stride: int,
    runs: List[int],
) -> torch.Tensor:
    """Raise ``EmbeddingIdError`` (the message of ``check_ids``) if an id is outside its table.

    Ids are in range iff, for every run of consecutive tables with the same row count (``runs``,
    from :func:`equal_rows_runs`), the min of the run's ids is >= 0 and the max < rows: one
    ``aminmax`` per run and one host sync for the whole collection, instead of a masked comparison
    and a sync per table (26 equal tables: one ``aminmax``).

    Args:
        values / lengths: the collection's ids and lengths (key-major, in its feature order).
        value_offsets: ``[T + 1]`` start of each table's ids in ``values``.
        feature_offsets: ``[T + 1]`` index of each table's first feature.

    Returns:
        ``values`` unchanged (so the check is a node that the lookups depend on).
    """
    compiling = False
    if not torch.jit.is_scripting():
        compiling = torch.compiler.is_compiling()
    if not compiling:  # (table sizes are data-dependent under torch.export: no branching on them there)
        extremes: List[torch.Tensor] = []
        limits: List[int] = []
        for r in range(len(runs) - 1):
            start, end = value_offsets[runs[r]], value_offsets[runs[r + 1]]
            if end > start:
                low, high = torch.aminmax(values[start:end])
                extremes += [low, high]
                limits.append(table_rows[runs[r]])
        if len(extremes) == 0:
            return values
        found: List[int] = torch.stack(extremes).tolist()  # the one host sync
        ok = True
        for r in range(len(limits)):
            ok = ok and found[2 * r] >= 0 and found[2 * r + 1] < limits[r]
        if ok:
            return values
    # a bad id (or compiling): check_ids per table raises naming feature and sample (asserts on the
    # device when compiling)
    for t in range(len(table_rows)):
        check_ids(values[value_offsets[t] : value_offsets[t + 1]],
                  lengths[feature_offsets[t] * stride : feature_offsets[t + 1] * stride],
                  table_rows[t], table_names[t], table_features[t], stride)
    return values


def make_table_groups(tables: List[StoredTableLayout], kernel: str, row_alignment: int,
                      device: Optional[torch.device] = None) -> nn.ModuleList:
    """One group per maximal run of consecutive tables with the same pooling, in table order
    (so the groups' outputs, concatenated, are in the collection's feature order).

    ``kernel``: ``"fbgemm"``, ``"triton"`` or ``"torch"`` (see ``resolve_quant_kernel``)."""
    groups = nn.ModuleList()
    first = 0
    feature_first = 0
    while first < len(tables):
        last = first + 1
        while last < len(tables) and tables[last].mean == tables[first].mean:
            last += 1
        run = tables[first:last]
        if kernel == "fbgemm":
            groups.append(FbgemmTableGroup(first, feature_first, run, row_alignment, device))
        elif kernel == "triton":
            groups.append(TritonTableGroup(first, feature_first, run, device))
        else:
            groups.append(TorchTableGroup(first, feature_first, run))
        feature_first += sum(t.num_features for t in run)
        first = last
    return groups


TableSpec = StoredTableLayout
"""The name ``StoredTableLayout`` had before 0.1 (``lightrec.inference.table_groups.TableSpec``)."""
