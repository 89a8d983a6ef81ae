"""``QuantEmbeddingCollection``: an ``EmbeddingCollection`` (sequence embeddings) with quantized tables.

Same call shape and output as the float collection -- a ``KeyedJaggedTensor`` in, and out
``{feature: JaggedTensor}`` with one float32 row per id::

    feature  | values [N_f, D] float32 (ids in input order) | lengths [B] (the feature's, after bounds_check)

Every table is a ``uint8`` buffer in fbgemm's row layout (:mod:`lightrec.inference.quant_rows`)
under the float weight's name::

    embeddings.<table>.weight   [num_embeddings, row_bytes] uint8   (buffer, not a parameter)

A looked-up value is exactly the stored row decoded (:func:`~lightrec.inference.quant_rows.dequantize_rows`),
so it is within the documented per-row error bound of the fp32 original. Lookups run on fbgemm's
IntN kernel with pooling NONE when fbgemm imports, otherwise on a pure-torch kernel with identical
results (:mod:`lightrec.inference.sequence_kernels`). Build one with :meth:`from_float`, with
:func:`lightrec.inference.quantize`, or with torch's ``quantize_dynamic``.
"""

# No `from __future__ import annotations`: fx copies forward() annotations into traced code,
# and TorchScript must see real classes there, not strings.

from typing import Dict, List

import torch
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing as is_fx_tracing

from lightrec.inference.quant_embedding_modules import (
    QuantTable,
    _float_weight,
    resolve_quant_kernel,
    set_stored_table,
    storage_configs,
)
from lightrec.inference.quant_rows import (
    DEFAULT_ROW_ALIGNMENT,
    dequantize_rows,
    row_size_in_bytes,
    sparse_type_code,
)
from lightrec.inference.sequence_kernels import make_sequence_kernel
from lightrec.modules.embedding_configs import DataType, EmbeddingConfig
from lightrec.modules.feature_checks import apply_bounds_check, check_feature_keys
from lightrec.modules.quant_config import data_type_from_qconfig
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = ["QuantEmbeddingCollection"]


