"""Inference sharding: spread a quantized model's tables over several devices (or host memory).

Serving has no training process group: one process owns every table, possibly on several local
devices when they do not fit on one. :func:`shard_for_inference` replaces every
``QuantEmbeddingBagCollection`` by a ``ShardedQuantEmbeddingBagCollection`` that splits the tables
table-wise into groups, one group per (device, pooling) pair, and serves each group with one
batched kernel: fbgemm's ``IntNBitTableBatchedEmbeddingBagsCodegen`` (all tables of the group in
one buffer) when fbgemm imports, or the pure-torch quantized collection otherwise::

    KJT (any key order) --permute to group order--> split per group --.to(group device)-->
      group lookup [B, sum D_g] --.to(output device)--> cat --reorder columns--> KeyedTensor [B, sum D]

The output is bitwise identical to the unsharded quantized collection's (every feature is pooled
by the same kernel arithmetic). ``shard_modules`` is the TorchRec tutorial's ``_shard_modules`` call shape.
"""

# No `from __future__ import annotations`: fx copies forward() annotations into traced code.

import copy
from typing import List, Optional, Tuple

import torch
from torch import nn

from lightrec._compat import is_fx_symbolic_tracing as is_fx_tracing
from lightrec._fbgemm import fbgemm_available
from lightrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
from lightrec.modules.embedding_modules import table_lists
from lightrec.modules.feature_checks import check_collection_input
from lightrec.modules.kernel_backend import resolve_kernel_backend
from lightrec.quant.embedding_modules import QuantEmbeddingBagCollection
from lightrec.quant.row_codec import SCALE_BIAS_BYTES
from lightrec.quant.table_groups import check_ids_by_table, equal_rows_runs
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = [
    "ShardedQuantEmbeddingBagCollection",
    "TableGroupLookup",
    "TbeGroupLookup",
    "assign_tables_by_size",
    "inference_devices",
    "shard_for_inference",
    "shard_modules",
]

PLACEMENTS = ("device", "host")

# the id check is data-dependent; record it as one fx node here too (fx.wrap patches per module).
torch.fx.wrap("check_ids_by_table")


class TableGroupLookup(nn.Module):
    """One group's tables served by a ``QuantEmbeddingBagCollection`` (pure torch or fbgemm op)."""

    def __init__(self, qebc: QuantEmbeddingBagCollection) -> None:
        super().__init__()
        self.qebc = qebc

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.qebc(features).values()


class TbeGroupLookup(nn.Module):
    """One group's tables in one fbgemm ``IntNBitTableBatchedEmbeddingBagsCodegen`` (one kernel call).

    Ids are checked against each table's rows first (fbgemm's own check would silently replace
    bad ids by 0), with lightrec's error message.
    """

    def __init__(self, tables: List[EmbeddingBagConfig], stored: List[torch.Tensor], row_alignment: int,
                 device: torch.device, placement: str, is_weighted: bool) -> None:
        super().__init__()
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            BoundsCheckMode,
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
            IntNBitTableBatchedEmbeddingBagsCodegen,
        )

        sparse_types = {DataType.INT8: SparseType.INT8, DataType.INT4: SparseType.INT4, DataType.FP16: SparseType.FP16}
        if device.type == "cpu":
            location = EmbeddingLocation.HOST
        else:
            location = EmbeddingLocation.MANAGED if placement == "host" else EmbeddingLocation.DEVICE
        feature_table_map = [i for i, t in enumerate(tables) for _ in t.feature_names]
        self.tbe = IntNBitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(t.name, t.num_embeddings, t.embedding_dim, sparse_types[t.data_type], location)
                             for t in tables],
            feature_table_map=feature_table_map,
            pooling_mode=PoolingMode.MEAN if tables[0].pooling == PoolingType.MEAN else PoolingMode.SUM,
            device=device,
            bounds_check_mode=BoundsCheckMode.NONE,
            output_dtype=SparseType.FP32,
            row_alignment=row_alignment,
        )
        self.tbe.initialize_weights()
        assigned: List[Tuple[torch.Tensor, Optional[torch.Tensor]]] = []  # (rows, scale/bias | None)
        for t, rows in zip(tables, stored):
            if t.data_type == DataType.FP16:
                assigned.append((rows[:, : 2 * t.embedding_dim], None))
            else:
                width = t.embedding_dim if t.data_type == DataType.INT8 else t.embedding_dim // 2
                assigned.append((rows[:, SCALE_BIAS_BYTES : SCALE_BIAS_BYTES + width], rows[:, :SCALE_BIAS_BYTES]))
        self.tbe.assign_embedding_weights(assigned)
        self._is_weighted = is_weighted
        self._table_names, self._table_features, self._table_rows, _ = table_lists(tables)
        self._equal_rows_runs: List[int] = equal_rows_runs(self._table_rows)
        self._feature_offsets: List[int] = [0]  # [T + 1] index of each table's first feature
        for t in tables:
            self._feature_offsets.append(self._feature_offsets[-1] + len(t.feature_names))

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        values = features.values()
        lengths = features.lengths()
        stride = features.stride()
        offset_per_key = features.offset_per_key()
        value_offsets: List[int] = [offset_per_key[f] for f in self._feature_offsets]
        values = check_ids_by_table(values, lengths, value_offsets, self._feature_offsets, self._table_rows,
                                    self._table_names, self._table_features, stride, self._equal_rows_runs)
        offsets = features.offsets()
        weights: Optional[torch.Tensor] = None
        if self._is_weighted:
            weights = features.weights().float()
        return self.tbe(values.to(offsets.dtype), offsets, weights)


