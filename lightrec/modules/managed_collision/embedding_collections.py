"""Embedding collections behind managed-collision tables (re-exported at torchrec's ``mc_embedding_modules`` path).

::

    mc_ebc = ManagedCollisionEmbeddingBagCollection(
        EmbeddingBagCollection(tables),                       # or FusedEmbeddingBagCollection
        ManagedCollisionCollection(modules, tables),
        return_remapped_features=False,
    )
    pooled, remapped = mc_ebc(kjt)     # (KeyedTensor [B, sum D], remapped KJT or None)

A forward remaps the raw ids (``ManagedCollisionCollection``), **re-initialises the rows whose ids
were evicted and resets their optimizer state** -- before the lookup, so a new id never sees an old
id's weights or momentum -- then looks the rows up. torchrec's unsharded module leaves evicted rows
as they are. Rows are reset:

* in a fused collection (``FusedEmbeddingBagCollection``...) through its kernels
  (``reset_embedding_rows``, every backend);
* in a plain collection: the weight, the state of optimizers attached with
  ``apply_optimizer_in_backward``, and of optimizers passed to :meth:`attach_optimizer` (an
  optimizer stepping the tables from outside, which the module cannot otherwise see).

``DistributedModelParallel`` shards these modules (``lightrec.distributed.mc_embedding_modules``).
"""

from __future__ import annotations

import torch
from torch import nn

from lightrec.modules.embedding_configs import BaseEmbeddingConfig, EmbeddingBagConfig, EmbeddingConfig
from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.modules.managed_collision.collection import ManagedCollisionCollection
from lightrec.modules.managed_collision.reset import reinit_values, reset_collection_rows, uniform_reset_seed
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__all__ = [
    "BaseManagedCollisionEmbeddingCollection",
    "ManagedCollisionEmbeddingBagCollection",
    "ManagedCollisionEmbeddingCollection",
]


def _same_tables(a: list[BaseEmbeddingConfig], b: list[BaseEmbeddingConfig]) -> str | None:
    """Why two table lists differ (None: they describe the same tables)."""
    if [t.name for t in a] != [t.name for t in b]:
        return f"tables {[t.name for t in a]} vs {[t.name for t in b]}"
    for x, y in zip(a, b, strict=True):
        if (x.num_embeddings, x.embedding_dim, list(x.feature_names)) != (y.num_embeddings, y.embedding_dim, list(y.feature_names)):
            return (f"table {x.name!r}: {x.num_embeddings}x{x.embedding_dim} reading {x.feature_names} vs "
                    f"{y.num_embeddings}x{y.embedding_dim} reading {y.feature_names}")  # fmt: skip
    return None


def _check_managed_collisions_first(
    module: nn.Module, state_dict: dict[str, object], prefix: str, *args: object
) -> None:
    """Load pre-hook of the collections: every managed-collision module checks its entries of
    ``state_dict`` (``ManagedCollisionModule.check_state_dict``) before anything is copied.

    Raises:
        ValueError: from the module whose entries do not fit (names the table and the fix).
    """
    collection = module._managed_collision_collection
    if not isinstance(collection, ManagedCollisionCollection):
        return  # the constructor refused anything else
    for path, child in collection.named_modules():
        if isinstance(child, ManagedCollisionModule):
            child.check_state_dict(state_dict, f"{prefix}_managed_collision_collection.{path}.")


