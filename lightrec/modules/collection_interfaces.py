"""The interfaces of embedding collections (torchrec's ``EmbeddingBagCollectionInterface`` and
``EmbeddingCollectionInterface``, at ``torchrec.modules.embedding_modules``), and the naming rule of
their outputs.

Code that accepts "any pooled collection" -- the float, quantized and fused ones, or a user's own --
tests ``isinstance(module, EmbeddingBagCollectionInterface)`` and reads it through these methods
only. lightrec's ``EmbeddingBagCollection``, ``QuantEmbeddingBagCollection`` and
``FusedEmbeddingBagCollection`` implement the first, ``EmbeddingCollection`` the second.

Output names (:func:`embedding_names_by_table`)::

    tables  t1: features [f, g]     t2: features [g]
    names   t1: [f, g@t1]           t2: [g@t2]        (g is read by two tables, so it is qualified)
"""

import abc
from collections.abc import Sequence

from torch import nn

from lightrec.modules.embedding_configs import BaseEmbeddingConfig, EmbeddingBagConfig, EmbeddingConfig
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__all__ = [
    "EmbeddingBagCollectionInterface",
    "EmbeddingCollectionInterface",
    "embedding_names_by_table",
    "get_embedding_names_by_table",
]


def embedding_names_by_table(tables: Sequence[BaseEmbeddingConfig]) -> list[list[str]]:
    """Output key of each (table, feature): the feature name, or ``feature@table`` for a feature
    that several tables read (torchrec's naming, so outputs stay unique)."""
    count: dict[str, int] = {}
    for t in tables:
        for f in t.feature_names:
            count[f] = count.get(f, 0) + 1
    return [[f if count[f] == 1 else f"{f}@{t.name}" for f in t.feature_names] for t in tables]


# torchrec's name for it
get_embedding_names_by_table = embedding_names_by_table


class EmbeddingBagCollectionInterface(abc.ABC, nn.Module):
    """A collection of pooled tables: ``KeyedJaggedTensor`` -> ``KeyedTensor`` ``[B, sum D]``."""

    @abc.abstractmethod
    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pool each feature's ids of every sample."""

    @abc.abstractmethod
    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        """The tables, in output order."""

    @abc.abstractmethod
    def is_weighted(self) -> bool:
        """Whether the per-id weights of the input weigh the pooling."""


class EmbeddingCollectionInterface(abc.ABC, nn.Module):
    """A collection of unpooled tables: ``KeyedJaggedTensor`` -> ``{feature: JaggedTensor}`` whose
    values are ``[ids, D]``."""

    @abc.abstractmethod
    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        """Look up every id of every feature."""

    @abc.abstractmethod
    def embedding_configs(self) -> list[EmbeddingConfig]:
        """The tables, in output order."""

    def need_indices(self) -> bool:
        """Whether each output ``JaggedTensor`` carries the ids as its weights (default False)."""
        return False

    def embedding_dim(self) -> int:
        """The embedding dim every table shares.

        Raises:
            ValueError: the tables have different dims (or there are none).
        """
        dims = sorted({t.embedding_dim for t in self.embedding_configs()})
        if len(dims) != 1:
            raise ValueError(
                f"{type(self).__name__}.embedding_dim(): the tables have embedding dims {dims}, not one shared dim; "
                "read each table's dim from embedding_configs()"
            )
        return dims[0]

    def embedding_names_by_table(self) -> list[list[str]]:
        """The output key of each table's features (:func:`embedding_names_by_table`)."""
        return embedding_names_by_table(self.embedding_configs())
