"""The serving workflow: quantize a model, gather a sharded one, export an artifact, load and predict.

The TorchRec tutorial's flow, in lightrec::

    qmodel = lightrec.inference.quantize(model, dtype="int8")          # EBC and EC; or torch's quantize_dynamic
    qmodel = lightrec.inference.shard_for_inference(qmodel, devices=2)  # optional: spread tables
    lightrec.inference.export(qmodel, "model.pt")                       # + model.pt.meta.json
    scores = lightrec.inference.load("model.pt").predict([{"dense": [...], "sparse": {...}}])

A ``DistributedModelParallel`` (sharded) model goes through the same calls, as a collective:
``quantize(dmp, dst=0)`` gathers full tables to rank 0 (:mod:`lightrec.inference.gather`).

Files, each on top of the one before: ``gather.py`` (full tables from the ranks that hold them),
``quantize.py``, ``export.py`` (artifacts and their metadata), ``predictor.py`` (``load`` and
``Predictor``). The quantized tables themselves and their kernels live one floor down, in
:mod:`lightrec.quant` (re-exported here), the tracer in :mod:`lightrec.fx`. See ``docs/serving.md``.
"""

from lightrec.fx.tracer import Tracer, symbolic_trace

# torchrec's ``inference/__init__`` imports its submodules (``torchrec.inference.modules`` is an
# attribute once the package is imported); these are lightrec's files at those paths.
from lightrec.inference import model_packager as model_packager
from lightrec.inference import modules as modules
from lightrec.inference import state_dict_transform as state_dict_transform
from lightrec.inference.export import (
    EXPORT_FORMATS,
    ExportError,
    TensorInputModule,
    describe_model,
    export,
    export_from_checkpoint,
    export_on_rank,
)
from lightrec.inference.gather import has_sharded_collections, unshard
from lightrec.inference.predictor import (
    ArtifactMetaError,
    CorruptArtifactError,
    Predictor,
    RequestError,
    load,
)
from lightrec.inference.quantize import quantize
from lightrec.inference.safe_archive import UnsafeArtifactError
from lightrec.modules.quant_config import QuantConfig, resolve_data_type
from lightrec.quant.embedding_collection import QuantEmbeddingCollection
from lightrec.quant.embedding_modules import QuantEmbeddingBagCollection
from lightrec.quant.row_codec import dequantize_rows, quantize_rows, row_size_in_bytes
from lightrec.quant.sharded_embedding_bag import (
    ShardedQuantEmbeddingBagCollection,
    shard_for_inference,
    shard_modules,
)

__all__ = [
    "EXPORT_FORMATS",
    "ArtifactMetaError",
    "CorruptArtifactError",
    "ExportError",
    "Predictor",
    "QuantConfig",
    "QuantEmbeddingBagCollection",
    "QuantEmbeddingCollection",
    "RequestError",
    "ShardedQuantEmbeddingBagCollection",
    "TensorInputModule",
    "Tracer",
    "UnsafeArtifactError",
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
