"""``QuantEmbeddingBagCollection``: an ``EmbeddingBagCollection`` whose tables are stored quantized.

Same call shape and output as the float collection (``KeyedJaggedTensor`` → ``KeyedTensor``
``[B, sum D]`` float32), with every table kept as a ``uint8`` buffer in fbgemm's row layout
(:mod:`lightrec.inference.quant_rows`) under the same name the float weight had::

    embedding_bags.<table>.weight   [num_embeddings, row_bytes] uint8   (buffer, not a parameter)

Those buffers are views of one flat buffer holding every table back to back (``_flat_weights``,
not in the state dict), so that tables pooling the same way are looked up with **one** fbgemm IntN
call (:mod:`lightrec.inference.table_groups`) when fbgemm imports, otherwise with a pure-torch
kernel with bit-identical results (:mod:`lightrec.inference.kernels`). Build one with :meth:`from_float`, with
:func:`lightrec.inference.quantize`, or with torch's ``quantize_dynamic`` (the seed tutorial's way).
"""

# No `from __future__ import annotations`: fx copies forward() annotations into traced code,
# and TorchScript must see real classes there, not strings.

import dataclasses
from typing import List, Optional

import torch
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing as is_fx_tracing

from lightrec.inference.host_memory import allocate_host_buffer
from lightrec.inference.quant_rows import (
    DEFAULT_ROW_ALIGNMENT,
    check_dim,
    dequantize_rows,
    quantize_rows,
    row_size_in_bytes,
    sparse_type_code,
)
from lightrec.inference.table_groups import TableSpec, check_ids_by_table, equal_rows_runs, make_table_groups
from lightrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
from lightrec.modules.embedding_modules import EmbeddingBagCollection, _check_tables, ids_per_table
from lightrec.modules.feature_checks import BOUNDS_CHECK_MODES, check_feature_keys
from lightrec.modules.quant_config import data_type_from_qconfig, resolve_data_type
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = ["QuantEmbeddingBagCollection", "QuantTable", "set_stored_table"]

# one graph node under torch.fx (torch.fx.wrap patches the calling module's globals, i.e. this one's)
torch.fx.wrap("check_ids_by_table")


QUANT_KERNELS = ("auto", "fbgemm", "triton", "torch")


def resolve_quant_kernel(backend: str | None, use_fbgemm: bool | None, device: torch.device | str | None) -> str:
    """Which kernel serves a quantized collection: ``"fbgemm"``, ``"triton"`` or ``"torch"``.

    ``backend`` (``"auto"``, ``"fbgemm"``, ``"triton"``, ``"torch"``) wins; without it the older
    ``use_fbgemm`` says ``"fbgemm"`` (True), ``"torch"`` (False) or ``"auto"`` (None). ``"auto"``:
    fbgemm's IntN op when it imports (on CUDA: a CUDA build of it); else, on CUDA, the Triton kernel
    when triton imports; else torch. All three give the same numbers (see :mod:`lightrec.inference.kernels`).

    Raises:
        ValueError: unknown or conflicting choice, or ``"triton"`` where it cannot run.
        RuntimeError: ``"fbgemm"`` but fbgemm_gpu cannot be used here.
    """
    from lightrec._fbgemm import fbgemm_serves_cuda, fbgemm_unavailable_reason, has_fbgemm_op
    from lightrec._triton import triton_device_reason

    if backend is None:
        backend = "auto" if use_fbgemm is None else ("fbgemm" if use_fbgemm else "torch")
    elif backend not in QUANT_KERNELS:
        raise ValueError(f"backend must be one of {QUANT_KERNELS}, got {backend!r}")
    elif use_fbgemm is not None and backend != ("fbgemm" if use_fbgemm else "torch"):
        raise ValueError(f"use_fbgemm={use_fbgemm} contradicts backend={backend!r}; pass only backend=...")
    device = torch.device(device) if device is not None else torch.device("cpu")
    fbgemm_op = has_fbgemm_op("int_nbit_split_embedding_codegen_lookup_function")
    if backend == "fbgemm" and not fbgemm_op:
        raise RuntimeError(
            f"backend='fbgemm' (use_fbgemm=True) but fbgemm's IntN lookup is unavailable ({fbgemm_unavailable_reason()}); "
            "use backend='auto', 'triton' or 'torch' (same results)"
        )
    if backend == "triton":
        reason = triton_device_reason(device)
        if reason is not None:
            raise ValueError(f"backend='triton' cannot serve quantized lookups here: {reason}")
    if backend != "auto":
        return backend
    if fbgemm_op and (device.type != "cuda" or fbgemm_serves_cuda()):
        return "fbgemm"
    return "triton" if device.type == "cuda" and triton_device_reason(device) is None else "torch"


