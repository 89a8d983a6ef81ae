"""``SparseArch``: pooled sparse features as a ``[B, F, D]`` stack, the input of interactions.

Shared by DLRM, DLRM-DCN and DeepFM, which all treat every sparse feature as one ``D``-wide
field. The collection's ``KeyedTensor`` ``[B, F * D]`` is laid out feature-major::

    values [B, F*D]  | f_0: cols 0..D-1 | f_1: cols D..2D-1 | ... |
    -> view [B, F, D]: row f of sample b is feature f's pooled embedding

The feature order is the one of ``embedding_bag_configs()`` (tables in order, each table's
``feature_names`` in order), which is what ``EmbeddingBagCollection`` returns. A collection that
returns its keys in another order (e.g. a sharded one) is reordered by name.
"""

import torch
from torch import nn

from lightrec.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = ["SparseArch", "feature_names_and_dims"]


def feature_names_and_dims(embedding_bag_collection: object) -> tuple[list[str], list[int], list[str]]:
    """Feature names, their embedding dims and their table names, in the collection's output order.

    Raises:
        TypeError: the argument has no ``embedding_bag_configs()`` (not an embedding bag collection).
    """
    get_configs = getattr(embedding_bag_collection, "embedding_bag_configs", None)
    if not callable(get_configs):
        raise TypeError(
            "embedding_bag_collection must be an EmbeddingBagCollection (or a sharded one) with an "
            f"embedding_bag_configs() method, got {type(embedding_bag_collection).__name__}"
        )
    names: list[str] = []
    dims: list[int] = []
    tables: list[str] = []
    for config in get_configs():
        for feature in config.feature_names:
            names.append(feature)
            dims.append(config.embedding_dim)
            tables.append(config.name)
    return names, dims, tables


def _stack_pooled(pooled: KeyedTensor, feature_names: list[str], dim: int) -> torch.Tensor:
    """``KeyedTensor [B, F*D]`` -> ``[B, F, D]`` in ``feature_names`` order."""
    if pooled.keys() == feature_names:
        values = pooled.values()
    else:
        blocks: list[torch.Tensor] = []
        for name in feature_names:
            blocks.append(pooled[name])
        values = torch.cat(blocks, dim=1)
    return values.reshape(-1, len(feature_names), dim)


# Recorded as one call under fx: comparing the (runtime) keys cannot be traced symbolically, and
# this keeps a collection treated as a leaf module traceable end to end.
torch.fx.wrap("_stack_pooled")


class SparseArch(nn.Module):
    """Looks up the sparse features and stacks their pooled embeddings.

    Args:
        embedding_bag_collection: an ``EmbeddingBagCollection`` whose tables all have the same
            ``embedding_dim`` ``D``; it may be on ``meta`` (only its configs are read here).

    Shapes:
        ``forward(features: KJT with stride B) -> [B, F, D]``, ``F`` = number of features.

    Raises:
        ValueError: the collection has no features, or its tables have different dims.
    """

    def __init__(self, embedding_bag_collection: nn.Module) -> None:
        super().__init__()
        names, dims, tables = feature_names_and_dims(embedding_bag_collection)
        if len(names) == 0:
            raise ValueError("embedding_bag_collection has no features; give its tables feature_names")
        if len(set(dims)) != 1:
            per_table = sorted({f"{t}: {d}" for t, d in zip(tables, dims, strict=True)})
            raise ValueError(
                "every sparse feature must have the same embedding_dim (the interaction stacks them "
                f"into [B, F, D]), got tables with dims {{{', '.join(per_table)}}}; give all tables "
                "one embedding_dim"
            )
        self.embedding_bag_collection = embedding_bag_collection
        self._feature_names = names
        self._embedding_dim = dims[0]

    @property
    def sparse_feature_names(self) -> list[str]:
        return list(self._feature_names)

    @property
    def num_sparse_features(self) -> int:
        return len(self._feature_names)

    @property
    def embedding_dim(self) -> int:
        return self._embedding_dim

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """``KJT (stride B) -> [B, F, D]``."""
        pooled = self.embedding_bag_collection(features)
        if isinstance(pooled, tuple):  # a managed-collision collection: (embeddings, remapped KJT or None)
            pooled = pooled[0]
        return _stack_pooled(pooled, self._feature_names, self._embedding_dim)
