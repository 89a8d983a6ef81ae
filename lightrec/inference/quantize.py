"""``quantize(model, dtype)``: a serving copy of a model with quantized embedding tables.

Every pooled collection (``EmbeddingBagCollection``, ``FusedEmbeddingBagCollection``) becomes a
``QuantEmbeddingBagCollection`` and every sequence collection (``EmbeddingCollection``,
``FusedEmbeddingCollection``) a ``QuantEmbeddingCollection`` (int8 / int4 / fp16 rows, see
:mod:`lightrec.quant.row_codec`); dense layers stay float32, or become dynamic int8
``Linear`` layers with ``quantize_dense=True``. The float model is not modified and its tables
are not copied (only the quantized tables are allocated).

Tables may come from the model, from a full-table state dict (``state_dict=``) whose keys are the
model's (``sparse_arch.embedding_bag_collection.embedding_bags.<table>.weight``, ``dense_arch...``),
or -- for a ``DistributedModelParallel`` or a model whose collections it sharded -- from the ranks
holding them: then ``quantize`` is a collective (see :mod:`lightrec.inference.gather`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NamedTuple, Union, overload

import torch
from torch import nn

from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.inference.gather import (
    quantize_sharded_collection,
    sharded_collections,
    sharding_group,
    unwrap_model_parallel,
)
from lightrec.kernels import FusedEmbeddingBagCollection, FusedEmbeddingCollection
from lightrec.kernels.tiered.config import refuse_tiered_export
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.modules.kernel_backend import resolve_kernel_backend
from lightrec.modules.managed_collision.embedding_collections import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from lightrec.quant.embedding_collection import QuantEmbeddingCollection
from lightrec.quant.embedding_modules import QuantEmbeddingBagCollection
from lightrec.quant.managed_collision import (
    QuantManagedCollisionEmbeddingBagCollection,
    QuantManagedCollisionEmbeddingCollection,
)
from lightrec.quant.row_codec import DEFAULT_ROW_ALIGNMENT

__all__ = ["quantize", "quantize_dense_layers"]


# What quantize() puts in place of a float collection.
_QuantCollection = Union[
    QuantEmbeddingBagCollection,
    QuantEmbeddingCollection,
    QuantManagedCollisionEmbeddingBagCollection,
    QuantManagedCollisionEmbeddingCollection,
]


class _Found(NamedTuple):
    path: str
    module: nn.Module
    pooled: bool
    sharded: bool


# The float collections quantize() replaces (the fused ones keep the plain ones' state-dict keys);
# managed-collision collections become quantized tables behind their frozen id maps.
_POOLED_FLOAT = (EmbeddingBagCollection, FusedEmbeddingBagCollection, ManagedCollisionEmbeddingBagCollection)
_SEQUENCE_FLOAT = (EmbeddingCollection, FusedEmbeddingCollection, ManagedCollisionEmbeddingCollection)
_MANAGED: dict[type[nn.Module], type[QuantManagedCollisionEmbeddingBagCollection | QuantManagedCollisionEmbeddingCollection]] = {
    ManagedCollisionEmbeddingBagCollection: QuantManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection: QuantManagedCollisionEmbeddingCollection,
}


def _collections(model: nn.Module) -> list[_Found]:
    """The outermost float or sharded embedding collections of ``model`` (module order)."""
    sharded = {id(m) for _, m in sharded_collections(model)}
    found: list[_Found] = []
    for path, m in model.named_modules():
        if any(path == f.path or path.startswith(f.path + ".") or f.path == "" for f in found):
            continue  # inside a collection already found
        if id(m) in sharded:
            found.append(_Found(path, m, bool(m._pooled), True))
        elif type(m) in _POOLED_FLOAT:
            found.append(_Found(path, m, True, False))
        elif type(m) in _SEQUENCE_FLOAT:
            found.append(_Found(path, m, False, False))
    return found


def _table_names(found: _Found) -> set[str]:
    getter = "embedding_bag_configs" if found.pooled else "embedding_configs"
    return {t.name for t in getattr(found.module, getter)()}


@overload
def quantize(
    model: nn.Module,
    dtype: object = ...,
    per_table: dict[str, object] | None = ...,
    quantize_dense: bool = ...,
    state_dict: Mapping[str, torch.Tensor] | None = ...,
    row_alignment: int = ...,
    kernel_backend: str = ...,
    dst: None = ...,
    *,
    use_fbgemm: bool | None = ...,
    backend: str | None = ...,
) -> nn.Module: ...


@overload
def quantize(
    model: nn.Module,
    dtype: object = ...,
    per_table: dict[str, object] | None = ...,
    quantize_dense: bool = ...,
    state_dict: Mapping[str, torch.Tensor] | None = ...,
    row_alignment: int = ...,
    kernel_backend: str = ...,
    dst: int | None = ...,
    *,
    use_fbgemm: bool | None = ...,
    backend: str | None = ...,
) -> nn.Module | None: ...


def quantize(
    model: nn.Module,
    dtype: object = torch.int8,
    per_table: dict[str, object] | None = None,
    quantize_dense: bool = False,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    row_alignment: int = DEFAULT_ROW_ALIGNMENT,
    kernel_backend: str = "auto",
    dst: int | None = None,
    *,
    use_fbgemm: bool | None = None,
    backend: str | None = None,
) -> nn.Module | None:
    """Return a copy of ``model`` whose embedding collections are quantized.

    Args:
        model: any module holding embedding collections (or one itself), a
            ``DistributedModelParallel``, or a model whose collections it sharded.
        dtype: ``torch.int8``/``"int8"``, ``torch.quint4x2``/``"int4"`` or ``torch.float16``/``"fp16"``.
        per_table: ``{table name: dtype}`` overrides (e.g. keep a small, sensitive table in fp16).
        quantize_dense: also turn ``nn.Linear`` layers into dynamic int8 ones
            (``torch.ao.quantization.quantize_dynamic``; TorchScript export only).
        state_dict: full float state dict to take every weight from (tables and dense layers).
        row_alignment: stored rows are padded to this many bytes.
        kernel_backend: ``"auto"``, ``"fbgemm"``, ``"triton"`` or ``"torch"`` lookups of the quantized
            collections (see ``resolve_quant_kernel``; the same results whichever runs).
        dst: sharded models only: the rank (in the sharding group) that receives the quantized
            copy; None gives every rank one. Ignored for unsharded models.
        use_fbgemm, backend: deprecated spellings of ``kernel_backend`` (``lightrec.modules.kernel_backend``).

    Returns:
        The quantized copy, in eval mode and with ``requires_grad=False`` on every parameter (on CPU
        when the tables were gathered from ranks); None on the ranks other than ``dst`` of a
        sharded model.

    Raises:
        ValueError: the model has no embedding collection, or a state-dict entry is missing or has
            the wrong shape; KeyError: ``per_table`` names an unknown table.
    """
    kernel_backend = resolve_kernel_backend(kernel_backend, "quantize", backend=backend, use_fbgemm=use_fbgemm)
    root = unwrap_model_parallel(model)
    found = _collections(root)
    if not found:
        raise ValueError(
            f"{type(root).__name__} has no EmbeddingBagCollection or EmbeddingCollection to quantize; pass the "
            "model that holds the float (or sharded) tables"
        )
    tiered = sorted(
        {str(n) for f in found for m in f.module.modules() if getattr(m, "tiered", False) for n in getattr(m, "table_names", [])}
    )
    if tiered:
        raise ValueError(refuse_tiered_export(tiered))
    known = set().union(*(_table_names(f) for f in found))
    unknown = sorted(set(per_table or {}) - known)
    if unknown:
        raise KeyError(f"per_table names tables {unknown} that the model does not have; its tables are {sorted(known)}")
    gathering = state_dict is None and any(f.sharded for f in found)
    receiving = True
    if gathering:
        _, rank, world_size = sharding_group(root)
        if dst is not None and (isinstance(dst, bool) or not isinstance(dst, int) or not 0 <= dst < world_size):
            raise ValueError(f"dst must be None (every rank) or a rank in [0, {world_size}), got {dst!r}")
        receiving = dst is None or rank == dst
    full_state = dict(state_dict) if state_dict is not None else None
    replacements: dict[int, nn.Module] = {}
    for f in found:
        names = _table_names(f)
        mine = {k: v for k, v in (per_table or {}).items() if k in names}
        if f.sharded and full_state is None and isinstance(f.module, ShardedCollectionBase):
            replacement = quantize_sharded_collection(f.module, dtype, mine, row_alignment, kernel_backend, dst)
        else:
            prefix = f"{f.path}." if f.path else ""
            module = _with_managed_state(f.module, full_state, prefix)
            cls: type[_QuantCollection] = _MANAGED.get(type(f.module)) or (
                QuantEmbeddingBagCollection if f.pooled else QuantEmbeddingCollection
            )
            replacement = cls.from_float(module, dtype=dtype, per_table=mine, row_alignment=row_alignment,
                                         kernel_backend=kernel_backend, state_dict=full_state, prefix=prefix)
        if replacement is not None:
            replacements[id(f.module)] = replacement
    if not receiving:
        return None
    # deepcopy with the collections pre-seeded in the memo: float (or sharded) tables are never copied
    quantized = replacements[id(root)] if id(root) in replacements else copy.deepcopy(root, dict(replacements))
    if full_state is not None:
        _load_dense(quantized, full_state, found)
    if gathering:
        quantized = quantized.to(torch.device("cpu"))
    if quantize_dense:
        quantized = quantize_dense_layers(quantized)
    # A serving copy: no parameter needs a gradient, so eager calls take the same (no-grad) code
    # paths as the exported artifact and give the same numbers.
    quantized.requires_grad_(False)
    return quantized.eval()


def _with_managed_state(
    module: nn.Module, state_dict: Mapping[str, torch.Tensor] | None, prefix: str
) -> nn.Module:
    """A managed-collision collection carrying the id maps of ``state_dict`` (a copy; the float model
    is not modified), or ``module`` itself when there is nothing to load."""
    if state_dict is None or type(module) not in _MANAGED:
        return module
    key = f"{prefix}_managed_collision_collection."
    managed = {k[len(key) :]: v for k, v in state_dict.items() if k.startswith(key)}
    mcc: Any = copy.deepcopy(module._managed_collision_collection)
    for table, mc in list(mcc._managed_collision_modules.items()):
        if any(t.is_meta for t in mc.buffers()):  # a model built on meta (export_from_checkpoint): made real first
            mcc._managed_collision_modules[table] = mc.on_device("cpu")
    mcc.load_state_dict(managed)
    twin: nn.Module = type(module)(module._embedding_module, mcc, module.return_remapped_features, module._reset_seed)
    return twin


def _load_dense(model: nn.Module, state_dict: Mapping[str, torch.Tensor], found: list[_Found]) -> None:
    """Load every entry of ``state_dict`` that is not a table into ``model``; raise on missing dense weights."""
    table_keys = set()
    managed_prefixes = []
    for f in found:
        prefix = f"{f.path}." if f.path else ""
        attr = "embedding_bags" if f.pooled else "embeddings"
        inner = "_embedding_module." if type(f.module) in _MANAGED or f.sharded and hasattr(f.module, "gather_unsharded") else ""
        table_keys |= {f"{prefix}{inner}{attr}.{name}.weight" for name in _table_names(f)}
        if inner:
            managed_prefixes.append(f"{prefix}_managed_collision_collection.")
    dense_keys = [k for k in model.state_dict()
                  if k not in table_keys and not any(k.startswith(p) for p in managed_prefixes)]  # fmt: skip
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
