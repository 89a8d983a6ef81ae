"""DLRM and DLRM-DCNv2 click-through-rate training (LightningCLI recipe).

Default: synthetic Criteo-like data (no download), 26 tables capped at 100k rows, sharded over
2 CPU ranks by ``RecStrategy``; ends with the test AUC / NE, the Bayes-optimal AUC of the data and
where the TensorBoard logs and checkpoints are::

    lightrec run dlrm                                   # = each of the next three commands
    python recipes/dlrm.py fit --config recipes/configs/dlrm.yaml
    torchrun --nproc_per_node 2 recipes/dlrm.py fit --config recipes/configs/dlrm.yaml
    fabric run --accelerator cpu --devices 2 recipes/dlrm.py fit --config recipes/configs/dlrm.yaml
    lightrec run dlrm_dcn                               # DCN-v2 interaction
    lightrec run dlrm --config dlrm_criteo              # preprocessed Criteo (see the config's header)
    lightrec run dlrm --data parquet --data.path logs/ --data.label click   # your own Parquet event logs
    lightrec run dlrm --config dlrm_parquet             # Criteo converted to Parquet (lightrec data convert)
    lightrec run dlrm --devices 1 --trainer.strategy auto   # one process, no sharding
    lightrec run dlrm --config dlrm_managed             # raw 63-bit ids of a drifting vocabulary, managed collisions
    lightrec run dlrm_online                            # online: an unbounded drifting stream, progressive validation

Any ``--model.*``, ``--data.*`` or ``--trainer.*`` option of LightningCLI works, e.g.
``--trainer.max_steps 100 --model.embedding_dim 32``. ``lightrec cp dlrm my_dir`` copies this file and
its configs for editing; it imports public lightrec modules only, so the copy runs anywhere.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from lightrec.lightning.recipe import DataTableSpec, RecipeModule, run_recipe
from lightrec.models import DLRM, DLRM_DCN
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["DLRMModule", "main"]


class DLRMModule(RecipeModule):
    """DLRM (dot interaction) or DLRM-DCNv2 (``interaction="dcn"``) as a ``RecModule``.

    ``RecipeModule`` sizes the tables from the data and ``RecModule`` builds the model in
    ``configure_model`` from :meth:`table_configs` and
    :meth:`build_model`: sharded tables on ``meta`` under ``RecStrategy``, fused tables otherwise.

    Args:
        tables: table specs; empty: sized from the DataModule when the model is built.
        dense_in_features: number of dense features (linked from the DataModule).
        embedding_dim: width ``D`` of every table; equals ``dense_arch_layer_sizes[-1]``.
        dense_arch_layer_sizes: bottom MLP widths; when the last differs from ``embedding_dim`` it is
            set to it (the interaction multiplies dense and sparse vectors).
        over_arch_layer_sizes: top MLP widths, ending in 1 (one logit).
        interaction: ``"dot"`` (DLRM) or ``"dcn"`` (low-rank DCN-v2 cross net).
        dcn_num_layers / dcn_low_rank_dim: the cross net, for ``interaction="dcn"``.
        dense_lr: learning rate of the dense (adagrad) optimizer.
        managed_collisions: put the tables behind managed collisions (raw ids of any size get rows of
            their own, evicted as the vocabulary drifts): ``True`` or a dict of
            ``lightrec.modules.managed_collision.ManagedCollisionOptions`` settings (``eviction_policy``,
            ``eviction_interval``, ``buckets``, ...); None: plain tables. See docs/managed-collisions.md.
        **rec_module_kwargs: ``RecModule``'s: ``embedding_optimizer`` / ``embedding_lr`` / ``embedding_eps``,
            ``dense_optimizer``, the LR schedule (``warmup_steps``, ``decay_*``), ``metrics``.
    """

    def __init__(
        self,
        tables: list[DataTableSpec] | None = None,
        dense_in_features: int = 13,
        embedding_dim: int = 16,
        dense_arch_layer_sizes: list[int] = [64, 16],  # noqa: B006 - LightningCLI shows list defaults
        over_arch_layer_sizes: list[int] = [64, 32, 1],  # noqa: B006
        interaction: Literal["dot", "dcn"] = "dot",
        dcn_num_layers: int = 3,
        dcn_low_rank_dim: int = 16,
        dense_lr: float = 0.05,
        managed_collisions: dict[str, Any] | bool | None = None,
        **rec_module_kwargs: Any,
    ) -> None:
        super().__init__(
            tables=tables, embedding_dim=embedding_dim, dense_lr=dense_lr, managed_collisions=managed_collisions,
            **rec_module_kwargs,
        )  # fmt: skip
        if interaction not in ("dot", "dcn"):
            raise ValueError(f"interaction must be 'dot' or 'dcn', got {interaction!r}")
        if isinstance(dense_in_features, bool) or not isinstance(dense_in_features, int) or dense_in_features < 1:
            # linked from the data: 0 means the DataModule's batches carry no dense features at all
            raise ValueError(
                f"the dlrm recipe needs dense (continuous) features for DLRM's bottom MLP, but the data has "
                f"dense_in_features={dense_in_features!r} (MovieLens is sparse only): train it with the deepfm or "
                "two_tower recipe, or give dlrm data with dense features (lightrec.data.SyntheticCriteo, CriteoDataModule)"
            )
        if not over_arch_layer_sizes or over_arch_layer_sizes[-1] != 1:
            # RecModule's loss reads one logit per sample; [.., 2] failed at the first step inside BCE.
            raise ValueError(
                f"over_arch_layer_sizes must end in 1 (the recipe trains one click logit per sample with binary "
                f"cross-entropy), got {list(over_arch_layer_sizes)!r}; e.g. --model.over_arch_layer_sizes "
                f"'[{', '.join(str(w) for w in [*over_arch_layer_sizes[:-1], 1])}]'"
            )
        self.save_hyperparameters()
        self.dense_in_features = dense_in_features
        self.dense_arch_layer_sizes = [*dense_arch_layer_sizes[:-1], embedding_dim]
        self.over_arch_layer_sizes = list(over_arch_layer_sizes)
        self.interaction = interaction
        self.dcn = (dcn_num_layers, dcn_low_rank_dim)

    def build_model(self, embedding_bag_collection: nn.Module) -> nn.Module:
        """The model around the given tables (``RecModule`` hands in the collection for the strategy)."""
        common: dict[str, Any] = dict(
            embedding_bag_collection=embedding_bag_collection,
            dense_in_features=self.dense_in_features,
            dense_arch_layer_sizes=self.dense_arch_layer_sizes,
            over_arch_layer_sizes=self.over_arch_layer_sizes,
        )
        if self.interaction == "dcn":
            return DLRM_DCN(**common, dcn_num_layers=self.dcn[0], dcn_low_rank_dim=self.dcn[1])
        return DLRM(**common)

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        """``[B, I]`` dense + KJT -> ``[B, 1]`` logits."""
        return self.built_model()(dense_features, sparse_features)


def main(args: list[str] | None = None) -> Any:
    """Run the recipe: ``args`` are LightningCLI arguments (default ``sys.argv[1:]``)."""
    return run_recipe(DLRMModule, "dlrm.yaml", __file__, args)


if __name__ == "__main__":
    main()
