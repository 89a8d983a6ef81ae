"""What the two quantized collections share: arguments, stored tables, kernel choice, float import.

``QuantEmbeddingBagCollection`` (pooled) and ``QuantEmbeddingCollection`` (sequence) differ only in
how they look ids up. Both keep every table as a ``uint8`` buffer in fbgemm's row layout
(:mod:`lightrec.quant.row_codec`), under the name the float weight had::

    <tables attr>.<table>.weight   [num_embeddings, row_bytes] uint8   (buffer, not a parameter)

where ``<tables attr>`` is ``embedding_bags`` (pooled) or ``embeddings`` (sequence), as in the
float collections, so a float state dict's keys map one to one. :class:`QuantCollectionBase`
holds the behaviour around those buffers (``from_float``, ``set_float_weight``,
``dequantized_weight``, ...); the subclasses add the constructor and ``forward``.
"""

# No `from __future__ import annotations`: the subclasses are fx-traced and scripted.

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, List

import torch
from torch import nn
from typing_extensions import Self

from lightrec import _fbgemm, _triton
from lightrec._compat import is_fx_symbolic_tracing as is_fx_tracing
from lightrec.modules.embedding_configs import BaseEmbeddingConfig, DataType
from lightrec.modules.embedding_modules import check_collection_tables, table_lists
from lightrec.modules.kernel_backend import KERNEL_BACKENDS, resolve_kernel_backend
from lightrec.modules.quant_config import data_type_from_qconfig, resolve_data_type
from lightrec.quant.row_codec import (
    DEFAULT_ROW_ALIGNMENT,
    check_dim,
    dequantize_rows,
    quantize_rows,
    row_size_in_bytes,
    sparse_type_code,
)
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "CACHE_FEATURES_ORDER_ATTR",
    "QUANT_KERNELS",
    "ROW_FORMATS_METADATA_KEY",
    "QuantCollectionBase",
    "QuantRowFormatError",
    "QuantTable",
    "quant_tables",
    "resolve_quant_kernel",
    "set_stored_table",
    "storage_configs",
]

QUANT_KERNELS = KERNEL_BACKENDS

#: The attribute ``quant_prep_enable_cache_features_order`` sets on float collections; ``from_float``
#: turns it into the quantized collection's ``cache_features_order``.
CACHE_FEATURES_ORDER_ATTR = "cache_features_order"

#: The entry of a quantized collection's state-dict metadata (``state_dict._metadata[<collection
#: prefix>]``) that records each table's row format, ``{table: "INT8" | "INT4" | "FP16"}``: the
#: ``uint8`` buffers alone do not say it (an int4 and an int8 table of the same width often have the
#: same ``row_bytes``), so ``load_state_dict`` reads it to refuse rows of another format.
ROW_FORMATS_METADATA_KEY = "lightrec_row_formats"


class QuantRowFormatError(ValueError):
    """A state dict's table rows are not in the format the quantized collection stores them in."""


def _record_row_formats(
    module: "QuantCollectionBase", state_dict: dict[str, torch.Tensor], prefix: str, local_metadata: dict[str, object]
) -> None:
    """State-dict post hook: note every table's row format in the collection's metadata."""
    local_metadata[ROW_FORMATS_METADATA_KEY] = {t.name: t.data_type.value for t in module._configs}


def _check_row_formats(
    module: "QuantCollectionBase",
    state_dict: Mapping[str, object],
    prefix: str,
    local_metadata: Mapping[str, object],
    *args: object,
) -> None:
    """Load pre hook: refuse, before any table is written, rows that are not this module's.

    Runs before the collection's tables load (they are its children), so a refused load leaves
    every table as it was. A state dict without the metadata (a plain ``dict`` copy, or one saved
    before the formats were recorded) is checked for the ``uint8`` dtype only.
    """
    recorded = local_metadata.get(ROW_FORMATS_METADATA_KEY)
    saved: Mapping[object, object] = recorded if isinstance(recorded, Mapping) else {}
    own = type(module).__name__
    for t in module._configs:
        key = f"{prefix}{module.TABLES_ATTR}.{t.name}.weight"
        value = state_dict.get(key)
        if isinstance(value, torch.Tensor) and value.dtype != torch.uint8:
            raise QuantRowFormatError(
                f"state_dict[{key!r}] (table {t.name!r}) is {value.dtype}, but {own} stores the table as "
                f"{t.data_type.value} rows in uint8; load a state dict of a quantized collection, or quantize "
                f"float weights with {own}.from_float(module, ..., state_dict=...)"
            )
        fmt = saved.get(t.name)
        if value is not None and fmt is not None and fmt != t.data_type.value:
            raise QuantRowFormatError(
                f"state_dict[{key!r}]: table {t.name!r} was saved as {fmt} rows, but this {own} stores it as "
                f"{t.data_type.value} (the bytes would be misread); build the module with "
                f"per_table={{{t.name!r}: {str(fmt).lower()!r}}} to load it, or quantize the float weights again"
            )


