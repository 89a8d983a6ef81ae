"""Quantized managed-collision collections: frozen id maps in front of quantized tables.

``quantize(model)`` turns a ``ManagedCollisionEmbeddingBagCollection`` (``...EmbeddingCollection``)
into :class:`QuantManagedCollisionEmbeddingBagCollection` (:class:`QuantManagedCollisionEmbeddingCollection`):
the tables become int8 / int4 / fp16 rows, and the managed-collision modules become their frozen
remappers (``lightrec.modules.managed_collision.serving``) -- no insertion, no eviction, unknown ids
to a defined row. The forward keeps the float module's contract, ``kjt -> (embeddings, remapped KJT
or None)``, so the model around it runs unchanged; torchrec's ``QuantManagedCollisionEmbeddingCollection``
returns the embeddings alone (docs/managed-collisions.md). torchrec keeps these classes in
``torchrec.quant.embedding_modules``; ``lightrec.quant.embedding_modules`` re-exports them.
"""

# No `from __future__ import annotations`: fx copies forward() annotations into traced code.

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn
from typing_extensions import Self

from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from lightrec.modules.managed_collision.serving import (
    CollisionCollectionLike,
    FrozenManagedCollisionCollection,
)
from lightrec.quant.collection_base import QuantCollectionBase
from lightrec.quant.embedding_collection import QuantEmbeddingCollection
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__all__ = ["QuantManagedCollisionEmbeddingBagCollection", "QuantManagedCollisionEmbeddingCollection"]


def _quant_class(tables_attr: str) -> type[QuantCollectionBase]:
    """The quantized collection storing tables under ``tables_attr`` (``embedding_bags``: the pooled
    one, defined in ``embedding_modules.py``, which re-exports this file's classes -- hence no import)."""
    for cls in QuantCollectionBase.__subclasses__():
        if cls.TABLES_ATTR == tables_attr:
            return cls
    raise RuntimeError(f"no quantized collection stores {tables_attr!r}; import lightrec.quant first")


def _frozen(collection: nn.Module) -> FrozenManagedCollisionCollection:
    if isinstance(collection, FrozenManagedCollisionCollection):
        return collection
    if not isinstance(collection, CollisionCollectionLike):
        raise TypeError(
            f"managed_collision_collection must be a ManagedCollisionCollection, got {type(collection).__name__}"
        )
    return FrozenManagedCollisionCollection.from_collection(collection)


class _QuantManagedBase(nn.Module):
    """The frozen remappers, then the quantized collection (see the module docstring)."""

    _tables_attr = "embedding_bags"
    _embedding_module: Any  # the quantized collection (its methods are typed loosely by nn.Module)
    _managed_collision_collection: FrozenManagedCollisionCollection

    def __init__(
        self,
        embedding_module: nn.Module,
        managed_collision_collection: nn.Module,
        return_remapped_features: bool = False,
    ) -> None:
        super().__init__()
        self._embedding_module = embedding_module
        self._managed_collision_collection = _frozen(managed_collision_collection)
        self._return_remapped_features = return_remapped_features

    def feature_names(self) -> List[str]:
        return list(self._managed_collision_collection.feature_names())

    def id_spaces(self) -> Dict[str, int]:
        """``{table: input_hash_size}`` of the managed tables (0: any non-negative id)."""
        return dict(self._managed_collision_collection.id_spaces)

    @classmethod
    def from_float(
        cls,
        module: nn.Module,
        dtype: Optional[object] = None,
        per_table: Optional[Dict[str, object]] = None,
        row_alignment: int = 16,
        kernel_backend: str = "auto",
        state_dict: Optional[Dict[str, torch.Tensor]] = None,
        prefix: str = "",
        *,
        use_fbgemm: Optional[bool] = None,
        backend: Optional[str] = None,
    ) -> Self:
        """Quantize a float managed-collision collection (its tables, and a snapshot of its id maps).

        ``kernel_backend`` (``use_fbgemm`` / ``backend``: its deprecated spellings): the quantized
        tables' lookup kernel, as in ``QuantEmbeddingBagCollection.from_float``. ``state_dict`` /
        ``prefix``: take the tables from ``state_dict`` (keys ``<prefix>_embedding_module.<attr>.<t>.weight``)
        instead of the module; the id maps are always the module's (load the trained state into it first).
        """
        embedding = getattr(module, "_embedding_module", None)
        mcc = getattr(module, "_managed_collision_collection", None)
        if embedding is None or mcc is None:
            raise TypeError(f"{cls.__name__}.from_float needs a managed-collision collection, got {type(module).__name__}")
        quantized = _quant_class(cls._tables_attr).from_float(
            embedding, dtype=dtype, per_table=per_table, row_alignment=row_alignment, kernel_backend=kernel_backend,
            state_dict=state_dict, prefix=f"{prefix}_embedding_module.", use_fbgemm=use_fbgemm, backend=backend,
        )  # fmt: skip
        return cls(quantized, mcc, bool(getattr(module, "return_remapped_features", False)))


