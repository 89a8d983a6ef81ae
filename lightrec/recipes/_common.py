"""What every recipe's ``RecModule`` shares: table specs from the data, the embedding collection
for the strategy in use, and the embedding optimizer.

A recipe model is built in ``configure_model``, not ``__init__``, because only then is the
strategy known:

* under ``RecStrategy`` (``trainer.strategy: lightrec``) the tables are an
  ``EmbeddingBagCollection`` on the ``meta`` device — no rank ever allocates a whole table; the
  strategy's ``DistributedModelParallel`` materialises each rank's shards. The weights carry an
  ``apply_optimizer_in_backward`` mark, which the sharders turn into the fused optimizer;
* otherwise (``strategy: auto``, one process) the tables are a ``FusedEmbeddingBagCollection``
  with the very same fused optimizer, so a single-process run trains with the same update rule
  as a sharded one (and runs the fast batched kernels).

The table sizes come from the DataModule through ``LightningCLI.link_arguments`` (see
``lightrec.recipes._cli``) and are saved as hyper-parameters, so ``load_from_checkpoint`` rebuilds
the model without the data.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lightrec.lightning import RecModule, RecStrategy
from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.optim import RowWiseAdagrad, apply_optimizer_in_backward

__all__ = [
    "EMBEDDING_OPTIMIZERS",
    "RecipeModule",
    "class_reference",
    "TableSpec",
    "dense_width_of",
    "table_configs_from_specs",
    "table_specs_of",
]

TableSpec = dict[str, Any]
"""``{"name": str, "num_embeddings": int, "feature_names": list[str]}`` — one table, any width."""

EMBEDDING_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adagrad": torch.optim.Adagrad,
    "rowwise_adagrad": RowWiseAdagrad,
    "adam": torch.optim.Adam,
}


def table_specs_of(datamodule: Any) -> list[TableSpec]:
    """Table specs of a DataModule with ``table_configs(embedding_dim)`` (every lightrec one has it).

    Raises:
        TypeError: the DataModule cannot describe its tables.
    """
    describe = getattr(datamodule, "table_configs", None)
    if not callable(describe):
        raise TypeError(
            f"the recipe needs a DataModule with a table_configs(embedding_dim) method to size the "
            f"embedding tables; {type(datamodule).__name__} has none. Add one (see lightrec.data) or "
            f"set model.tables explicitly"
        )
    return [
        {"name": c.name, "num_embeddings": int(c.num_embeddings), "feature_names": list(c.feature_names)}
        for c in describe(1)
    ]


def dense_width_of(datamodule: Any) -> int:
    """Number of dense features ``I`` the DataModule's batches carry."""
    width = getattr(datamodule, "num_dense_features", None)
    if isinstance(width, int):
        return width
    from lightrec.data import CriteoDataModule, MovieLensDataModule, SyntheticCriteo
    from lightrec.data.criteo_spec import INT_FEATURE_COUNT

    if isinstance(datamodule, (SyntheticCriteo, CriteoDataModule)):
        return INT_FEATURE_COUNT
    if isinstance(datamodule, MovieLensDataModule):
        return 0
    # An unknown DataModule: look at one batch (its setup must be cheap enough to run twice).
    datamodule.setup("fit")
    return int(next(iter(datamodule.train_dataloader())).dense_features.shape[1])


def table_configs_from_specs(specs: Sequence[TableSpec], embedding_dim: int) -> list[EmbeddingBagConfig]:
    """``EmbeddingBagConfig`` of every spec, all ``embedding_dim`` wide.

    Raises:
        ValueError: a spec lacks a key or is not a dict.
    """
    configs = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or not {"name", "num_embeddings", "feature_names"} <= set(spec):
            raise ValueError(
                f"model.tables[{i}] must be a dict with name, num_embeddings and feature_names, got {spec!r}"
            )
        configs.append(
            EmbeddingBagConfig(
                name=str(spec["name"]),
                num_embeddings=int(spec["num_embeddings"]),
                embedding_dim=embedding_dim,
                feature_names=list(spec["feature_names"]),
            )
        )
    return configs