def resolve_quant_kernel(kernel_backend: str, device: torch.device | str | None) -> str:
    """Which kernel serves a quantized collection: ``"fbgemm"``, ``"triton"`` or ``"torch"``.

    ``kernel_backend``: ``"auto"``, ``"fbgemm"``, ``"triton"`` or ``"torch"``. ``"auto"``: fbgemm's
    IntN op when it imports (on CUDA: a CUDA build of it); else, on CUDA, the Triton kernel when
    triton imports; else torch. ``"triton"`` for a module on the CPU is accepted where a GPU is
    visible (move the module there before its first lookup) or under ``TRITON_INTERPRET=1``. All
    three give the same numbers (see :mod:`lightrec.quant.pooled_kernels`).

    Raises:
        ValueError: unknown choice, or ``"triton"`` where it cannot run.
        RuntimeError: ``"fbgemm"`` but fbgemm_gpu cannot be used here.
    """
    if kernel_backend not in QUANT_KERNELS:
        raise ValueError(f"kernel_backend must be one of {QUANT_KERNELS}, got {kernel_backend!r}")
    backend = kernel_backend
    device = torch.device(device) if device is not None else torch.device("cpu")
    fbgemm_op = _fbgemm.has_fbgemm_op("int_nbit_split_embedding_codegen_lookup_function")
    if backend == "fbgemm" and not fbgemm_op:
        raise RuntimeError(
            f"kernel_backend='fbgemm' but fbgemm's IntN lookup is unavailable "
            f"({_fbgemm.fbgemm_unavailable_reason()}); use kernel_backend='auto', 'triton' or 'torch' (same results)"
        )
    if backend == "triton":
        reason = _triton.triton_device_reason(device)
        # Quantizing on the host and then moving the module to a GPU (``.to("cuda")``) is the usual
        # order: a CPU module may choose Triton when a GPU is there to move to. The lookup itself
        # checks the device it runs on (lightrec.quant.triton_lookup).
        movable = device.type == "cpu" and _triton.triton_available() and torch.cuda.is_available()
        if reason is not None and not movable:
            raise ValueError(f"kernel_backend='triton' cannot serve quantized lookups here: {reason}")
    if backend != "auto":
        return backend
    if fbgemm_op and (device.type != "cuda" or _fbgemm.fbgemm_serves_cuda()):
        return "fbgemm"
    return "triton" if device.type == "cuda" and _triton.triton_device_reason(device) is None else "torch"