class ShardedQuantEmbeddingBagCollection(nn.Module):
    """A ``QuantEmbeddingBagCollection`` split table-wise over devices; same inputs and outputs.

    Args:
        qebc: the collection to shard (its stored tables are copied into the group kernels).
        devices: the devices groups may use; ``assignment[i]`` indexes this list.
        assignment: device index per table (in ``qebc.embedding_bag_configs()`` order).
        output_device: where the pooled output is gathered (default: ``devices[0]``).
        placement: ``"device"`` keeps tables in the device's memory; ``"host"`` keeps them in host
            memory (UVM on CUDA; the same thing on CPU).
        kernel_backend: ``"fbgemm"`` (fbgemm TBE groups; for ``bounds_check`` ``"clamp"``/``"skip"``,
            groups of ``QuantEmbeddingBagCollection`` on fbgemm's op, which apply it), ``"torch"`` or
            ``"triton"`` (groups of ``QuantEmbeddingBagCollection`` with that kernel), or ``"auto"``:
            fbgemm when it imports and the tables check bounds with ``"error"``, else torch.
        use_fbgemm: the deprecated spelling (True: ``"fbgemm"``, False: ``"torch"``).
    """

    _output_columns: torch.Tensor  # [total D] group column of each output column (buffer; used to reorder)

    def __init__(self, qebc: QuantEmbeddingBagCollection, devices: List[torch.device], assignment: List[int],
                 output_device: Optional[torch.device] = None, placement: str = "device",
                 kernel_backend: str = "auto", use_fbgemm: Optional[bool] = None) -> None:
        super().__init__()
        configs = qebc.embedding_bag_configs()
        kernel_backend = resolve_kernel_backend(kernel_backend, "ShardedQuantEmbeddingBagCollection",
                                                use_fbgemm=use_fbgemm)
        if kernel_backend == "auto":
            kernel_backend = "fbgemm" if fbgemm_available() and qebc._bounds_check == "error" else "torch"
        keys: list[tuple[int, bool]] = []
        for i, t in enumerate(configs):
            key = (assignment[i], t.pooling == PoolingType.MEAN)
            if key not in keys:
                keys.append(key)
        self.lookups = nn.ModuleList()
        self._feature_order: List[str] = []
        self._group_num_features: List[int] = []
        self._group_devices: List[str] = []
        for device_index, _mean in keys:
            device = devices[device_index]
            members = [t for i, t in enumerate(configs) if (assignment[i], t.pooling == PoolingType.MEAN) == (device_index, _mean)]
            stored = [qebc._stored_tables()[t.name].weight.to(device) for t in members]
            if kernel_backend == "fbgemm" and qebc._bounds_check == "error":
                lookup: nn.Module = TbeGroupLookup(members, stored, qebc._row_alignment, device, placement,
                                                   qebc.is_weighted())
            else:  # torch / triton; fbgemm too for "clamp" / "skip", which the TBE module would not apply
                group = QuantEmbeddingBagCollection(
                    members, is_weighted=qebc.is_weighted(), device=device, dtype=members[0].data_type,
                    per_table={t.name: t.data_type for t in members}, row_alignment=qebc._row_alignment,
                    bounds_check=qebc._bounds_check, kernel_backend=kernel_backend,
                )
                for t, rows in zip(members, stored):
                    group._stored_tables()[t.name].weight.copy_(rows)
                lookup = TableGroupLookup(group)
            self.lookups.append(lookup)
            self._feature_order.extend(f for t in members for f in t.feature_names)
            self._group_num_features.append(sum(len(t.feature_names) for t in members))
            self._group_devices.append(str(device))
        self._embedding_bag_configs = list(configs)
        self._is_weighted = qebc.is_weighted()
        self._embedding_names: List[str] = qebc.feature_names()
        self._lengths_per_embedding: List[int] = [t.embedding_dim for t in configs for _ in t.feature_names]
        self._output_device: str = str(output_device if output_device is not None else devices[0])
        self._placement = placement
        # column order of the concatenated group outputs -> the unsharded collection's order
        dims = dict(zip(self._embedding_names, self._lengths_per_embedding))
        starts: dict[str, int] = {}
        col = 0
        for f in self._feature_order:
            starts[f] = col
            col += dims[f]
        columns = [starts[f] + j for f in self._embedding_names for j in range(dims[f])]
        self._reorder: bool = columns != list(range(col))
        self.register_buffer("_output_columns", torch.tensor(columns, dtype=torch.int64,
                                                             device=torch.device(self._output_device)),
                             persistent=False)

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._embedding_bag_configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    def feature_names(self) -> list[str]:
        return list(self._embedding_names)

    def group_devices(self) -> list[str]:
        """Device of each group, in ``lookups`` order."""
        return list(self._group_devices)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Same contract as ``QuantEmbeddingBagCollection.forward``."""
        if not torch.jit.is_scripting():
            if not is_fx_tracing():
                check_collection_input(features, self._embedding_names, "ShardedQuantEmbeddingBagCollection",
                                       weighted=self._is_weighted)
                if self._is_weighted and features.weights_or_none() is None:
                    raise ValueError(
                        "ShardedQuantEmbeddingBagCollection(is_weighted=True) needs per-id weights, but the "
                        "KeyedJaggedTensor has weights=None; pass weights=... or shard an unweighted collection"
                    )
        features = features.permute_to_keys(self._feature_order)
        parts = features.split(self._group_num_features)
        pooled: List[torch.Tensor] = []
        g = 0
        for lookup in self.lookups:
            part = parts[g].to(torch.device(self._group_devices[g]))
            pooled.append(lookup(part).to(torch.device(self._output_device)))
            g += 1
        values = torch.cat(pooled, dim=1)
        if self._reorder:
            values = values.index_select(1, self._output_columns)
        return KeyedTensor(keys=self._embedding_names, length_per_key=self._lengths_per_embedding, values=values,
                           key_dim=1)

    def extra_repr(self) -> str:
        return f"groups={len(self._group_devices)}, devices={self._group_devices}, placement={self._placement!r}"


def assign_tables_by_size(
    names: list[str], sizes: list[int], num_devices: int, max_bytes_per_device: int | None = None
) -> list[int]:
    """Greedy table-wise placement: biggest table first onto the least loaded device.

    Args:
        names: the tables (for messages).
        sizes: stored bytes of each table.
        num_devices: devices to spread them over.
        max_bytes_per_device: refuse a placement that puts more bytes on one device.

    Returns:
        The device index of each table.

    Raises:
        ValueError: a table does not fit under ``max_bytes_per_device``.
    """
    load = [0] * num_devices
    assignment = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        d = min(range(num_devices), key=lambda d: (load[d], d))
        if max_bytes_per_device is not None and load[d] + sizes[i] > max_bytes_per_device:
            raise ValueError(
                f"table {names[i]!r} ({sizes[i]} bytes) does not fit: the least loaded of the {num_devices} "
                f"devices already holds {load[d]} of max_bytes_per_device={max_bytes_per_device} bytes. Add devices, "
                "raise max_bytes_per_device, or quantize further (dtype='int4')"
            )
        load[d] += sizes[i]
        assignment[i] = d
    return assignment


def inference_devices(world_size: int, device: torch.device | str | None) -> list[torch.device]:
    """``world_size`` serving devices: ``cuda:0 .. cuda:n-1`` for a CUDA ``device``, else ``device``
    (default CPU) ``n`` times -- torchrec's ``_shard_modules(device=..., env=ShardingEnv.from_local(n, 0))``."""
    base = torch.device(device) if device is not None else torch.device("cpu")
    if base.type == "cuda":
        return [torch.device("cuda", i) for i in range(world_size)]
    return [base] * world_size