class QuantManagedCollisionEmbeddingBagCollection(_QuantManagedBase):
    """Quantized pooled tables behind frozen managed collisions.

    Args:
        embedding_bag_collection: a ``QuantEmbeddingBagCollection``.
        managed_collision_collection: a ``ManagedCollisionCollection`` (snapshotted) or its frozen form.
        return_remapped_features: also return the remapped KJT.
    """

    _tables_attr = "embedding_bags"

    def __init__(
        self,
        embedding_bag_collection: nn.Module,
        managed_collision_collection: nn.Module,
        return_remapped_features: bool = False,
    ) -> None:
        super().__init__(embedding_bag_collection, managed_collision_collection, return_remapped_features)

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        return list(self._embedding_module.embedding_bag_configs())

    def is_weighted(self) -> bool:
        return bool(self._embedding_module.is_weighted())

    def forward(self, features: KeyedJaggedTensor) -> Tuple[KeyedTensor, Optional[KeyedJaggedTensor]]:
        remapped = self._managed_collision_collection(features)
        pooled = self._embedding_module(remapped)
        if self._return_remapped_features:
            return pooled, remapped
        return pooled, None


class QuantManagedCollisionEmbeddingCollection(_QuantManagedBase):
    """Quantized sequence tables behind frozen managed collisions.

    Takes either lightrec's arguments ``(embedding_collection, managed_collision_collection,
    return_remapped_features)`` or torchrec's ``(tables, device, ..., managed_collision_collection=,
    return_remapped_features=)`` (the tables are then allocated empty, to be loaded).
    """

    _tables_attr = "embeddings"

    def __init__(
        self,
        embedding_collection: Any,
        managed_collision_collection: Optional[nn.Module] = None,
        return_remapped_features: bool = False,
        device: Optional[torch.device] = None,
        **quant_kwargs: Any,
    ) -> None:
        if isinstance(embedding_collection, list):  # torchrec's form: the tables
            quant_kwargs.pop("need_indices", None)
            output_dtype = quant_kwargs.pop("output_dtype", torch.float)
            if output_dtype != torch.float:  # as quantize_embeddings: dropping it would return float32 unasked
                raise ValueError(
                    f"QuantManagedCollisionEmbeddingCollection(output_dtype={output_dtype}): lightrec's quantized "
                    "lookups return float32; leave output_dtype=torch.float and convert the output afterwards"
                )
            embedding_collection = QuantEmbeddingCollection(embedding_collection, device=device, **quant_kwargs)
        if managed_collision_collection is None:
            raise ValueError("QuantManagedCollisionEmbeddingCollection needs managed_collision_collection=...")
        super().__init__(embedding_collection, managed_collision_collection, return_remapped_features)

    def embedding_configs(self) -> List[EmbeddingConfig]:
        return list(self._embedding_module.embedding_configs())

    def forward(
        self, features: KeyedJaggedTensor
    ) -> Tuple[Dict[str, JaggedTensor], Optional[KeyedJaggedTensor]]:
        remapped = self._managed_collision_collection(features)
        rows = self._embedding_module(remapped)
        if self._return_remapped_features:
            return rows, remapped
        return rows, None
