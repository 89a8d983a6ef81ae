"""Two-tower retrieval on MovieLens with in-batch negatives, logging recall@k — LightningCLI recipe.

Every positive (rating >= 4) user→movie pair of a batch is a training example; the other movies
of the batch are its negatives (a softmax over the batch). By default it trains offline on the
built-in synthetic MovieLens set (ml-100k's shape, a planted preference signal); real MovieLens is
one option away (ml-100k, or ml-1m / ml-20m / ml-25m the same way)::

    lightrec run two_tower                              # synthetic MovieLens, no download
    python recipes/two_tower.py fit --config recipes/configs/two_tower_movielens.yaml
    lightrec run two_tower --model.recall_k 50
    lightrec run two_tower --model.managed_collisions true   # id -> row maps with evictions (new users/movies)
    mkdir -p data && cd data && curl -LO https://files.grouplens.org/datasets/movielens/ml-100k.zip \
        && unzip ml-100k.zip && cd ..
    lightrec run two_tower --data.init_args.data_dir data/ml-100k

Query tower: ``userId``, ``gender``, ``age``, ``occupation``; candidate tower: ``movieId``,
``genres``. Ends with the test recall@k (among the batch's candidates) and the paths of the logs
and checkpoints. ``lightrec cp two_tower my_dir`` copies this file and its config for editing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchmetrics import Metric
from typing_extensions import override

from lightrec.data import Batch
from lightrec.data.parquet import ParquetDataModule
from lightrec.lightning.recipe import DataTableSpec, RecipeModule, run_recipe
from lightrec.metrics import DEFAULT_METRICS, RecallAtK
from lightrec.models import TwoTower, TwoTowerTrainTask
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["TwoTowerModule", "main"]


class TwoTowerModule(RecipeModule):
    """Query and candidate towers trained with an in-batch softmax; recall@k on val and test.

    ``RecipeModule`` sizes the tables from the data and ``RecModule`` builds the model in
    ``configure_model`` from :meth:`table_configs` and
    :meth:`build_model`: sharded tables on ``meta`` under ``RecStrategy``, fused tables otherwise.

    Args:
        tables: table specs; empty: sized from the DataModule when the model is built.
        embedding_dim: width of every table.
        layer_sizes: widths of each tower; the last is the retrieval embedding size.
        candidate_feature_names: features of the candidate (item) tower; all others feed the query tower.
        normalize: L2-normalize both embeddings (cosine scores; use with a temperature < 1).
        temperature: the in-batch logits are ``q . c / temperature``.
        recall_k: ``k`` of the logged ``val/recall@k`` and ``test/recall@k``.
        dense_optimizer / dense_lr: the towers' optimizer and its learning rate.
        managed_collisions: put the tables behind managed collisions (ids of any size get rows of
            their own, evicted when rows run out): ``True`` or a dict of
            ``lightrec.modules.managed_collision.ManagedCollisionOptions`` settings; None: plain tables.
        **rec_module_kwargs: the embedding tables' fused optimizer (``embedding_optimizer``,
            ``embedding_lr``, ``embedding_eps``) and the LR schedule (see ``RecModule``). ``metrics`` /
            ``train_metrics`` (click metrics) do not apply: a value other than the default is refused.

    Raises:
        ValueError: ``recall_k`` below 1, or ``metrics`` / ``train_metrics`` set.
    """

    def __init__(
        self,
        tables: list[DataTableSpec] | None = None,
        embedding_dim: int = 32,
        layer_sizes: list[int] = [64, 32],  # noqa: B006 - LightningCLI shows list defaults
        candidate_feature_names: list[str] = ["movieId", "genres"],  # noqa: B006
        normalize: bool = True,
        temperature: float = 0.1,
        recall_k: int = 10,
        dense_optimizer: str = "adam",
        dense_lr: float = 0.002,
        managed_collisions: dict[str, Any] | bool | None = None,
        **rec_module_kwargs: Any,
    ) -> None:
        _check_no_ctr_metrics(rec_module_kwargs)
        if isinstance(recall_k, bool) or not isinstance(recall_k, int) or recall_k < 1:
            raise ValueError(f"recall_k must be an int >= 1 (the k of recall@k), got {recall_k!r}")
        super().__init__(
            tables=tables,
            embedding_dim=embedding_dim,
            dense_optimizer=dense_optimizer,
            dense_lr=dense_lr,
            managed_collisions=managed_collisions,
            **rec_module_kwargs,
        )
        self.save_hyperparameters()
        self.layer_sizes = list(layer_sizes)
        self.candidate_feature_names = list(candidate_feature_names)
        self.normalize = normalize
        self.temperature = temperature
        self.recall_key = f"recall@{recall_k}"
        self.val_recall = RecallAtK(recall_k)
        self.test_recall = RecallAtK(recall_k)

    @override
    def check_datamodule(self, datamodule: Any) -> None:
        """The towers train on (user, item) pairs: a retrieval DataModule (``task == "retrieval"``)."""
        task = getattr(datamodule, "task", None)
        if task != "retrieval":
            kind = type(datamodule).__name__ + (f"(task={task!r})" if task is not None else "")
            raise ValueError(
                f"the two_tower recipe trains on (user, item) pairs and needs a retrieval DataModule (task="
                f"'retrieval', e.g. lightrec.data.MovieLensDataModule with task: retrieval, as in the "
                f"two_tower_movielens config, or --data parquet --data.task retrieval for Parquet pairs); got "
                f"{kind}. For click data use the dlrm or deepfm recipe"
            )
        features = _parquet_feature_names(datamodule)
        if features is None:
            return
        unknown = [n for n in self.candidate_feature_names if n not in features]
        query = [n for n in features if n not in self.candidate_feature_names]
        if unknown or not query or not self.candidate_feature_names:
            problem = (
                f"names features {unknown} the data does not have"
                if unknown
                else "leaves the query tower no feature"
                if not query
                else "is empty: the candidate tower has no feature"
            )
            raise ValueError(
                f"--model.candidate_feature_names {self.candidate_feature_names} {problem}; the data's sparse "
                f"features are {features}: name the candidate (item) tower's features among them, the others "
                "feed the query tower"
            )

    def build_model(self, embedding_bag_collection: nn.Module) -> nn.Module:
        """The model around the given tables (``RecModule`` hands in the collection for the strategy)."""
        two_tower = TwoTower(
            embedding_bag_collection,
            self.layer_sizes,
            candidate_feature_names=self.candidate_feature_names,
            normalize=self.normalize,
        )
        return TwoTowerTrainTask(two_tower, temperature=self.temperature)

    def for_serving(self, model: nn.Module) -> nn.Module:
        """The ``TwoTower`` (KJT -> query and candidate embeddings), without the training task."""
        two_tower = model.two_tower
        if not isinstance(two_tower, nn.Module):
            raise TypeError(f"expected the TwoTowerTrainTask built by build_model(), got {type(model).__name__}")
        return two_tower

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """KJT of ``B`` pairs -> ``(query [B, E], candidate [B, E])`` (dense features are unused)."""
        query, candidate = self.for_serving(self.built_model())(sparse_features)
        return query, candidate

    def _step(self, batch: Batch, stage: str, recall: RecallAtK | None) -> torch.Tensor:
        loss, (_, logits, targets) = self.built_model()(batch)
        self.log(
            f"{stage}/loss", loss, prog_bar=True, sync_dist=stage != "train", batch_size=batch.batch_size
        )
        if recall is not None:
            keep = batch.labels > 0  # rows that are real positives act as queries
            recall.update(logits[keep], targets[keep])
            self.log(
                f"{stage}/{self.recall_key}",
                recall,
                on_step=False,
                on_epoch=True,
                batch_size=batch.batch_size,
            )
            if stage == "val":  # TensorBoard's HPARAMS tab compares runs by it (RecModule: the AUC)
                self.log("hp_metric", recall, on_step=False, on_epoch=True, batch_size=batch.batch_size)
        return loss

    @override
    def _run_metric(self) -> Metric | None:
        """Runs are compared by the validation recall@k (``hp_metric``), not a click metric."""
        return self.val_recall

    @override
    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train", None)

    @override
    def validation_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "val", self.val_recall)

    @override
    def test_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "test", self.test_recall)

    @override
    def predict_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        """Score of each pair ``q_i . c_i`` ``[B]``."""
        query, candidate = self(batch.dense_features, batch.sparse_features)
        return (query * candidate).sum(dim=1)


def _parquet_feature_names(datamodule: Any) -> list[str] | None:
    """The sparse features of a ``ParquetDataModule`` (its spec, from the files' footers: ``lightrec run``
    built it checking the data); ``None`` for other data, whose features are fixed (MovieLens')."""
    if not isinstance(datamodule, ParquetDataModule):
        return None
    return [f.name for f in datamodule.spec.sparse]


def _check_no_ctr_metrics(rec_module_kwargs: dict[str, Any]) -> None:
    """Refuse ``metrics`` / ``train_metrics``: RecModule's click metrics, which this recipe never computes.

    LightningCLI passes every ``RecModule`` argument, so ``metrics`` arrives with its default; only a
    changed value is refused (it was accepted and silently ignored).
    """
    metrics = rec_module_kwargs.get("metrics", DEFAULT_METRICS)
    names = [] if metrics is None else [metrics] if isinstance(metrics, str) else list(metrics)
    # None and () mean "no click metrics" -- what this recipe does anyway -- so they are accepted too.
    if (names and names != list(DEFAULT_METRICS)) or rec_module_kwargs.get("train_metrics", False):
        raise ValueError(
            f"the two_tower recipe logs recall@k (val/ and test/recall@<recall_k>) and its loss, not the click "
            f"metrics of --model.metrics / --model.train_metrics (got metrics={names!r}, train_metrics="
            f"{rec_module_kwargs.get('train_metrics', False)!r}); leave them out and set --model.recall_k instead"
        )


def main(args: list[str] | None = None) -> Any:
    """Run the recipe: ``args`` are LightningCLI arguments (default ``sys.argv[1:]``)."""
    return run_recipe(TwoTowerModule, "two_tower_movielens.yaml", __file__, args)


if __name__ == "__main__":
    main()
