"""``RecipeModule``: a ``RecModule`` whose tables are sized from the data (public API for recipes).

A DataModule knows its features and their cardinalities but not the width the model wants, so a
recipe's ``tables`` argument is a list of :data:`DataTableSpec` dicts::

    {"name": "t_cat_0", "num_embeddings": 1460, "feature_names": ["cat_0"]}

:class:`RecipeModule`, the recipes' base class, fills it from the trainer's DataModule with
:func:`table_specs_of` in ``configure_model`` -- after ``prepare_data`` and ``setup`` ran, the
Lightning way, so a DataModule may create or preprocess its data in ``prepare_data`` (Criteo's
``raw_inputs``) and still size the tables. The sizes land in the checkpoint's hyper-parameters, so
``load_from_checkpoint`` rebuilds the same tables without the data. ``RecipeCLI`` links
:func:`dense_width_of` (known without reading data) into ``dense_in_features``;
:func:`table_configs_from_specs` gives the model its ``EmbeddingBagConfig`` s at its own width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from lightrec.data import CriteoDataModule, MovieLensDataModule, SyntheticCriteo
from lightrec.data.criteo.spec import INT_FEATURE_COUNT
from lightrec.lightning.contracts import DenseWidthData, TableDescribingData
from lightrec.lightning.rec_module import RecModule
from lightrec.modules import EmbeddingBagConfig

__all__ = [
    "DataTableSpec",
    "RecipeModule",
    "dense_width_of",
    "table_configs_from_specs",
    "table_specs_of",
]

DataTableSpec = dict[str, Any]
"""``{"name": str, "num_embeddings": int, "feature_names": list[str]}`` -- one table, any width."""


def table_specs_of(datamodule: object) -> list[DataTableSpec]:
    """Table specs of a DataModule with ``table_configs(embedding_dim)`` (every lightrec one has it).

    Raises:
        TypeError: the DataModule cannot describe its tables.
    """
    if not isinstance(datamodule, TableDescribingData):
        raise TypeError(
            f"the recipe needs a DataModule with a table_configs(embedding_dim) method to size the "
            f"embedding tables; {type(datamodule).__name__} has none. Add one (see lightrec.data) or "
            f"set model.tables explicitly"
        )
    return [
        {"name": c.name, "num_embeddings": int(c.num_embeddings), "feature_names": list(c.feature_names)}
        for c in datamodule.table_configs(1)
    ]


def dense_width_of(datamodule: pl.LightningDataModule) -> int:
    """Number of dense features ``I`` the DataModule's batches carry."""
    if isinstance(datamodule, DenseWidthData):
        return int(datamodule.num_dense_features)
    if isinstance(datamodule, (SyntheticCriteo, CriteoDataModule)):
        return INT_FEATURE_COUNT
    if isinstance(datamodule, MovieLensDataModule):
        return 0
    # An unknown DataModule: look at one batch (its setup must be cheap enough to run twice).
    datamodule.setup("fit")
    return int(next(iter(datamodule.train_dataloader())).dense_features.shape[1])


def table_configs_from_specs(
    specs: Sequence[DataTableSpec], embedding_dim: int, owner: str = "the model"
) -> list[EmbeddingBagConfig]:
    """``EmbeddingBagConfig`` of every spec, all ``embedding_dim`` wide.

    Raises:
        ValueError: ``embedding_dim`` is not a positive int, there are no specs (``owner`` was not run
            through its recipe), or a spec lacks a key or is not a dict.
    """
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim <= 0:
        raise ValueError(f"embedding_dim must be a positive int, got {embedding_dim!r}")
    if not specs:
        raise ValueError(
            f"{owner} has no tables: run it through its recipe (which links the DataModule's tables) "
            "or pass tables=[{name, num_embeddings, feature_names}, ...]"
        )
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
    """The recipes' base class: a ``RecModule`` whose tables are sized from the data.

    Takes ``tables`` (empty: filled from the trainer's DataModule in ``configure_model``, after
    ``prepare_data`` / ``setup``) and ``embedding_dim``, and gives ``table_configs()``; every other
    argument is ``RecModule``'s.
    """

    def __init__(
        self, tables: list[DataTableSpec] | None = None, embedding_dim: int = 16, **rec_module_kwargs: Any
    ) -> None:
        super().__init__(**rec_module_kwargs)
        self.tables = list(tables or [])
        self.embedding_dim = embedding_dim

    def table_configs(self) -> list[EmbeddingBagConfig]:
        return table_configs_from_specs(self.tables, self.embedding_dim, type(self).__name__)

    def check_datamodule(self, datamodule: object) -> None:
        """Raise ``ValueError`` naming the fix when ``datamodule`` is the wrong kind of data for this
        recipe. ``lightrec run`` calls it before any rank starts, and ``configure_model`` before the
        tables are sized; recipes extend it.

        Here: tables given explicitly (``--model.tables``) must read features the data has (they
        failed at the first batch, on every rank, with the collection's missing-feature error). The
        data's features come from its ``table_configs``: free for the synthetic and Criteo data, a read
        of the ratings for real MovieLens -- done only when tables were given.
        """
        if not self.tables or not isinstance(datamodule, TableDescribingData):
            return
        available = list(dict.fromkeys(f for spec in table_specs_of(datamodule) for f in spec["feature_names"]))
        for spec in self.tables:
            missing = [f for f in spec.get("feature_names", []) if f not in available]
            if missing:
                raise ValueError(
                    f"table {spec.get('name')!r} of --model.tables reads features {missing} that "
                    f"{type(datamodule).__name__} does not have; its features are {available} (leave "
                    "model.tables out to size the tables from the data)"
                )

    def size_tables_from(self, datamodule: object) -> None:
        """Take the tables from ``datamodule`` (``table_specs_of``) unless they are set already.

        The specs are also stored in ``hparams``, so checkpoints rebuild the same tables.
        """
        if not self.tables:
            self.tables = table_specs_of(datamodule)
            self.hparams["tables"] = self.tables

    @override
    def configure_model(self) -> None:
        """Size the tables from the trainer's DataModule (its data is prepared by now), then build."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if self.model is None and datamodule is not None:
            self.check_datamodule(datamodule)
            if not self.tables:
                self.size_tables_from(datamodule)
        super().configure_model()
