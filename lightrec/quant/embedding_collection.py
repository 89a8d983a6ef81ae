"""``QuantEmbeddingCollection``: an ``EmbeddingCollection`` (sequence embeddings) with quantized tables.

Same call shape and output as the float collection -- a ``KeyedJaggedTensor`` in, and out
``{feature: JaggedTensor}`` with one float32 row per id::

    feature  | values [N_f, D] float32 (ids in input order) | lengths [B] (the feature's, after bounds_check)

Every table is a ``uint8`` buffer in fbgemm's row layout (:mod:`lightrec.quant.row_codec`)
under the float weight's name::

    embeddings.<table>.weight   [num_embeddings, row_bytes] uint8   (buffer, not a parameter)

A looked-up value is exactly the stored row decoded (:func:`~lightrec.quant.row_codec.dequantize_rows`),
so it is within the documented per-row error bound of the fp32 original. Lookups run on fbgemm's
IntN kernel with pooling NONE when fbgemm imports, otherwise on a pure-torch kernel with identical
results (:mod:`lightrec.quant.sequence_kernels`). Build one with :meth:`from_float`, with
:func:`lightrec.inference.quantize`, or with torch's ``quantize_dynamic``.
"""

# No `from __future__ import annotations`: fx copies forward() annotations into traced code,
# and TorchScript must see real classes there, not strings.

from typing import Dict, List

import torch
from torch import nn

from lightrec.modules.collection_interfaces import EmbeddingCollectionInterface, embedding_names_by_table
from lightrec.modules.embedding_configs import DataType, EmbeddingConfig
from lightrec.modules.embedding_modules import ids_per_feature
from lightrec.quant.collection_base import QuantCollectionBase, QuantTable
from lightrec.quant.row_codec import DEFAULT_ROW_ALIGNMENT, row_size_in_bytes
from lightrec.quant.sequence_kernels import make_sequence_kernel
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = ["QuantEmbeddingCollection"]


class QuantEmbeddingCollection(QuantCollectionBase, EmbeddingCollectionInterface):
    """Unpooled embedding tables stored as int8 / int4 / fp16 rows, looked up in float32.

    Args:
        tables: the float collection's ``EmbeddingConfig`` list.
        device, dtype, per_table, row_alignment, bounds_check, kernel_backend, use_fbgemm, backend: as in
            ``QuantEmbeddingBagCollection`` (storage type, per-table overrides, row padding, what
            to do with ids outside a table, and which kernel looks up; ``kernel`` says which runs).

    The tables are zero until filled: use :meth:`from_float`, :meth:`set_float_weight`, or
    ``load_state_dict`` with a state dict of this module.
    """

    TABLES_ATTR = "embeddings"
    FLOAT_CONFIGS = "embedding_configs"
    CONFIG_TYPE = EmbeddingConfig

    def __init__(
        self,
        tables: List[EmbeddingConfig],
        device: torch.device | str | None = None,
        dtype: object = DataType.INT8,
        per_table: dict[str, object] | None = None,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        bounds_check: str = "error",
        kernel_backend: str = "auto",
        *,
        use_fbgemm: bool | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__(tables, device, dtype, per_table, row_alignment, bounds_check, kernel_backend,
                         use_fbgemm, backend)
        data_types = [t.data_type for t in self._configs]
        self.embeddings = nn.ModuleDict()
        for t, dt in zip(tables, data_types):
            self.embeddings[t.name] = QuantTable(
                t.num_embeddings, row_size_in_bytes(t.embedding_dim, dt, row_alignment), device
            )
        self._kernel = make_sequence_kernel(self.kernel, row_alignment)
        self._embedding_names_by_table: List[List[str]] = embedding_names_by_table(tables)

    # ------------------------------------------------------------------ introspection
    def embedding_configs(self) -> List[EmbeddingConfig]:
        return self._configs

    # ------------------------------------------------------------------ lookup
    def forward(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        """Look up every id (same contract as ``EmbeddingCollection.forward``).

        Returns:
            ``{feature: JaggedTensor(values [N_f, D] float32, lengths [B])}`` for every feature.
        """
        checked = ids_per_feature(
            features, self._feature_order, self._table_names, self._table_features, self._table_rows,
            self._bounds_check, "QuantEmbeddingCollection",
        )  # fmt: skip
        out: Dict[str, JaggedTensor] = {}
        f = 0
        t = 0
        for _, table in self.embeddings.items():
            for name in self._embedding_names_by_table[t]:
                ids, f_lengths = checked[f]
                rows = self._kernel(table.weight, self._table_types[t], self._table_dims[t], ids)
                out[name] = JaggedTensor(values=rows, weights=None, lengths=f_lengths, offsets=None)
                f += 1
            t += 1
        return out

    def extra_repr(self) -> str:
        return f"{self._repr_settings()}, bounds_check={self._bounds_check!r}"