class QuantTable(nn.Module):
    """Holds one stored table: buffer ``weight`` ``[num_embeddings, row_bytes]`` uint8.

    ``storage`` (a ``[num_embeddings, row_bytes]`` uint8 view of a collection's flat buffer) is
    used as the buffer instead of allocating a new one.
    """

    def __init__(self, rows: int, row_bytes: int, device: torch.device | str | None = None,
                 storage: torch.Tensor | None = None) -> None:
        super().__init__()
        if storage is None:
            storage = torch.zeros(rows, row_bytes, dtype=torch.uint8, device=device)
        self.register_buffer("weight", storage)

    def extra_repr(self) -> str:
        return f"weight={tuple(self.weight.shape)} {self.weight.dtype}"


def _table_data_types(
    tables: list[EmbeddingBagConfig], data_type: object, per_table: dict[str, object] | None
) -> list[DataType]:
    default = resolve_data_type(data_type, "dtype")
    per_table = dict(per_table or {})
    names = {t.name for t in tables}
    unknown = sorted(set(per_table) - names)
    if unknown:
        raise KeyError(f"per_table names tables {unknown} that the collection does not have; its tables are {sorted(names)}")
    return [resolve_data_type(per_table[t.name], f"per_table[{t.name!r}]") if t.name in per_table else default
            for t in tables]


def storage_configs(
    tables: list, config_type: type, owner: str, dtype: object, per_table: dict[str, object] | None,
    bounds_check: str, row_alignment: int,
) -> tuple[list[str], list]:
    """Validate a quantized collection's arguments (both collections take the same ones).

    Returns:
        ``(feature order, configs)``: the configs carry their storage ``data_type``, as torchrec's
        quantized collections report it.
    """
    for t in tables:
        if not isinstance(t, config_type):
            raise TypeError(f"{owner} takes {config_type.__name__} tables, got {type(t).__name__}")
    feature_order = _check_tables(tables, owner)
    if bounds_check not in BOUNDS_CHECK_MODES:
        raise ValueError(f"bounds_check must be one of {BOUNDS_CHECK_MODES}, got {bounds_check!r}")
    if not isinstance(row_alignment, int) or row_alignment <= 0:
        raise ValueError(f"row_alignment must be a positive int (bytes), got {row_alignment!r}")
    data_types = _table_data_types(tables, dtype, per_table)
    for t, dt in zip(tables, data_types):
        check_dim(t.embedding_dim, dt, t.name)
    return feature_order, [dataclasses.replace(t, data_type=dt) for t, dt in zip(tables, data_types)]


