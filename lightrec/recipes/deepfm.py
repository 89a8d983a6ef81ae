"""DeepFM click-through-rate training on MovieLens (rating >= 4 is a click) — LightningCLI recipe.

Needs a MovieLens release unpacked under ``data/`` (ml-100k by default; ml-1m / ml-20m / ml-25m
work the same: set ``data.init_args.data_dir``)::

    mkdir -p data && cd data && curl -LO https://files.grouplens.org/datasets/movielens/ml-100k.zip \
        && unzip ml-100k.zip && cd ..
    lightrec run deepfm
    python -m lightrec.recipes.deepfm fit --config lightrec/recipes/configs/deepfm_movielens.yaml
    lightrec run deepfm --data.init_args.data_dir data/ml-1m

Sparse fields: ``userId``, ``gender``, ``age``, ``occupation``, ``movieId``, ``genres`` (multi-hot);
no dense features. Ends with the test AUC / NE and where the logs and checkpoints are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lightrec.models import DeepFM
from lightrec.recipes._cli import run_recipe
from lightrec.recipes._common import RecipeModule, TableSpec
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["DeepFMModule", "main"]


class DeepFMModule(RecipeModule):
    """DeepFM (first-order + factorization machine + deep MLP over shared field embeddings).

    Args:
        tables: table specs, linked from the DataModule by the recipe.
        dense_in_features: number of dense features (linked; 0 for MovieLens).
        embedding_dim: width ``D`` of every field embedding.
        deep_layer_sizes: hidden widths of the deep MLP (a linear layer to one logit follows).
        embedding_optimizer / embedding_lr / embedding_eps: the fused optimizer of the tables.
        dense_optimizer / dense_lr / warmup_steps / decay_start_step / decay_steps / decay_power:
            the dense optimizer and the LR schedule of both (``RecModule``).
    """

    def __init__(
        self,
        tables: list[TableSpec] | None = None,
        dense_in_features: int = 0,
        embedding_dim: int = 16,
        deep_layer_sizes: list[int] = [64, 32],  # noqa: B006 - LightningCLI shows list defaults
        embedding_optimizer: str = "rowwise_adagrad",
        embedding_lr: float = 0.05,
        embedding_eps: float = 1e-8,
        dense_optimizer: str = "adagrad",
        dense_lr: float = 0.02,
        warmup_steps: int = 0,
        decay_start_step: int | None = None,
        decay_steps: int = 0,
        decay_power: float = 2.0,
    ) -> None:
        super().__init__(
            tables=tables,
            embedding_dim=embedding_dim,
            embedding_optimizer=embedding_optimizer,
            embedding_lr=embedding_lr,
            embedding_eps=embedding_eps,
            dense_optimizer=dense_optimizer,
            dense_lr=dense_lr,
            warmup_steps=warmup_steps,
            decay_start_step=decay_start_step,
            decay_steps=decay_steps,
            decay_power=decay_power,
        )
        self.save_hyperparameters()
        self.dense_in_features = dense_in_features
        self.deep_layer_sizes = list(deep_layer_sizes)

    def build_model(self, embedding_bag_collection: nn.Module) -> nn.Module:
        return DeepFM(embedding_bag_collection, self.dense_in_features, self.deep_layer_sizes)

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        """``[B, I]`` dense (``[B, 0]`` for MovieLens) + KJT -> ``[B, 1]`` logits."""
        return self.built_model()(dense_features, sparse_features)


def main(args: list[str] | None = None) -> Any:
    """Run the recipe: ``args`` are LightningCLI arguments (default ``sys.argv[1:]``)."""
    return run_recipe(DeepFMModule, "deepfm_movielens.yaml", __file__, args)


if __name__ == "__main__":
    main()
