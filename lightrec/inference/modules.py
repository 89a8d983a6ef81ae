"""torchrec's ``torchrec.inference.modules``: ``quantize_embeddings``, ``PredictFactory`` and
``PredictModule``, mapped to lightrec's serving workflow.

``quantize_embeddings(model, dtype=torch.qint8, inplace=False)`` is :func:`lightrec.inference.quantize`
under torchrec's signature. A ``PredictFactory`` says how to build the serving model; lightrec's own
path from it to an artifact is::

    module = factory.create_predict_module()               # a PredictModule over a quantized model
    lightrec.inference.export(module.predict_module, "model.pt")
    lightrec.inference.load("model.pt").predict(requests)

or ``PredictFactoryPackager.save_predict_factory`` (:mod:`lightrec.inference.model_packager`) to
ship the factory itself, as torchrec's C++ server expects.
"""

from __future__ import annotations

import abc
import json
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from lightrec.inference.quantize import quantize
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.quant.embedding_collection import QuantEmbeddingCollection
from lightrec.quant.embedding_modules import QuantEmbeddingBagCollection

__all__ = [
    "BatchingMetadata",
    "PredictFactory",
    "PredictModule",
    "QualNameMetadata",
    "quantize_dense",
    "quantize_embeddings",
    "quantize_feature",
]

_QUANTIZED = {EmbeddingBagCollection: QuantEmbeddingBagCollection, EmbeddingCollection: QuantEmbeddingCollection}
_DTYPES = {torch.qint8: torch.int8, torch.quint8: torch.int8, torch.quint4x2: torch.quint4x2}


def _replace_in_place(module: nn.Module, quantized: nn.Module) -> nn.Module:
    """Put the quantized collections of ``quantized`` (a copy of ``module``) at their paths in ``module``."""
    if isinstance(quantized, (QuantEmbeddingBagCollection, QuantEmbeddingCollection)):
        return quantized  # the module was a collection itself: there is nothing to put it into
    for path, sub in quantized.named_modules():
        if isinstance(sub, (QuantEmbeddingBagCollection, QuantEmbeddingCollection)) and path:
            parent, _, name = path.rpartition(".")
            setattr(module.get_submodule(parent) if parent else module, name, sub)
    return module


def quantize_embeddings(
    module: nn.Module,
    dtype: torch.dtype,
    inplace: bool,
    additional_qconfig_spec_keys: list[type[nn.Module]] | None = None,
    additional_mapping: dict[type[nn.Module], type[nn.Module]] | None = None,
    output_dtype: torch.dtype = torch.float,
    per_table_weight_dtype: dict[str, torch.dtype] | None = None,
) -> nn.Module:
    """Quantize the embedding collections of ``module`` (torchrec's signature).

    Args:
        module: a model holding ``EmbeddingBagCollection`` / ``EmbeddingCollection`` s.
        dtype: ``torch.qint8`` / ``torch.int8``, ``torch.quint4x2`` or ``torch.float16``.
        inplace: put the quantized collections into ``module`` itself (else a copy is returned).
        additional_qconfig_spec_keys, additional_mapping: torchrec's way to also quantize
            ``EmbeddingCollection``; lightrec always quantizes both collection types, so these may
            only name them (anything else raises).
        output_dtype: lookups return float32; another dtype raises.
        per_table_weight_dtype: ``{table: dtype}`` overrides.
    """
    extra = set(additional_qconfig_spec_keys or ()) | set(additional_mapping or ())
    unknown = sorted(t.__name__ for t in extra if t not in _QUANTIZED)
    if unknown:
        raise ValueError(
            f"quantize_embeddings: lightrec quantizes EmbeddingBagCollection and EmbeddingCollection only; "
            f"it cannot map {unknown}"
        )
    if output_dtype != torch.float:
        raise ValueError(
            f"quantize_embeddings(output_dtype={output_dtype}): lightrec's quantized lookups return float32; "
            "convert the output afterwards if you need another dtype"
        )
    per_table: dict[str, object] = {k: _DTYPES.get(v, v) for k, v in (per_table_weight_dtype or {}).items()}
    quantized = quantize(module, dtype=_DTYPES.get(dtype, dtype), per_table=per_table or None)
    return _replace_in_place(module, quantized) if inplace else quantized


