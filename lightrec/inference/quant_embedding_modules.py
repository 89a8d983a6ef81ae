"""``QuantEmbeddingBagCollection``: an ``EmbeddingBagCollection`` whose tables are stored quantized.

Same call shape and output as the float collection (``KeyedJaggedTensor`` → ``KeyedTensor``
``[B, sum D]`` float32), with every table kept as a ``uint8`` buffer in fbgemm's row layout
(:mod:`lightrec.inference.quant_rows`) under the same name the float weight had::

    embedding_bags.<table>.weight   [num_embeddings, row_bytes] uint8   (buffer, not a parameter)

Lookups run on fbgemm's IntN kernel when fbgemm imports, otherwise on a pure-torch kernel with
bit-identical results (:mod:`lightrec.inference.kernels`). Build one with :meth:`from_float`, with
:func:`lightrec.inference.quantize`, or with torch's ``quantize_dynamic`` (the seed tutorial's way).
"""

# No `from __future__ import annotations`: fx copies forward() annotations into traced code,
# and TorchScript must see real classes there, not strings.

import dataclasses
from typing import List

import torch
from torch import nn

from lightrec.inference.kernels import make_kernel
from lightrec.inference.quant_rows import (
    DEFAULT_ROW_ALIGNMENT,
    check_dim,
    dequantize_rows,
    quantize_rows,
    row_size_in_bytes,
    sparse_type_code,
)
from lightrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
from lightrec.modules.embedding_modules import EmbeddingBagCollection, _check_tables, ids_per_table
from lightrec.modules.feature_checks import BOUNDS_CHECK_MODES
from lightrec.modules.quant_config import data_type_from_qconfig, resolve_data_type
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor
from lightrec.sparse._ops import complete_cumsum

__all__ = ["QuantEmbeddingBagCollection", "QuantTable"]


