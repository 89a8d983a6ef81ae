"""``quantize(model, dtype)``: a serving copy of a model with quantized embedding tables.

Every ``EmbeddingBagCollection`` becomes a ``QuantEmbeddingBagCollection`` (int8 / int4 / fp16
rows, see :mod:`lightrec.inference.quant_rows`); dense layers stay float32, or become dynamic
int8 ``Linear`` layers with ``quantize_dense=True``. The float model is not modified and its
tables are not copied (only the quantized tables are allocated).

Tables may come from the model or from a full-table state dict (``state_dict=``), e.g. gathered
from a ``DistributedModelParallel`` checkpoint, whose keys are the model's (``sparse_arch.
embedding_bag_collection.embedding_bags.<table>.weight``, ``dense_arch...``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import nn

from lightrec.inference.quant_embedding_modules import QuantEmbeddingBagCollection
from lightrec.inference.quant_rows import DEFAULT_ROW_ALIGNMENT
from lightrec.modules.embedding_modules import EmbeddingBagCollection

__all__ = ["quantize", "quantize_dense_layers"]


def _collections(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if type(m) is EmbeddingBagCollection]


def quantize(
    model: nn.Module,
    dtype: object = torch.int8,
    per_table: dict[str, object] | None = None,
    quantize_dense: bool = False,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    row_alignment: int = DEFAULT_ROW_ALIGNMENT,
    use_fbgemm: bool | None = None,
) -> nn.Module:
    """Return a copy of ``model`` whose embedding bag collections are quantized.

    Args:
        model: any module holding ``EmbeddingBagCollection`` s (or one itself).
        dtype: ``torch.int8``/``"int8"``, ``torch.quint4x2``/``"int4"`` or ``torch.float16``/``"fp16"``.
        per_table: ``{table name: dtype}`` overrides (e.g. keep a small, sensitive table in fp16).
        quantize_dense: also turn ``nn.Linear`` layers into dynamic int8 ones
            (``torch.ao.quantization.quantize_dynamic``; TorchScript export only).
        state_dict: full float state dict to take every weight from (tables and dense layers).
        row_alignment: stored rows are padded to this many bytes.
        use_fbgemm: lookup kernel choice (None: fbgemm when it imports; same results either way).

    Returns:
        The quantized copy, in eval mode.

    Raises:
        ValueError: the model has no ``EmbeddingBagCollection``, or a state-dict entry is missing or
            has the wrong shape; KeyError: ``per_table`` names an unknown table.
    """
    found = _collections(model) if not isinstance(model, EmbeddingBagCollection) else [("", model)]
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no EmbeddingBagCollection to quantize (EmbeddingCollection is not "
            "supported yet); pass the model that holds the float tables"
        )
    known = {t.name for _, ebc in found for t in ebc.embedding_bag_configs()}
    unknown = sorted(set(per_table or {}) - known)
    if unknown:
        raise KeyError(f"per_table names tables {unknown} that the model does not have; its tables are {sorted(known)}")
    memo: dict[int, nn.Module] = {}
    for name, ebc in found:
        mine = {t.name for t in ebc.embedding_bag_configs()}
        memo[id(ebc)] = QuantEmbeddingBagCollection.from_float(
            ebc, dtype=dtype, per_table={k: v for k, v in (per_table or {}).items() if k in mine},
            row_alignment=row_alignment, use_fbgemm=use_fbgemm,
            state_dict=dict(state_dict) if state_dict is not None else None, prefix=f"{name}." if name else "",
        )
    # deepcopy with the collections pre-seeded in the memo: float tables are never copied
    quantized = copy.deepcopy(model, memo)
    if state_dict is not None:
        _load_dense(quantized, state_dict)
    if quantize_dense:
        quantized = quantize_dense_layers(quantized)
    return quantized.eval()


def _load_dense(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Load every non-table entry of ``state_dict`` into ``model``; raise on missing dense weights."""
    own = model.state_dict()
    dense_keys = [k for k in own if ".embedding_bags." not in f".{k}"]
    missing = [k for k in dense_keys if k not in state_dict]
    if missing:
        raise ValueError(
            f"state_dict lacks {len(missing)} dense entries the model needs, e.g. {missing[:5]}; pass the model's "
            "full state dict (with the lightrec.distributed gather step for sharded tables)"
        )
    model.load_state_dict({k: state_dict[k] for k in dense_keys}, strict=False)


def quantize_dense_layers(model: nn.Module) -> nn.Module:
    """Dynamic int8 ``nn.Linear`` (weights int8, activations quantized per batch), in place."""
    return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