class QuantEmbeddingBagCollection(nn.Module):
    """Pooled embedding tables stored as int8 / int4 / fp16 rows, looked up in float32.

    Args:
        tables: the float collection's ``EmbeddingBagConfig`` list.
        is_weighted: use the KJT's per-id weights.
        device: where the stored tables live.
        dtype: storage type of every table (``torch.int8``/``"int8"``, ``torch.quint4x2``/``"int4"``,
            ``torch.float16``/``"fp16"`` or a ``DataType``).
        per_table: ``{table name: dtype}`` overrides.
        row_alignment: stored rows are padded to a multiple of this many bytes (16, like torchrec).
        bounds_check: ``"error"`` (default), ``"clamp"`` or ``"skip"`` for ids outside a table.
        use_fbgemm: force (True) or forbid (False) fbgemm's kernel; None uses it when it imports.
        backend: ``"auto"``, ``"fbgemm"``, ``"triton"`` or ``"torch"`` lookups (overrides
            ``use_fbgemm``; see :func:`resolve_quant_kernel`). ``kernel`` says which runs.

    The tables are zero until filled: use :meth:`from_float`, :meth:`set_float_weight`, or
    ``load_state_dict`` with a state dict of this module.
    """

    __jit_unused_properties__ = ["device"]

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        is_weighted: bool = False,
        device: torch.device | str | None = None,
        dtype: object = DataType.INT8,
        per_table: dict[str, object] | None = None,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        bounds_check: str = "error",
        use_fbgemm: bool | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        self._feature_order, self._embedding_bag_configs = storage_configs(
            tables, EmbeddingBagConfig, "QuantEmbeddingBagCollection", dtype, per_table, bounds_check, row_alignment
        )
        data_types = [t.data_type for t in self._embedding_bag_configs]
        self._is_weighted = is_weighted
        self._bounds_check = bounds_check
        self._row_alignment = row_alignment
        # All tables live back to back in one flat buffer (lightrec.inference.table_groups), so a
        # group of tables is one fbgemm call; embedding_bags.<t>.weight are views of it (the state
        # dict keys), and the flat buffer itself is not saved.
        specs: list[TableSpec] = []
        start = 0
        for t, dt in zip(tables, data_types):
            row_bytes = row_size_in_bytes(t.embedding_dim, dt, row_alignment)
            specs.append(TableSpec(start, t.num_embeddings, row_bytes, t.embedding_dim, sparse_type_code(dt),
                                   len(t.feature_names), t.pooling == PoolingType.MEAN))
            start += t.num_embeddings * row_bytes
        self._specs = specs
        self.register_buffer("_flat_weights", allocate_host_buffer(start, device), persistent=False)
        self.embedding_bags = nn.ModuleDict()
        for t, spec in zip(tables, specs):
            self.embedding_bags[t.name] = QuantTable(spec.rows, spec.row_bytes, storage=self._table_view(spec))
        self.kernel = resolve_quant_kernel(backend, use_fbgemm, device)
        self._groups = make_table_groups(specs, self.kernel, row_alignment, torch.device(device) if device else None)
        self.register_load_state_dict_post_hook(QuantEmbeddingBagCollection._restore_views)
        self._embedding_names: List[str] = list(self._feature_order)
        self._lengths_per_embedding: List[int] = [t.embedding_dim for t in tables for _ in t.feature_names]
        self._table_names: List[str] = [t.name for t in tables]
        self._table_features: List[List[str]] = [list(t.feature_names) for t in tables]
        self._table_rows: List[int] = [t.num_embeddings for t in tables]
        self._table_dims: List[int] = [t.embedding_dim for t in tables]
        self._table_types: List[int] = [sparse_type_code(dt) for dt in data_types]
        self._table_mean: List[bool] = [t.pooling == PoolingType.MEAN for t in tables]
        self._equal_rows_runs: List[int] = equal_rows_runs(self._table_rows)
        self._table_feature_offsets: List[int] = [0]  # [T + 1] index of each table's first feature
        for t in tables:
            self._table_feature_offsets.append(self._table_feature_offsets[-1] + len(t.feature_names))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_float(
        cls,
        module: EmbeddingBagCollection,
        dtype: object | None = None,
        per_table: dict[str, object] | None = None,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        use_fbgemm: bool | None = None,
        state_dict: dict[str, torch.Tensor] | None = None,
        prefix: str = "",
        backend: str | None = None,
    ) -> "QuantEmbeddingBagCollection":
        """Quantize a float ``EmbeddingBagCollection`` (``torch.ao.quantization`` calls this).

        Args:
            module: the float collection (read only; weights may come from ``state_dict`` instead).
            dtype: storage type; when None, read from ``module.qconfig`` (a ``QuantConfig``).
            per_table, row_alignment, use_fbgemm, backend: as in the constructor.
            state_dict / prefix: take table ``t`` from ``state_dict[prefix + "embedding_bags.t.weight"]``
                (full tables, e.g. gathered from a ``DistributedModelParallel``) instead of the module.

        Raises:
            TypeError: ``module`` is not an ``EmbeddingBagCollection``; ValueError: no dtype given.
            KeyError / ValueError: a table is missing from ``state_dict`` or has the wrong shape.
        """
        get_configs = getattr(module, "embedding_bag_configs", None)
        if not callable(get_configs):
            raise TypeError(f"from_float needs an EmbeddingBagCollection, got {type(module).__name__}")
        if dtype is None:
            qconfig = getattr(module, "qconfig", None)
            if qconfig is None:
                raise ValueError("from_float needs dtype=... or a module.qconfig (QuantConfig) to know the storage type")
            dtype = data_type_from_qconfig(qconfig)
        tables = list(get_configs())
        bounds_check = getattr(module, "_bounds_check", "error")
        is_weighted = module.is_weighted() if callable(getattr(module, "is_weighted", None)) else False
        first = _float_weight(module, state_dict, prefix, tables[0])
        quantized = cls(tables, is_weighted=is_weighted, device=first.device, dtype=dtype, per_table=per_table,
                        row_alignment=row_alignment, bounds_check=bounds_check, use_fbgemm=use_fbgemm,
                        backend=backend)
        for t in tables:
            quantized.set_float_weight(t.name, _float_weight(module, state_dict, prefix, t))
        return quantized

    def set_float_weight(self, table: str, weight: torch.Tensor) -> None:
        """Quantize the float table ``weight`` ``[num_embeddings, D]`` into table ``table``'s storage.

        Raises:
            KeyError: no such table; ValueError: wrong shape, or values quantization cannot store.
        """
        set_stored_table(self.embedding_bags, self._embedding_bag_configs, self._row_alignment, table, weight)

    # ------------------------------------------------------------------ introspection
    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._embedding_bag_configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    def feature_names(self) -> list[str]:
        return list(self._feature_order)

    @property
    def device(self) -> torch.device:
        return next(iter(self.embedding_bags.values())).weight.device

    def dequantized_weight(self, table: str) -> torch.Tensor:
        """The float32 ``[num_embeddings, D]`` values table ``table`` decodes to (what lookups sum)."""
        for t in self._embedding_bag_configs:
            if t.name == table:
                return dequantize_rows(self.embedding_bags[table].weight, t.data_type, t.embedding_dim)
        raise KeyError(f"no table {table!r}; tables are {[t.name for t in self._embedding_bag_configs]}")

    def storage_bytes(self) -> int:
        """Bytes held by the stored tables (what a serving host must keep in memory)."""
        return sum(int(m.weight.numel()) for m in self.embedding_bags.values())

    # ------------------------------------------------------------------ lookup
    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pool every feature's ids (same contract as ``EmbeddingBagCollection.forward``).

        Returns:
            ``KeyedTensor`` with keys ``feature_names()`` and float32 values ``[B, sum D]``.
        """
        weights: Optional[torch.Tensor] = None
        if self._bounds_check == "error":
            # ids are looked up as they come: check them with one min/max per run of equal-sized tables
            if not torch.jit.is_scripting():  # TorchScript skips this branch; it cannot compile set logic
                if not is_fx_tracing():
                    check_feature_keys(features.keys(), self._feature_order, "QuantEmbeddingBagCollection")
                    if self._is_weighted and features.weights_or_none() is None:
                        raise ValueError(
                            "QuantEmbeddingBagCollection(is_weighted=True) needs per-id weights, but the "
                            "KeyedJaggedTensor has weights=None; pass weights=... or quantize an unweighted collection"
                        )
            features = features.permute_to_keys(self._feature_order)
            stride = features.stride()
            offset_per_key = features.offset_per_key()
            lengths = features.lengths()
            if self._is_weighted:
                weights = features.weights()  # weights() (a Tensor, not Optional) keeps a traced graph scriptable
            value_offsets: List[int] = [offset_per_key[f] for f in self._table_feature_offsets]
            values = check_ids_by_table(features.values(), lengths, value_offsets, self._table_feature_offsets,
                                        self._table_rows, self._table_names, self._table_features, stride,
                                        self._equal_rows_runs)
        else:  # "clamp" / "skip" change ids (and lengths): the shared per-table path, then one run again
            stride, slices = ids_per_table(
                features, self._feature_order, self._table_names, self._table_features, self._table_rows,
                self._is_weighted, self._bounds_check, "QuantEmbeddingBagCollection",
            )  # fmt: skip
            values = torch.cat([s[0] for s in slices])
            lengths = torch.cat([s[1] for s in slices])
            if self._is_weighted:
                parts: List[torch.Tensor] = []
                for s in slices:
                    w = s[2]
                    if w is not None:
                        parts.append(w)
                weights = torch.cat(parts)
            value_offsets = [0]
            for s in slices:
                value_offsets.append(value_offsets[-1] + s[0].numel())
        pooled: List[torch.Tensor] = []
        for group in self._groups:
            pooled.append(group(self._flat_weights, values, lengths, weights, value_offsets, stride))
        return KeyedTensor(
            keys=self._embedding_names,
            length_per_key=self._lengths_per_embedding,
            values=pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1),
            key_dim=1,
        )

    # ------------------------------------------------------------------ storage
    def _table_view(self, spec: TableSpec) -> torch.Tensor:
        flat = self._flat_weights
        return flat[spec.byte_offset : spec.byte_offset + spec.rows * spec.row_bytes].view(spec.rows, spec.row_bytes)

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 - nn.Module's signature
        # .to() / .cpu() / .cuda() / share_memory(): convert the flat buffer once and re-point the
        # per-table views at it. Converting each view on its own would copy every table and cut it
        # off from the buffer the lookups read.
        # The groups' constants are rebuilt, not converted: to_empty() would leave them garbage.
        self._buffers["_flat_weights"] = fn(self._flat_weights)
        for group in self._groups:
            reset = getattr(group, "reset_constants", None)
            if reset is not None:
                reset(self._flat_weights.device)
        for name, spec in zip(self._table_names, self._specs):
            self.embedding_bags[name]._buffers["weight"] = self._table_view(spec)
        return self

    @staticmethod
    def _restore_views(module: "QuantEmbeddingBagCollection", incompatible_keys: object) -> None:
        # load_state_dict(assign=True) replaces the per-table buffers by the loaded tensors: copy
        # them into the flat buffer the lookups read and make the tables views again.
        for name, spec in zip(module._table_names, module._specs):
            holder = module.embedding_bags[name]
            view = module._table_view(spec)
            if holder.weight.data_ptr() != view.data_ptr():
                view.copy_(holder.weight)
                holder._buffers["weight"] = view

    def extra_repr(self) -> str:
        kinds = sorted({str(t.data_type) for t in self._embedding_bag_configs})
        return (f"dtype={'/'.join(kinds)}, is_weighted={self._is_weighted}, row_alignment={self._row_alignment}, "
                f"kernel='{self.kernel}'")


def set_stored_table(
    holders: nn.ModuleDict, configs: list, row_alignment: int, table: str, weight: torch.Tensor
) -> None:
    """Quantize ``weight`` into ``holders[table].weight`` with the storage type of ``table``'s config."""
    config = next((c for c in configs if c.name == table), None)
    if config is None:
        raise KeyError(f"no table {table!r}; tables are {[c.name for c in configs]}")
    expected = (config.num_embeddings, config.embedding_dim)
    if tuple(weight.shape) != expected:
        raise ValueError(f"table {table!r} weight has shape {tuple(weight.shape)}, expected the full table {expected}")
    if weight.device.type == "meta":
        raise ValueError(f"table {table!r} is on the meta device; load or gather its weights before quantizing")
    stored = holders[table].weight
    stored.copy_(quantize_rows(weight.to(stored.device), config.data_type, row_alignment, table))


def _float_weight(
    module: nn.Module,
    state_dict: dict[str, torch.Tensor] | None,
    prefix: str,
    table: EmbeddingBagConfig,
    attr: str = "embedding_bags",
) -> torch.Tensor:
    """Table ``table``'s float weight ``[rows, D]`` from ``state_dict`` (when given) or the module."""
    key = f"{prefix}{attr}.{table.name}.weight"
    if state_dict is not None:
        if key not in state_dict:
            near = sorted(k for k in state_dict if k.endswith(f"{table.name}.weight"))
            raise KeyError(f"state_dict has no {key!r} for table {table.name!r}" + (f"; similar keys: {near}" if near else ""))
        weight = state_dict[key]
    else:
        weight = getattr(module, attr)[table.name].weight
    expected = (table.num_embeddings, table.embedding_dim)
    if tuple(weight.shape) != expected:
        raise ValueError(
            f"table {table.name!r} weight has shape {tuple(weight.shape)}, expected the full table {expected}; "
            "gather sharded tables first (lightrec.distributed.state_dict.gather_full_state_dict)"
        )
    if weight.device.type == "meta":
        raise ValueError(f"table {table.name!r} is on the meta device; load or gather its weights before quantizing")
    return weight