class QuantEmbeddingCollection(nn.Module):
    """Unpooled embedding tables stored as int8 / int4 / fp16 rows, looked up in float32.

    Args:
        tables: the float collection's ``EmbeddingConfig`` list.
        device: where the stored tables live.
        dtype: storage type of every table (``torch.int8``/``"int8"``, ``torch.quint4x2``/``"int4"``,
            ``torch.float16``/``"fp16"`` or a ``DataType``).
        per_table: ``{table name: dtype}`` overrides.
        row_alignment: stored rows are padded to a multiple of this many bytes (16, like torchrec).
        bounds_check: ``"error"`` (default), ``"clamp"`` or ``"skip"`` for ids outside a table.
        use_fbgemm: force (True) or forbid (False) fbgemm's kernel; None uses it when it imports.
        backend: ``"auto"``, ``"fbgemm"``, ``"triton"`` or ``"torch"`` lookups (overrides ``use_fbgemm``;
            see ``resolve_quant_kernel``). ``kernel`` says which runs.

    The tables are zero until filled: use :meth:`from_float`, :meth:`set_float_weight`, or
    ``load_state_dict`` with a state dict of this module.
    """

    __jit_unused_properties__ = ["device"]

    def __init__(
        self,
        tables: List[EmbeddingConfig],
        device: torch.device | str | None = None,
        dtype: object = DataType.INT8,
        per_table: dict[str, object] | None = None,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        bounds_check: str = "error",
        use_fbgemm: bool | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        self._feature_order, self._embedding_configs = storage_configs(
            tables, EmbeddingConfig, "QuantEmbeddingCollection", dtype, per_table, bounds_check, row_alignment
        )
        data_types = [t.data_type for t in self._embedding_configs]
        self._bounds_check = bounds_check
        self._row_alignment = row_alignment
        self.embeddings = nn.ModuleDict()
        for t, dt in zip(tables, data_types):
            self.embeddings[t.name] = QuantTable(
                t.num_embeddings, row_size_in_bytes(t.embedding_dim, dt, row_alignment), device
            )
        self.kernel = resolve_quant_kernel(backend, use_fbgemm, device)
        self._kernel = make_sequence_kernel(self.kernel, row_alignment)
        self._table_features: List[List[str]] = [list(t.feature_names) for t in tables]
        self._table_rows: List[int] = [t.num_embeddings for t in tables]
        self._table_dims: List[int] = [t.embedding_dim for t in tables]
        self._table_types: List[int] = [sparse_type_code(dt) for dt in data_types]

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_float(
        cls,
        module: nn.Module,
        dtype: object | None = None,
        per_table: dict[str, object] | None = None,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        use_fbgemm: bool | None = None,
        state_dict: dict[str, torch.Tensor] | None = None,
        prefix: str = "",
        backend: str | None = None,
    ) -> "QuantEmbeddingCollection":
        """Quantize a float ``EmbeddingCollection`` (``torch.ao.quantization`` calls this).

        Args:
            module: the float collection (read only; weights may come from ``state_dict`` instead).
            dtype: storage type; when None, read from ``module.qconfig`` (a ``QuantConfig``).
            per_table, row_alignment, use_fbgemm, backend: as in the constructor.
            state_dict / prefix: take table ``t`` from ``state_dict[prefix + "embeddings.t.weight"]``.

        Raises:
            TypeError: ``module`` has no ``embedding_configs()``; ValueError: no dtype given.
            KeyError / ValueError: a table is missing from ``state_dict`` or has the wrong shape.
        """
        get_configs = getattr(module, "embedding_configs", None)
        if not callable(get_configs):
            raise TypeError(f"QuantEmbeddingCollection.from_float needs an EmbeddingCollection, got {type(module).__name__}")
        if dtype is None:
            qconfig = getattr(module, "qconfig", None)
            if qconfig is None:
                raise ValueError("from_float needs dtype=... or a module.qconfig (QuantConfig) to know the storage type")
            dtype = data_type_from_qconfig(qconfig)
        tables = list(get_configs())
        first = _float_weight(module, state_dict, prefix, tables[0], attr="embeddings")
        quantized = cls(tables, device=first.device, dtype=dtype, per_table=per_table, row_alignment=row_alignment,
                        bounds_check=getattr(module, "_bounds_check", "error"), use_fbgemm=use_fbgemm,
                        backend=backend)
        for t in tables:
            quantized.set_float_weight(t.name, _float_weight(module, state_dict, prefix, t, attr="embeddings"))
        return quantized

    def set_float_weight(self, table: str, weight: torch.Tensor) -> None:
        """Quantize the float table ``weight`` ``[num_embeddings, D]`` into table ``table``'s storage.

        Raises:
            KeyError: no such table; ValueError: wrong shape, or values quantization cannot store.
        """
        set_stored_table(self.embeddings, self._embedding_configs, self._row_alignment, table, weight)

    # ------------------------------------------------------------------ introspection
    def embedding_configs(self) -> List[EmbeddingConfig]:
        return self._embedding_configs

    def feature_names(self) -> List[str]:
        return list(self._feature_order)

    @property
    def device(self) -> torch.device:
        return next(iter(self.embeddings.values())).weight.device

    def dequantized_weight(self, table: str) -> torch.Tensor:
        """The float32 ``[num_embeddings, D]`` rows table ``table`` decodes to (what lookups return)."""
        for t in self._embedding_configs:
            if t.name == table:
                return dequantize_rows(self.embeddings[table].weight, t.data_type, t.embedding_dim)
        raise KeyError(f"no table {table!r}; tables are {[t.name for t in self._embedding_configs]}")

    def storage_bytes(self) -> int:
        """Bytes held by the stored tables."""
        return sum(int(m.weight.numel()) for m in self.embeddings.values())

    # ------------------------------------------------------------------ lookup
    def forward(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        """Look up every id (same contract as ``EmbeddingCollection.forward``).

        Returns:
            ``{feature: JaggedTensor(values [N_f, D] float32, lengths [B])}`` for every feature.
        """
        if not torch.jit.is_scripting():  # TorchScript skips this branch; it cannot compile set logic
            if not is_fx_tracing():
                check_feature_keys(features.keys(), self._feature_order, "QuantEmbeddingCollection")
        features = features.permute_to_keys(self._feature_order)
        stride = features.stride()
        offset_per_key = features.offset_per_key()
        lengths = features.lengths()
        values = features.values()
        out: Dict[str, JaggedTensor] = {}
        f = 0
        t = 0
        for table_name, table in self.embeddings.items():
            for name in self._table_features[t]:
                ids, f_lengths, _ = apply_bounds_check(
                    self._bounds_check,
                    values[offset_per_key[f] : offset_per_key[f + 1]],
                    lengths[f * stride : (f + 1) * stride],
                    None,
                    self._table_rows[t],
                    table_name,
                    [name],
                    stride,
                )
                rows = self._kernel(table.weight, self._table_types[t], self._table_dims[t], ids)
                out[name] = JaggedTensor(values=rows, weights=None, lengths=f_lengths, offsets=None)
                f += 1
            t += 1
        return out

    def extra_repr(self) -> str:
        kinds = sorted({str(t.data_type) for t in self._embedding_configs})
        return (f"dtype={'/'.join(kinds)}, bounds_check={self._bounds_check!r}, row_alignment={self._row_alignment}, "
                f"kernel='{self.kernel}'")