class QuantTable(nn.Module):
    """Holds one stored table: buffer ``weight`` ``[num_embeddings, row_bytes]`` uint8."""

    def __init__(self, rows: int, row_bytes: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.register_buffer("weight", torch.zeros(rows, row_bytes, dtype=torch.uint8, device=device))

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


class QuantEmbeddingBagCollection(nn.Module):
    """Pooled embedding tables stored as int8 / int4 / fp16 / fp32 rows, looked up in float32.

    Args:
        tables: the float collection's ``EmbeddingBagConfig`` list.
        is_weighted: use the KJT's per-id weights.
        device: where the stored tables live.
        dtype: storage type of every table (``torch.int8``/``"int8"``, ``torch.quint4x2``/``"int4"``,
            ``torch.float16``/``"fp16"``, ``"fp32"`` or a ``DataType``).
        per_table: ``{table name: dtype}`` overrides.
        row_alignment: stored rows are padded to a multiple of this many bytes (16, like torchrec).
        bounds_check: ``"error"`` (default), ``"clamp"`` or ``"skip"`` for ids outside a table.
        use_fbgemm: force (True) or forbid (False) fbgemm's kernel; None uses it when it imports.

    The tables are zero until filled: use :meth:`from_float`, or ``load_state_dict`` with a state
    dict of this module.
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
    ) -> None:
        super().__init__()
        for t in tables:
            if not isinstance(t, EmbeddingBagConfig):
                raise TypeError(f"QuantEmbeddingBagCollection takes EmbeddingBagConfig tables, got {type(t).__name__}")
        self._feature_order = _check_tables(tables, "QuantEmbeddingBagCollection")
        if bounds_check not in BOUNDS_CHECK_MODES:
            raise ValueError(f"bounds_check must be one of {BOUNDS_CHECK_MODES}, got {bounds_check!r}")
        if not isinstance(row_alignment, int) or row_alignment <= 0:
            raise ValueError(f"row_alignment must be a positive int (bytes), got {row_alignment!r}")
        data_types = _table_data_types(tables, dtype, per_table)
        for t, dt in zip(tables, data_types):
            check_dim(t.embedding_dim, dt, t.name)
        # The configs report the storage type, as torchrec's quantized collections do.
        self._embedding_bag_configs = [dataclasses.replace(t, data_type=dt) for t, dt in zip(tables, data_types)]
        self._is_weighted = is_weighted
        self._bounds_check = bounds_check
        self._row_alignment = row_alignment
        self.embedding_bags = nn.ModuleDict()
        for t, dt in zip(tables, data_types):
            self.embedding_bags[t.name] = QuantTable(
                t.num_embeddings, row_size_in_bytes(t.embedding_dim, dt, row_alignment), device
            )
        self._kernel = make_kernel(use_fbgemm, row_alignment)
        self._embedding_names: List[str] = list(self._feature_order)
        self._lengths_per_embedding: List[int] = [t.embedding_dim for t in tables for _ in t.feature_names]
        self._table_names: List[str] = [t.name for t in tables]
        self._table_features: List[List[str]] = [list(t.feature_names) for t in tables]
        self._table_rows: List[int] = [t.num_embeddings for t in tables]
        self._table_dims: List[int] = [t.embedding_dim for t in tables]
        self._table_types: List[int] = [sparse_type_code(dt) for dt in data_types]
        self._table_mean: List[bool] = [t.pooling == PoolingType.MEAN for t in tables]

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
    ) -> "QuantEmbeddingBagCollection":
        """Quantize a float ``EmbeddingBagCollection`` (``torch.ao.quantization`` calls this).

        Args:
            module: the float collection (read only; weights may come from ``state_dict`` instead).
            dtype: storage type; when None, read from ``module.qconfig`` (a ``QuantConfig``).
            per_table, row_alignment, use_fbgemm: as in the constructor.
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
                        row_alignment=row_alignment, bounds_check=bounds_check, use_fbgemm=use_fbgemm)
        for t, stored_type in zip(tables, quantized._embedding_bag_configs):
            weight = _float_weight(module, state_dict, prefix, t)
            quantized.embedding_bags[t.name].weight.copy_(
                quantize_rows(weight, stored_type.data_type, row_alignment, t.name)
            )
        return quantized

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
        _, slices = ids_per_table(
            features, self._feature_order, self._table_names, self._table_features, self._table_rows,
            self._is_weighted, self._bounds_check, "QuantEmbeddingBagCollection",
        )  # fmt: skip
        pooled: List[torch.Tensor] = []
        t = 0
        for _, table in self.embedding_bags.items():
            ids, bag_lengths, id_weights = slices[t]
            num_features = len(self._table_features[t])
            offsets = complete_cumsum(bag_lengths)
            pooled.append(
                self._kernel(table.weight, self._table_types[t], self._table_dims[t], num_features, ids, offsets,
                             id_weights, self._table_mean[t])
            )
            t += 1
        return KeyedTensor(
            keys=self._embedding_names,
            length_per_key=self._lengths_per_embedding,
            values=torch.cat(pooled, dim=1),
            key_dim=1,
        )

    def extra_repr(self) -> str:
        kinds = sorted({str(t.data_type) for t in self._embedding_bag_configs})
        return f"dtype={'/'.join(kinds)}, is_weighted={self._is_weighted}, row_alignment={self._row_alignment}"


def _float_weight(
    module: nn.Module, state_dict: dict[str, torch.Tensor] | None, prefix: str, table: EmbeddingBagConfig
) -> torch.Tensor:
    """Table ``table``'s float weight ``[rows, D]`` from ``state_dict`` (when given) or the module."""
    key = f"{prefix}embedding_bags.{table.name}.weight"
    if state_dict is not None:
        if key not in state_dict:
            near = sorted(k for k in state_dict if k.endswith(f"{table.name}.weight"))
            raise KeyError(f"state_dict has no {key!r} for table {table.name!r}" + (f"; similar keys: {near}" if near else ""))
        weight = state_dict[key]
    else:
        weight = module.embedding_bags[table.name].weight
    expected = (table.num_embeddings, table.embedding_dim)
    if tuple(weight.shape) != expected:
        raise ValueError(
            f"table {table.name!r} weight has shape {tuple(weight.shape)}, expected the full table {expected}; "
            "gather sharded tables first (lightrec.distributed.state_dict.gather_full_state_dict)"
        )
    if weight.device.type == "meta":
        raise ValueError(f"table {table.name!r} is on the meta device; load or gather its weights before quantizing")
    return weight
