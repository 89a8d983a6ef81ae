"""Serving: quantized embedding tables, inference sharding, TorchScript / torch.export artifacts.

The seed tutorial's flow, in lightrec::

    qmodel = lightrec.inference.quantize(model, dtype="int8")          # EBC and EC; or torch's quantize_dynamic
    qmodel = lightrec.inference.shard_for_inference(qmodel, devices=2)  # optional: spread tables
    lightrec.inference.export(qmodel, "model.pt")                       # + model.pt.meta.json
    scores = lightrec.inference.load("model.pt").predict([{"dense": [...], "sparse": {...}}])

A ``DistributedModelParallel`` (sharded) model goes through the same calls, as a collective:
``quantize(dmp, dst=0)`` gathers full tables to rank 0 (:mod:`lightrec.inference.sharded`).
See ``docs/serving.md``.
"""

from lightrec.inference.export import (
    EXPORT_FORMATS,
    ExportError,
    TensorInputModule,
    describe_model,
    export,
    export_from_checkpoint,
)
from lightrec.inference.fx import Tracer, symbolic_trace
from lightrec.inference.predictor import Predictor, RequestError, load
from lightrec.inference.quant_embedding_collection import QuantEmbeddingCollection
from lightrec.inference.quant_embedding_modules import QuantEmbeddingBagCollection
from lightrec.inference.quant_rows import dequantize_rows, quantize_rows, row_size_in_bytes
from lightrec.inference.quantize import quantize
from lightrec.inference.sharded import export_on_rank, has_sharded_collections, unshard
from lightrec.inference.sharding import ShardedQuantEmbeddingBagCollection, shard_for_inference, shard_modules
from lightrec.modules.quant_config import QuantConfig, resolve_data_type

__all__ = [
    "EXPORT_FORMATS",
    "ExportError",
    "Predictor",
    "QuantConfig",
    "QuantEmbeddingBagCollection",
    "QuantEmbeddingCollection",
    "RequestError",
    "ShardedQuantEmbeddingBagCollection",
    "TensorInputModule",
    "Tracer",
    "dequantize_rows",
    "describe_model",
    "export",
    "export_from_checkpoint",
    "export_on_rank",
    "has_sharded_collections",
    "load",
    "quantize",
    "quantize_rows",
    "resolve_data_type",
    "row_size_in_bytes",
    "shard_for_inference",
    "shard_modules",
    "symbolic_trace",
    "unshard",
]