class QuantTable(nn.Module):
    """Holds one stored table: buffer ``weight`` ``[num_embeddings, row_bytes]`` uint8.

    ``storage`` (a ``[num_embeddings, row_bytes]`` uint8 view of a collection's flat buffer) is
    used as the buffer instead of allocating a new one.
    """

    weight: torch.Tensor

    def __init__(
        self,
        rows: int,
        row_bytes: int,
        device: torch.device | str | None = None,
        storage: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if storage is None:
            storage = torch.zeros(rows, row_bytes, dtype=torch.uint8, device=device)
        self.register_buffer("weight", storage)

    def extra_repr(self) -> str:
        return f"weight={tuple(self.weight.shape)} {self.weight.dtype}"


def quant_tables(holders: nn.ModuleDict) -> dict[str, QuantTable]:
    """``{table name: QuantTable}`` of a collection's table holders (``embedding_bags`` / ``embeddings``)."""
    return {name: m for name, m in holders.items() if isinstance(m, QuantTable)}


def _table_data_types(tables: list, data_type: object, per_table: dict[str, object] | None) -> list[DataType]:
    default = resolve_data_type(data_type, "dtype")
    per_table = dict(per_table or {})
    names = {t.name for t in tables}
    unknown = sorted(set(per_table) - names)
    if unknown:
        raise KeyError(
            f"per_table names tables {unknown} that the collection does not have; its tables are {sorted(names)}"
        )
    return [
        resolve_data_type(per_table[t.name], f"per_table[{t.name!r}]") if t.name in per_table else default
        for t in tables
    ]


def storage_configs(
    tables: list,
    config_type: type,
    owner: str,
    dtype: object,
    per_table: dict[str, object] | None,
    bounds_check: str,
    row_alignment: int,
) -> tuple[list[str], list]:
    """Validate a quantized collection's arguments (both collections take the same ones).

    Returns:
        ``(feature order, configs)``: the configs carry their storage ``data_type``, as torchrec's
        quantized collections report it.
    """
    feature_order = check_collection_tables(tables, config_type, owner, bounds_check)
    if isinstance(row_alignment, bool) or not isinstance(row_alignment, int) or row_alignment <= 0:
        raise ValueError(f"row_alignment must be a positive int (bytes), got {row_alignment!r}")
    data_types = _table_data_types(tables, dtype, per_table)
    for t, dt in zip(tables, data_types):
        check_dim(t.embedding_dim, dt, t.name)
        row_bytes = row_size_in_bytes(t.embedding_dim, dt, row_alignment)
        if dt == DataType.FP16 and row_bytes % 2:
            # fbgemm's IntN kernels step through fp16 rows two bytes at a time: an odd row size makes
            # them read every other row from the wrong place (the torch kernel would not, so the
            # numbers would depend on whether fbgemm imports).
            raise ValueError(
                f"row_alignment={row_alignment} gives table {t.name!r} (fp16, embedding_dim={t.embedding_dim}) "
                f"rows of {row_bytes} bytes, but fp16 rows must be a whole number of halves; use "
                "row_alignment=16 (torchrec's default), another even value, or 1"
            )
    return feature_order, [dataclasses.replace(t, data_type=dt) for t, dt in zip(tables, data_types)]


def set_stored_table(
    holders: Mapping[str, QuantTable], configs: list, row_alignment: int, table: str, weight: torch.Tensor
) -> None:
    """Quantize ``weight`` into ``holders[table].weight`` with the storage type of ``table``'s config."""
    config = next((c for c in configs if c.name == table), None)
    if config is None:
        raise KeyError(f"no table {table!r}; tables are {[c.name for c in configs]}")
    expected = (config.num_embeddings, config.embedding_dim)
    if tuple(weight.shape) != expected:
        raise ValueError(
            f"table {table!r} weight has shape {tuple(weight.shape)}, expected the full table {expected}"
        )
    if weight.device.type == "meta":
        raise ValueError(
            f"table {table!r} is on the meta device; load or gather its weights before quantizing"
        )
    stored = holders[table].weight
    stored.copy_(quantize_rows(weight.to(stored.device), config.data_type, row_alignment, table))


def _float_weight(
    module: nn.Module, state_dict: dict[str, torch.Tensor] | None, prefix: str, table: BaseEmbeddingConfig, attr: str
) -> torch.Tensor:
    """Table ``table``'s float weight ``[rows, D]`` from ``state_dict`` (when given) or the module."""
    key = f"{prefix}{attr}.{table.name}.weight"
    if state_dict is not None:
        if key not in state_dict:
            near = sorted(k for k in state_dict if k.endswith(f"{table.name}.weight"))
            raise KeyError(
                f"state_dict has no {key!r} for table {table.name!r}"
                + (f"; similar keys: {near}" if near else "")
            )
        weight = state_dict[key]
    else:
        weight = getattr(module, attr)[table.name].weight
    expected = (table.num_embeddings, table.embedding_dim)
    if tuple(weight.shape) != expected:
        raise ValueError(
            f"table {table.name!r} weight has shape {tuple(weight.shape)}, expected the full table {expected}; "
            "gather sharded tables first (lightrec.distributed.sharding.state_dict.gather_full_state_dict)"
        )
    if weight.device.type == "meta":
        raise ValueError(
            f"table {table.name!r} is on the meta device; load or gather its weights before quantizing"
        )
    return weight


class QuantCollectionBase(nn.Module):
    """Behaviour both quantized collections share (see the module docstring).

    The constructor validates the arguments both collections take (the subclass's docstring lists
    them) and sets ``_feature_order``, ``_configs`` (the configs with their storage ``data_type``),
    ``_bounds_check``, ``_row_alignment`` and ``kernel``. A subclass sets the class attributes below,
    fills the ``<TABLES_ATTR>`` ``ModuleDict`` of :class:`QuantTable` and writes ``forward``.
    """

    TABLES_ATTR = ""  # "embedding_bags" (pooled) or "embeddings" (sequence): the state-dict prefix
    FLOAT_CONFIGS = ""  # the float collection's config getter: "embedding_bag_configs" / "embedding_configs"
    CONFIG_TYPE: ClassVar[type[BaseEmbeddingConfig]]  # the tables it takes: EmbeddingBagConfig / EmbeddingConfig
    __jit_unused_properties__ = ["device"]

    def __init__(
        self,
        tables: list,
        device: torch.device | str | None,
        dtype: object,
        per_table: dict[str, object] | None,
        row_alignment: int,
        bounds_check: str,
        kernel_backend: str,
        use_fbgemm: bool | None,
        backend: str | None,
    ) -> None:
        super().__init__()
        self._feature_order, self._configs = storage_configs(
            tables, self.CONFIG_TYPE, type(self).__name__, dtype, per_table, bounds_check, row_alignment
        )
        self._bounds_check = bounds_check
        self._row_alignment = row_alignment
        # Per-table facts both forwards read (TorchScript-typed lists; the configs carry the storage type).
        self._table_names, self._table_features, self._table_rows, self._table_dims = table_lists(self._configs)
        self._table_types: List[int] = [sparse_type_code(t.data_type) for t in self._configs]
        chosen = resolve_kernel_backend(
            kernel_backend, type(self).__name__, backend=backend, use_fbgemm=use_fbgemm, stacklevel=4
        )
        self.kernel = resolve_quant_kernel(chosen, device)
        # torchrec's cache_features_order: remember how the KJTs' keys map to _feature_order, for
        # inference, where every batch has the same keys (quant_prep_enable_cache_features_order)
        self.cache_features_order: bool = False
        self._cached_keys: List[str] = []
        self._cached_order: List[int] = []
        self._cached_order_tensor: torch.Tensor | None = None
        # The buffers do not say their row format: the state dict's metadata does (see
        # ROW_FORMATS_METADATA_KEY), and a load checks it before writing any table.
        self.register_state_dict_post_hook(_record_row_formats)
        self.register_load_state_dict_pre_hook(_check_row_formats)

    def _in_feature_order(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` with its keys in ``_feature_order`` (the key permutation is cached when
        ``cache_features_order`` is set and the input's keys repeat)."""
        if torch.jit.is_scripting():  # apart: TorchScript compiles every operand of an ``or``
            return features.permute_to_keys(self._feature_order)
        return self._cached_permute(features)

    @torch.jit.unused
    def _cached_permute(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        if is_fx_tracing() or not self.cache_features_order:
            return features.permute_to_keys(self._feature_order)
        keys = features.keys()
        if keys == self._feature_order:
            return features
        if keys != self._cached_keys or self._cached_order_tensor is None:
            index = {k: i for i, k in enumerate(keys)}
            missing = [k for k in self._feature_order if k not in index]
            if missing:
                raise KeyError(f"{type(self).__name__}: features {missing} are not in the KeyedJaggedTensor (keys {keys})")
            self._cached_keys = list(keys)
            self._cached_order = [index[k] for k in self._feature_order]
            self._cached_order_tensor = torch.tensor(self._cached_order, dtype=torch.int32, device=features.device())
        return features.permute(self._cached_order, self._cached_order_tensor)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_float(
        cls,
        module: nn.Module,
        dtype: object | None = None,
        per_table: dict[str, object] | None = None,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        kernel_backend: str = "auto",
        state_dict: dict[str, torch.Tensor] | None = None,
        prefix: str = "",
        *,
        use_fbgemm: bool | None = None,
        backend: str | None = None,
    ) -> Self:
        """Quantize a float collection (``torch.ao.quantization`` calls this).

        Args:
            module: the float collection (read only; weights may come from ``state_dict`` instead).
            dtype: storage type; when None, read from ``module.qconfig`` (a ``QuantConfig``).
            per_table, row_alignment, kernel_backend: as in the constructor (``use_fbgemm`` and
                ``backend`` are its deprecated spellings).
            state_dict / prefix: take table ``t`` from ``state_dict[prefix + "<TABLES_ATTR>.t.weight"]``
                (full tables, e.g. gathered from a ``DistributedModelParallel``) instead of the module.

        Raises:
            TypeError: ``module`` is not the matching float collection; ValueError: no dtype given.
            KeyError / ValueError: a table is missing from ``state_dict`` or has the wrong shape.
        """
        get_configs = getattr(module, cls.FLOAT_CONFIGS, None)
        if not callable(get_configs):
            raise TypeError(
                f"{cls.__name__}.from_float needs a float collection with {cls.FLOAT_CONFIGS}(), "
                f"got {type(module).__name__}"
            )
        if dtype is None:
            qconfig = getattr(module, "qconfig", None)
            if qconfig is None:
                raise ValueError(
                    "from_float needs dtype=... or a module.qconfig (QuantConfig) to know the storage type"
                )
            dtype = data_type_from_qconfig(qconfig)
            if per_table is None and getattr(qconfig, "per_table_weight_dtype", None):
                per_table = dict(qconfig.per_table_weight_dtype)
        tables = list(get_configs())
        first = _float_weight(module, state_dict, prefix, tables[0], cls.TABLES_ATTR)
        quantized = cls(
            tables,
            device=first.device,
            dtype=dtype,
            per_table=per_table,
            row_alignment=row_alignment,
            bounds_check=getattr(module, "_bounds_check", "error"),
            kernel_backend=resolve_kernel_backend(
                kernel_backend, f"{cls.__name__}.from_float", backend=backend, use_fbgemm=use_fbgemm
            ),
            **cls._float_options(module),
        )
        for t in tables:
            quantized.set_float_weight(t.name, _float_weight(module, state_dict, prefix, t, cls.TABLES_ATTR))
        quantized.cache_features_order = bool(getattr(module, CACHE_FEATURES_ORDER_ATTR, False))  # set on any module type
        return quantized

    @classmethod
    def _float_options(cls, module: nn.Module) -> dict[str, Any]:
        """Constructor arguments read from the float collection besides its tables (none here)."""
        return {}

    def set_float_weight(self, table: str, weight: torch.Tensor) -> None:
        """Quantize the float table ``weight`` ``[num_embeddings, D]`` into table ``table``'s storage.

        Raises:
            KeyError: no such table; ValueError: wrong shape, or values quantization cannot store.
        """
        set_stored_table(self._stored_tables(), self._configs, self._row_alignment, table, weight)

    # ------------------------------------------------------------------ introspection
    def feature_names(self) -> list[str]:
        return list(self._feature_order)

    @property
    def device(self) -> torch.device:
        return next(iter(self._stored_tables().values())).weight.device

    def dequantized_weight(self, table: str) -> torch.Tensor:
        """The float32 ``[num_embeddings, D]`` rows table ``table`` decodes to (what lookups read)."""
        for t in self._configs:
            if t.name == table:
                return dequantize_rows(self._stored_tables()[table].weight, t.data_type, t.embedding_dim)
        raise KeyError(f"no table {table!r}; tables are {[t.name for t in self._configs]}")

    def storage_bytes(self) -> int:
        """Bytes held by the stored tables (what a serving host must keep in memory)."""
        return sum(m.weight.numel() for m in self._stored_tables().values())

    def _stored_tables(self) -> dict[str, QuantTable]:
        return quant_tables(getattr(self, self.TABLES_ATTR))

    def _repr_settings(self) -> str:
        kinds = sorted({str(t.data_type) for t in self._configs})
        return f"dtype={'/'.join(kinds)}, row_alignment={self._row_alignment}, kernel='{self.kernel}'"