def _resolve_devices(devices: object) -> list[torch.device]:
    if devices is None:
        return [torch.device("cpu")]
    if isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise TypeError(f"devices must be an int (world size) or a list of devices, got {devices!r}")
    if isinstance(devices, int):
        if devices <= 0:
            raise ValueError(f"devices (world size) must be positive, got {devices}")
        if torch.cuda.is_available() and torch.cuda.device_count() >= devices:
            return [torch.device("cuda", i) for i in range(devices)]
        return [torch.device("cpu")] * devices
    if len(devices) == 0:
        raise ValueError("devices=[] names no device; pass e.g. ['cpu', 'cpu'] or a world size")
    return [torch.device(d) for d in devices]


def shard_for_inference(
    model: nn.Module,
    devices: object = None,
    placement: str = "device",
    assignment: dict[str, int] | None = None,
    max_bytes_per_device: int | None = None,
    output_device: torch.device | str | None = None,
    kernel_backend: str = "auto",
    inplace: bool = False,
    *,
    use_fbgemm: bool | None = None,
) -> nn.Module:
    """Replace every ``QuantEmbeddingBagCollection`` in ``model`` by a sharded one.

    Args:
        model: a quantized model (``lightrec.inference.quantize`` output) or a collection itself.
        devices: a list of devices (``["cpu", "cpu"]``, ``["cuda:0", "cuda:1"]``) or a world size
            (``cuda:0..n-1`` when there are that many GPUs, else ``n`` CPU groups). Default: one CPU.
        placement: ``"device"`` or ``"host"`` (tables in host memory, looked up from the device).
        assignment: optional ``{table: device index}``; other tables are placed greedily by size.
        max_bytes_per_device: refuse placements that put more stored bytes on one device.
        output_device: where pooled outputs are gathered (default: the first device).
        kernel_backend: group kernels (see :class:`ShardedQuantEmbeddingBagCollection`).
        use_fbgemm: the deprecated spelling of ``kernel_backend`` (True: ``"fbgemm"``, False: ``"torch"``).
        inplace: modify ``model`` (saves memory) instead of returning a sharded copy.

    Returns:
        The sharded model; its outputs equal the unsharded quantized model's.

    Raises:
        ValueError: unknown placement, an ``assignment`` naming a table the model does not have, a device
            index out of range, or a table that does not fit.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    kernel_backend = resolve_kernel_backend(kernel_backend, "shard_for_inference", use_fbgemm=use_fbgemm)
    device_list = _resolve_devices(devices)
    _check_assignment(model, assignment)  # before anything changes: a failed call leaves model as it was
    if not inplace:
        model = copy.deepcopy(model)

    def convert(qebc: QuantEmbeddingBagCollection) -> ShardedQuantEmbeddingBagCollection:
        configs = qebc.embedding_bag_configs()
        sizes = [qebc._stored_tables()[t.name].weight.numel() for t in configs]
        placed = assign_tables_by_size([t.name for t in configs], sizes, len(device_list), max_bytes_per_device)
        for name, index in (assignment or {}).items():
            names = [t.name for t in configs]
            if name not in names:
                continue
            if not isinstance(index, int) or not 0 <= index < len(device_list):
                raise ValueError(f"assignment[{name!r}]={index!r} is not a device index in [0, {len(device_list)})")
            placed[names.index(name)] = index
        out_dev = torch.device(output_device) if output_device is not None else device_list[0]
        return ShardedQuantEmbeddingBagCollection(qebc, device_list, placed, out_dev, placement, kernel_backend)

    if isinstance(model, QuantEmbeddingBagCollection):
        return convert(model)
    found = False
    for _, child in list(model.named_modules()):
        for child_name, grandchild in list(child.named_children()):
            if isinstance(grandchild, QuantEmbeddingBagCollection):
                setattr(child, child_name, convert(grandchild))
                found = True
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no QuantEmbeddingBagCollection to shard; quantize it first "
            "(lightrec.inference.quantize(model, dtype='int8'))"
        )
    return model


def _check_assignment(model: nn.Module, assignment: dict[str, int] | None) -> None:
    """Refuse an ``assignment`` naming a table no quantized collection of ``model`` holds (a typo was
    ignored: the table silently went where the greedy placement put it)."""
    if not assignment:
        return
    tables = sorted(
        t.name
        for m in model.modules()
        if isinstance(m, QuantEmbeddingBagCollection)
        for t in m.embedding_bag_configs()
    )
    unknown = sorted(set(assignment) - set(tables))
    if unknown:
        raise ValueError(
            f"assignment names {unknown} but the model's quantized tables are {tables}; "
            "use those names (or leave a table out to place it by size)"
        )


def shard_modules(module: nn.Module, device: torch.device | str | None = None, env: object = None) -> nn.Module:
    """The TorchRec tutorial's ``_shard_modules(module=..., device=..., env=ShardingEnv.from_local(n, 0))``.

    Shards ``module``'s quantized collections over ``env.world_size`` groups on ``device`` (all
    ``cuda:0..n-1`` when ``device`` is CUDA), in place, and returns it.
    """
    world_size = int(getattr(env, "world_size", 1)) if env is not None else 1
    return shard_for_inference(module, devices=inference_devices(world_size, device), inplace=True)