class RecipeModule(RecModule):
    """``RecModule`` that builds its embedding tables for the strategy it runs under.

    Subclasses implement :meth:`build_model` (``EmbeddingBagCollection``-like module -> the model)
    and ``forward``; the model is ``self.model`` after ``configure_model``.

    Args:
        tables: table specs (linked from the DataModule by the recipe CLI; see :data:`TableSpec`).
        embedding_dim: width of every table.
        embedding_optimizer: fused optimizer of the tables: ``"rowwise_adagrad"`` (DLRM's), ``"adagrad"``,
            ``"sgd"`` or ``"adam"``.
        embedding_lr / embedding_eps: its learning rate and epsilon (the LR schedule scales the LR).
        **rec_module_kwargs: ``RecModule`` arguments (dense optimizer, LR schedule, metrics).
    """

    def __init__(
        self,
        tables: list[TableSpec] | None = None,
        embedding_dim: int = 16,
        embedding_optimizer: str = "rowwise_adagrad",
        embedding_lr: float = 0.05,
        embedding_eps: float = 1e-8,
        **rec_module_kwargs: Any,
    ) -> None:
        super().__init__(**rec_module_kwargs)
        if embedding_optimizer not in EMBEDDING_OPTIMIZERS:
            raise ValueError(
                f"embedding_optimizer must be one of {sorted(EMBEDDING_OPTIMIZERS)}, got {embedding_optimizer!r}"
            )
        if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim <= 0:
            raise ValueError(f"embedding_dim must be a positive int, got {embedding_dim!r}")
        self.tables = list(tables or [])
        self.embedding_dim = embedding_dim
        self.embedding_optimizer = embedding_optimizer
        self._embedding_optimizer_kwargs: dict[str, Any] = {"lr": embedding_lr}
        if embedding_optimizer != "sgd":
            self._embedding_optimizer_kwargs["eps"] = embedding_eps
        self.model: nn.Module | None = None

    # ------------------------------------------------------------------ building
    def table_configs(self) -> list[EmbeddingBagConfig]:
        """The model's tables (raises if the recipe was not given any)."""
        if not self.tables:
            raise ValueError(
                f"{type(self).__name__} has no tables: run it through its recipe (which links the "
                f"DataModule's tables) or pass tables=[{{name, num_embeddings, feature_names}}, ...]"
            )
        return table_configs_from_specs(self.tables, self.embedding_dim)

    def embedding_collection(self, sharded: bool) -> nn.Module:
        """The tables with their fused optimizer: on ``meta`` for sharding, else materialised and fused."""
        optimizer = EMBEDDING_OPTIMIZERS[self.embedding_optimizer]
        if sharded:
            ebc = EmbeddingBagCollection(tables=self.table_configs(), device="meta")
            # The mark names the fused optimizer the sharders build; nothing steps a meta tensor.
            apply_optimizer_in_backward(optimizer, ebc.parameters(), self._embedding_optimizer_kwargs, False)
            return ebc
        from lightrec.kernels import FusedEmbeddingBagCollection

        return FusedEmbeddingBagCollection(
            self.table_configs(), optimizer_type=optimizer, optimizer_kwargs=self._embedding_optimizer_kwargs
        )

    def fused_params(self) -> dict[str, Any]:
        """The tables' fused optimizer as torchrec-style ``fused_params`` (for sharders and the planner)."""
        from lightrec.optim import optimizer_class_to_spec

        spec = optimizer_class_to_spec(
            EMBEDDING_OPTIMIZERS[self.embedding_optimizer], self._embedding_optimizer_kwargs
        )
        return spec.to_fused_params()

    def build_model(self, embedding_bag_collection: nn.Module) -> nn.Module:
        """The model around the given tables (subclasses override)."""
        raise TypeError(f"{type(self).__name__} must override build_model(embedding_bag_collection)")

    def model_for_planning(self) -> nn.Module:
        """The model with ``meta`` tables, as ``RecStrategy`` would shard it (for ``lightrec plan``)."""
        return self.build_model(self.embedding_collection(sharded=True))

    def serving_model(self) -> nn.Module:
        """The trained model with plain ``EmbeddingBagCollection`` tables, on CPU, in eval mode.

        The input of ``lightrec.inference.quantize``/``export`` for an unsharded module (the fused
        collection's state-dict keys are the plain collection's, so the weights load one to one).
        """
        model = self.build_model(EmbeddingBagCollection(tables=self.table_configs(), device="cpu"))
        model.load_state_dict({k: v.detach().cpu() for k, v in self.built_model().state_dict().items()})
        return self.for_serving(model).eval()

    def serving_factory(self) -> nn.Module:
        """An untrained serving model with ``meta`` tables (``export_from_checkpoint``'s model factory)."""
        return self.for_serving(
            self.build_model(EmbeddingBagCollection(tables=self.table_configs(), device="meta"))
        )

    def for_serving(self, model: nn.Module) -> nn.Module:
        """The part of ``build_model``'s result that serves requests (the whole model by default)."""
        return model

    def _sharded_run(self) -> bool:
        trainer = self._trainer
        return trainer is not None and isinstance(trainer.strategy, RecStrategy)

    def configure_model(self) -> None:
        """Build ``self.model`` once: meta tables under ``RecStrategy``, fused tables otherwise."""
        if self.model is not None:
            return
        self.model = self.build_model(self.embedding_collection(sharded=self._sharded_run()))

    def built_model(self) -> nn.Module:
        """``self.model``, built on first use outside a Trainer (e.g. after ``load_from_checkpoint``)."""
        if self.model is None:
            self.configure_model()
        assert self.model is not None  # configure_model always sets it
        return self.model

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lets `lightrec export <checkpoint>` find the class that rebuilds this model.
        checkpoint["lightrec_module"] = class_reference(type(self))


def class_reference(cls: type) -> str:
    """``"package.module.Class"``, or ``"/abs/path/recipe.py:Class"`` for a class of a script run as a file."""
    module = cls.__module__
    if module == "__main__":
        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        if spec is None or not spec.name:
            return f"{os.path.abspath(main.__file__)}:{cls.__qualname__}"
        module = spec.name
    return f"{module}.{cls.__qualname__}"