class BaseManagedCollisionEmbeddingCollection(nn.Module):
    """An embedding collection and the managed-collision modules of its tables (module docstring).

    Args:
        embedding_module: the collection (plain or fused); its tables must be the
            ``ManagedCollisionCollection``'s.
        managed_collision_collection: one managed-collision module per table.
        return_remapped_features: also return the remapped KJT.
        reset_seed: seed of the re-initialisation of evicted rows (``reset.reinit_values``).
    """

    _configs_getter = "embedding_bag_configs"

    def __init__(
        self,
        embedding_module: nn.Module,
        managed_collision_collection: ManagedCollisionCollection,
        return_remapped_features: bool = False,
        reset_seed: int = 0,
    ) -> None:
        super().__init__()
        where = type(self).__name__
        getter = getattr(embedding_module, self._configs_getter, None)
        if not callable(getter):
            raise TypeError(f"{where} needs a collection with {self._configs_getter}(), got {type(embedding_module).__name__}")
        if not isinstance(managed_collision_collection, ManagedCollisionCollection):
            raise TypeError(f"{where}: managed_collision_collection must be a ManagedCollisionCollection, "
                            f"got {type(managed_collision_collection).__name__}")  # fmt: skip
        differ = _same_tables(list(getter()), managed_collision_collection.embedding_configs())
        if differ is not None:
            raise ValueError(f"{where}: the embedding collection and the ManagedCollisionCollection must hold the "
                             f"same tables; {differ}")  # fmt: skip
        self._embedding_module = embedding_module
        self._managed_collision_collection = managed_collision_collection
        self._return_remapped_features = return_remapped_features
        self._reset_seed = reset_seed
        self._table_configs = {c.name: c for c in getter()}
        self._optimizers: list[torch.optim.Optimizer] = []
        # Runs before the children load (torch loads a module, then its children in order): the
        # embedding tables come first, so a managed-collision state that does not fit must fail here,
        # before a table weight is copied, not in the managed-collision module after them.
        self.register_load_state_dict_pre_hook(_check_managed_collisions_first)

    @property
    def return_remapped_features(self) -> bool:
        return self._return_remapped_features

    def attach_optimizer(self, *optimizers: torch.optim.Optimizer) -> None:
        """Reset the rows' state in these optimizers too when rows are evicted (plain collections
        stepped by an outside optimizer; fused and in-backward optimizers are found automatically)."""
        self._optimizers.extend(optimizers)

    def feature_names(self) -> list[str]:
        return self._managed_collision_collection.feature_names()

    def forward(
        self, features: KeyedJaggedTensor
    ) -> tuple[KeyedTensor | dict[str, JaggedTensor], KeyedJaggedTensor | None]:
        """Remap, reset evicted rows, look up.

        Returns:
            ``(embeddings, remapped KJT or None)``: embeddings as the collection returns them.
        """
        remapped = self._managed_collision_collection(features)
        self.reset_evicted_rows(self._managed_collision_collection.evict())
        embeddings = self._embedding_module(remapped)
        return embeddings, (remapped if self._return_remapped_features else None)

    @torch.no_grad()
    def reset_evicted_rows(self, evictions: dict[str, torch.Tensor | None]) -> None:
        """Re-initialise ``{table: rows}`` and reset their optimizer state (see the module docstring)."""
        modules = self._managed_collision_collection.modules_by_table()
        draw_in_kernel = getattr(self._embedding_module, "reset_embedding_rows_uniform", None)
        fresh: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        drawn: dict[str, tuple[torch.Tensor, int, float, float]] = {}  # the kernels draw the same values
        for table, rows in evictions.items():
            if rows is None or rows.numel() == 0:
                continue
            module, config = modules[table], self._table_configs[table]
            bounds, first = module.reset_buckets()
            seed = uniform_reset_seed(config, module.current_iteration(), self._reset_seed, first)
            if callable(draw_in_kernel) and len(bounds) == 2 and seed is not None:
                drawn[table] = (rows, seed, config.get_weight_init_min(), config.get_weight_init_max())
                continue
            values = reinit_values(config, rows, module.current_iteration(), self._reset_seed, bounds, first)
            fresh[table] = (rows, values)
        if drawn and callable(draw_in_kernel):  # a fused collection with one bucket per table: one pass per table
            draw_in_kernel(drawn)
        if not fresh:
            return
        reset_all = getattr(self._embedding_module, "reset_embedding_rows_of_tables", None)
        reset = getattr(self._embedding_module, "reset_embedding_rows", None)
        if callable(reset_all):  # a fused collection: one kernel call for every table
            reset_all(fresh)
            return
        for table, (rows, values) in fresh.items():
            if callable(reset):
                reset(table, rows, values)
            else:
                reset_collection_rows(self._embedding_module, table, rows, values, self._optimizers)


class ManagedCollisionEmbeddingBagCollection(BaseManagedCollisionEmbeddingCollection):
    """Pooled tables behind managed collisions: ``kjt -> (KeyedTensor [B, sum D], remapped | None)``.

    Args:
        embedding_bag_collection: ``EmbeddingBagCollection`` (or a fused one).
        managed_collision_collection / return_remapped_features / reset_seed: see the base class.
    """

    def __init__(
        self,
        embedding_bag_collection: nn.Module,
        managed_collision_collection: ManagedCollisionCollection,
        return_remapped_features: bool = False,
        reset_seed: int = 0,
    ) -> None:
        super().__init__(embedding_bag_collection, managed_collision_collection, return_remapped_features, reset_seed)

    @property
    def _embedding_bag_collection(self) -> nn.Module:
        return self._embedding_module

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return [c for c in self._table_configs.values() if isinstance(c, EmbeddingBagConfig)]

    def is_weighted(self) -> bool:
        return bool(getattr(self._embedding_module, "is_weighted", lambda: False)())


class ManagedCollisionEmbeddingCollection(BaseManagedCollisionEmbeddingCollection):
    """Sequence tables behind managed collisions: ``kjt -> ({feature: JaggedTensor}, remapped | None)``.

    Args:
        embedding_collection: ``EmbeddingCollection`` (or a fused one).
        managed_collision_collection / return_remapped_features / reset_seed: see the base class.
    """

    _configs_getter = "embedding_configs"

    def __init__(
        self,
        embedding_collection: nn.Module,
        managed_collision_collection: ManagedCollisionCollection,
        return_remapped_features: bool = False,
        reset_seed: int = 0,
    ) -> None:
        super().__init__(embedding_collection, managed_collision_collection, return_remapped_features, reset_seed)

    @property
    def _embedding_collection(self) -> nn.Module:
        return self._embedding_module

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return [c for c in self._table_configs.values() if isinstance(c, EmbeddingConfig)]
