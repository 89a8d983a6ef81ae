"""Quantized embedding tables and their lookup kernels (``torchrec.quant`` -> ``lightrec.quant``).

The floor of ``lightrec.kernels``: it imports only ``lightrec.modules`` and ``lightrec.sparse``
(and the fbgemm / Triton availability checks), so a serving process needs neither the training
stack nor Lightning.

* :mod:`~lightrec.quant.embedding_modules` -- ``QuantEmbeddingBagCollection`` (torchrec's name:
  ``EmbeddingBagCollection``), and :mod:`~lightrec.quant.embedding_collection` --
  ``QuantEmbeddingCollection``; what both share is in :mod:`~lightrec.quant.collection_base`;
* :mod:`~lightrec.quant.row_codec` -- int8 / int4 / fp16 rows in fbgemm's layout; the flat buffer
  the tables live in is huge-page backed (``lightrec._host_memory``, shared with the trained tables);
* lookups: :mod:`~lightrec.quant.table_groups` (one call per run of tables, pooled),
  :mod:`~lightrec.quant.pooled_kernels` and :mod:`~lightrec.quant.sequence_kernels` (fbgemm's IntN
  op or pure torch), :mod:`~lightrec.quant.triton_lookup` (+ ``triton_quant_kernel``) for CUDA
  without fbgemm;
* :mod:`~lightrec.quant.sharded_embedding_bag` -- inference sharding: a quantized EBC's tables
  spread over the serving devices (``shard_for_inference``, torchrec's ``_shard_modules`` shape).

``lightrec.inference`` builds on these to quantize whole models and export them.
"""

from lightrec.modules.quant_config import QuantConfig, resolve_data_type
from lightrec.quant.collection_base import QUANT_KERNELS, resolve_quant_kernel
from lightrec.quant.embedding_collection import QuantEmbeddingCollection
from lightrec.quant.embedding_modules import (
    EmbeddingBagCollection,
    EmbeddingCollection,
    QuantEmbeddingBagCollection,
)
from lightrec.quant.row_codec import DEFAULT_ROW_ALIGNMENT, dequantize_rows, quantize_rows, row_size_in_bytes
from lightrec.quant.sharded_embedding_bag import (
    ShardedQuantEmbeddingBagCollection,
    shard_for_inference,
    shard_modules,
)

__all__ = [
    "DEFAULT_ROW_ALIGNMENT",
    "EmbeddingBagCollection",
    "EmbeddingCollection",
    "QUANT_KERNELS",
    "QuantConfig",
    "QuantEmbeddingBagCollection",
    "QuantEmbeddingCollection",
    "ShardedQuantEmbeddingBagCollection",
    "dequantize_rows",
    "quantize_rows",
    "resolve_data_type",
    "resolve_quant_kernel",
    "row_size_in_bytes",
    "shard_for_inference",
    "shard_modules",
]