@dataclass
class QualNameMetadata:
    need_preproc: bool


@dataclass
class BatchingMetadata:
    """How a server batches one input: its ``type`` (e.g. ``"dense"``, ``"sparse"``), ``device``
    and the tensor suffixes to read into pinned memory."""

    type: str
    device: str
    pinned: list[str]


class PredictFactory(abc.ABC):
    """Builds the serving model (with learned weights) and describes its inputs and outputs."""

    @abc.abstractmethod
    def create_predict_module(self) -> nn.Module:
        """The serving model (a :class:`PredictModule`), weights loaded."""

    @abc.abstractmethod
    def batching_metadata(self) -> dict[str, BatchingMetadata]:
        """``{input name: BatchingMetadata}``."""

    def batching_metadata_json(self) -> str:
        return json.dumps({key: asdict(value) for key, value in self.batching_metadata().items()})

    @abc.abstractmethod
    def result_metadata(self) -> str:
        """The result type (how a server splits results back per request)."""

    @abc.abstractmethod
    def run_weights_independent_tranformations(self, predict_module: nn.Module) -> nn.Module:
        """Transformations that do not read the weights (tracing, splitting); torchrec's spelling."""

    @abc.abstractmethod
    def run_weights_dependent_transformations(self, predict_module: nn.Module) -> nn.Module:
        """Transformations that read the weights (lowering)."""

    def qualname_metadata(self) -> dict[str, QualNameMetadata]:
        return {}

    def model_inputs_data(self) -> dict[str, Any]:
        return {}


class PredictModule(nn.Module):
    """A serving wrapper: ``forward(batch: {name: tensor})`` runs :meth:`predict_forward` without
    autograd (``torch.inference_mode``), on ``device`` when it is a GPU.

    Args:
        module: the model (put in eval mode).
        device: the GPU of ``forward`` (None: the current CUDA device when there is one, else CPU).
    """

    def __init__(self, module: nn.Module, device: torch.device | str | None = None) -> None:
        super().__init__()
        self._module = module.eval()
        self._device = torch.device(device) if device is not None else None

    @property
    def predict_module(self) -> nn.Module:
        return self._module

    @abc.abstractmethod
    def predict_forward(self, batch: dict[str, torch.Tensor]) -> Any:
        """The model's outputs for a batch of named input tensors."""

    def forward(self, batch: dict[str, torch.Tensor]) -> Any:
        device = self._device
        if device is None and torch.cuda.is_available():
            device = self._device = torch.device("cuda", torch.cuda.current_device())
        with torch.inference_mode():
            if device is not None and device.type == "cuda":
                with torch.cuda.device(device):
                    return self.predict_forward(batch)
            return self.predict_forward(batch)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._module.state_dict(*args, **kwargs)


def quantize_feature(module: nn.Module, inputs: tuple[object, ...]) -> tuple[object, ...]:
    """A forward pre-hook turning float32/float64 tensor inputs into float16."""
    return tuple(x.half() if isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.float64) else x
                 for x in inputs)  # fmt: skip


def quantize_dense(
    predict_module: PredictModule, dtype: torch.dtype, additional_embedding_module_type: list[type[nn.Module]] | None = None
) -> PredictModule:
    """Turn every direct child of the served model that is not an embedding collection into float16.

    Raises:
        ValueError: ``dtype`` is not ``torch.half`` (the only dense lowering torchrec offers too).
    """
    if dtype != torch.half:
        raise ValueError(f"quantize_dense supports dtype=torch.half only, got {dtype}")
    skip = (EmbeddingBagCollection, EmbeddingCollection, QuantEmbeddingBagCollection, QuantEmbeddingCollection,
            *(additional_embedding_module_type or ()))  # fmt: skip
    module = predict_module.predict_module
    for name, child in list(module.named_children()):
        if not isinstance(child, skip):
            child = child.half()
            child.register_forward_pre_hook(quantize_feature)
            setattr(module, name, child)
    return predict_module
