"""DeepFM click-through-rate training on MovieLens (rating >= 4 is a click) — LightningCLI recipe.

By default it trains offline on the built-in synthetic MovieLens set (ml-100k's shape, a planted
preference signal); a real release is one option away (``data.init_args.data_dir``: ml-100k,
ml-1m, ml-20m or ml-25m unpacked)::

    lightrec run deepfm                                 # synthetic MovieLens, no download
    python recipes/deepfm.py fit --config recipes/configs/deepfm_movielens.yaml
    mkdir -p data && cd data && curl -LO https://files.grouplens.org/datasets/movielens/ml-100k.zip \
        && unzip ml-100k.zip && cd ..
    lightrec run deepfm --data.init_args.data_dir data/ml-100k

Sparse fields: ``userId``, ``gender``, ``age``, ``occupation``, ``movieId``, ``genres`` (multi-hot);
no dense features. Ends with the test AUC / NE and where the logs and checkpoints are.
``lightrec cp deepfm my_dir`` copies this file and its config for editing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lightrec.lightning.recipe import DataTableSpec, RecipeModule, run_recipe
from lightrec.models import FieldDeepFM
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["DeepFMModule", "main"]


class DeepFMModule(RecipeModule):
    """DeepFM (first-order + factorization machine + deep MLP over shared field embeddings).

    ``RecipeModule`` sizes the tables from the data and ``RecModule`` builds the model in
    ``configure_model`` from :meth:`table_configs` and
    :meth:`build_model`: sharded tables on ``meta`` under ``RecStrategy``, fused tables otherwise.

    Args:
        tables: table specs; empty: sized from the DataModule when the model is built.
        dense_in_features: number of dense features (linked; 0 for MovieLens).
        embedding_dim: width ``D`` of every field embedding.
        deep_layer_sizes: hidden widths of the deep MLP (a linear layer to one logit follows).
        dense_lr: learning rate of the dense (adagrad) optimizer.
        **rec_module_kwargs: everything else ``RecModule`` takes: the tables' fused optimizer
            (``embedding_*``), ``dense_optimizer`` and the LR schedule of both.
    """

    def __init__(
        self,
        tables: list[DataTableSpec] | None = None,
        dense_in_features: int = 0,
        embedding_dim: int = 16,
        deep_layer_sizes: list[int] = [64, 32],  # noqa: B006 - LightningCLI shows list defaults
        dense_lr: float = 0.02,
        **rec_module_kwargs: Any,
    ) -> None:
        super().__init__(tables=tables, embedding_dim=embedding_dim, dense_lr=dense_lr, **rec_module_kwargs)
        self.save_hyperparameters()
        self.dense_in_features = dense_in_features
        self.deep_layer_sizes = list(deep_layer_sizes)

    def build_model(self, embedding_bag_collection: nn.Module) -> nn.Module:
        """The model around the given tables (``RecModule`` hands in the collection for the strategy)."""
        return FieldDeepFM(embedding_bag_collection, self.dense_in_features, self.deep_layer_sizes)

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        """``[B, I]`` dense (``[B, 0]`` for MovieLens) + KJT -> ``[B, 1]`` logits."""
        return self.built_model()(dense_features, sparse_features)


def main(args: list[str] | None = None) -> Any:
    """Run the recipe: ``args`` are LightningCLI arguments (default ``sys.argv[1:]``)."""
    return run_recipe(DeepFMModule, "deepfm_movielens.yaml", __file__, args)


if __name__ == "__main__":
    main()
