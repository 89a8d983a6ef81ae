"""``RecModule``: the LightningModule base class of every lightrec model.

A user subclasses it, builds the model in ``__init__`` (or ``configure_model`` for meta-device
tables) and writes ``forward(dense_features, sparse_features) -> logits``; ``RecModule`` supplies
the rest of a CTR training loop:

* ``training_step`` / ``validation_step`` / ``test_step``: binary cross-entropy on ``Batch.labels``,
  loss and throughput (samples/s) logged, AUC / NE / calibration / CTR / accuracy accumulated as
  torchmetrics (synced across ranks) and logged per epoch; the training step returns
  ``{"loss", "logits"}`` (the logits before the batch's update, for ``ProgressiveValidation``);
* ``predict_step``: probabilities ``sigmoid(logits)``;
* ``configure_optimizers``: one ``CombinedOptimizer`` holding the fused embedding optimizer(s)
  (whatever the sharded or fused collections expose as ``fused_optimizer``) and a dense optimizer
  over every other parameter, driven by one learning-rate schedule (linear warm-up, then constant,
  then polynomial decay — DLRM's schedule), which reaches both.

**A model built from tables** (what every recipe does). A subclass that defines
``table_configs() -> list[EmbeddingBagConfig]`` and ``build_model(embedding_bag_collection) -> model``
lets ``RecModule`` build ``self.model`` in ``configure_model``, once the strategy is known:

* under ``RecStrategy`` the tables are an ``EmbeddingBagCollection`` on ``meta`` -- no rank ever
  allocates a whole table; the strategy's ``DistributedModelParallel`` materialises each rank's
  shards -- whose weights carry an ``apply_optimizer_in_backward`` mark for the embedding optimizer
  (``embedding_optimizer`` / ``embedding_lr`` / ``embedding_eps``), which the sharders turn into the
  fused optimizer;
* under any other strategy (one process) they are a ``FusedEmbeddingBagCollection`` with the very
  same fused optimizer, so both runs train with the same update rule.

``managed_collisions`` puts every such table behind managed collisions
(``lightrec.modules.managed_collision.options``): raw ids of any size (below ``input_hash_size``) get their own
rows, evicted as the vocabulary drifts; sharded by the managed-collision sharders under
``RecStrategy``, kept (frozen) by ``serving_model()`` and the export.

The same two hooks give ``model_for_planning()`` (``lightrec plan``), ``fused_params()`` (the
sharders' and planner's view of the embedding optimizer), ``serving_model()`` / ``serving_factory()``
(plain ``EmbeddingBagCollection`` tables, the input of ``lightrec.inference.quantize`` / ``export``)
and a checkpoint entry ``lightrec_module`` naming the class, so ``lightrec export`` can rebuild it.
An optional ``for_serving(model)`` picks the part of the model that serves requests.

A ``configure_optimizers`` override may return a dense optimizer only: the fused tables still train
inside backward, and on one device (no ``RecStrategy``, which saves them itself) ``RecModule`` keeps
their optimizer state in the checkpoint entry ``lightrec_unlisted_fused_optimizer_states``, so a
resumed fit continues their Adagrad accumulators / Adam moments.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT, OptimizerLRScheduler
from torch import nn
from torchmetrics import Metric, MetricCollection
from typing_extensions import Self, override

from lightrec._compat import set_logging_step, stop_hp_metric_placeholder
from lightrec.data.batch import Batch
from lightrec.distributed.checkpoint import consolidate_checkpoint, is_sharded_checkpoint
from lightrec.distributed.planner import ParameterConstraints
from lightrec.kernels import FusedEmbeddingBagCollection
from lightrec.kernels.tiered.config import refuse_tiered_export
from lightrec.lightning.callbacks.rec_model_summary import summary_for
from lightrec.lightning.callbacks.tiered_table_monitor import TieredTableMonitor
from lightrec.lightning.class_reference import class_reference
from lightrec.lightning.contracts import EmbeddingShardingStrategy, FusedOptimizerModule, ShardingRequest
from lightrec.lightning.dlrm_schedule import dlrm_lr_lambda
from lightrec.lightning.fused_optimizer_states import (
    restore_unlisted_fused_states,
    save_unlisted_fused_states,
)
from lightrec.lightning.fused_tables_checks import (
    FusedTablesStrategyError,
    refuse_fused_tables_under_data_parallel,
    warn_schedulers_that_miss_fused_tables,
    warn_trainer_flags_with_fused_tables,
)
from lightrec.lightning.loop_state import fix_resume_counters, logging_step_of
from lightrec.lightning.nonfinite import (
    GradientWindow,
    NonFiniteLossError,
    check_nonfinite_policy,
    nonfinite_ranks,
)
from lightrec.lightning.sharded_folder_refusal import ShardedCheckpointFolderError, ShardedFolderRefusal
from lightrec.lightning.table_tiering import TableTiering
from lightrec.metrics import rec_metrics
from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.modules.managed_collision.options import ManagedCollisionOptions
from lightrec.optim import (
    CombinedOptimizer,
    KeyedOptimizer,
    KeyedOptimizerWrapper,
    RowWiseAdagrad,
    apply_optimizer_in_backward,
    in_backward_optimizer_filter,
    optimizer_class_to_spec,
)

__all__ = [
    "EMBEDDING_OPTIMIZERS",
    "FusedTablesStrategyError",
    "RecModule",
    "ShardedCheckpointFolderError",
    "class_reference",
    "dlrm_lr_lambda",
]

_DENSE_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adagrad": torch.optim.Adagrad,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
}

EMBEDDING_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adagrad": torch.optim.Adagrad,
    "rowwise_adagrad": RowWiseAdagrad,
    "adam": torch.optim.Adam,
}
"""The fused optimizers ``RecModule(embedding_optimizer=...)`` names for tables it builds."""


class RecModule(pl.LightningModule):
    """Base class for recommendation models trained with Lightning.

    Subclasses implement ``forward(dense_features [B, D_dense], sparse_features: KeyedJaggedTensor)``
    returning logits ``[B]`` (or ``[B, 1]``). Override ``training_step`` only for a different loss.

    Args:
        dense_optimizer: ``"sgd" | "adagrad" | "adam" | "adamw"`` or a ``torch.optim.Optimizer`` class,
            used for every parameter not updated by a fused embedding optimizer.
        dense_lr: learning rate of the dense optimizer.
        dense_optimizer_kwargs: extra keyword arguments for it.
        warmup_steps / decay_start_step / decay_steps / decay_power: the LR schedule (``dlrm_lr_lambda``),
            applied to dense and fused embedding optimizers alike. ``warmup_steps=0`` and
            ``decay_start_step=None`` keep the LR constant.
        metrics: names for ``lightrec.metrics.rec_metrics`` computed on validation and test (and train
            when ``train_metrics=True``). ``()`` (or ``[]``) and ``None`` alike mean no click metrics:
            only the losses (and throughput) are logged, no ``hp_metric``; ``val_metrics`` and
            ``test_metrics`` are then empty ``MetricCollection`` objects and ``train_metrics`` is None.
        embedding_optimizer: fused optimizer of the tables ``RecModule`` builds (see the module
            docstring): ``"rowwise_adagrad"`` (DLRM's), ``"adagrad"``, ``"sgd"`` or ``"adam"``. Tables
            a subclass builds itself carry their own optimizer and ignore these three.
        embedding_lr / embedding_eps: its learning rate and epsilon (the LR schedule scales the LR).
        nonfinite_loss: what a NaN/inf training loss does, checked before backward (the fused
            embedding optimizer updates the tables inside backward): ``"raise"`` (default) a
            ``NonFiniteLossError`` on every rank, ``"skip"`` the batch on every rank (counted in
            ``skipped_nonfinite_batches``), ``None`` no check (saves one host sync per step on GPU;
            ``lightrec.lightning.nonfinite``).
        tables_on: where the tables ``RecModule`` builds keep their rows: ``"memory"``, ``"ssd"``
            (every row on SSD, a cache of hot rows in memory: tables larger than RAM) or ``"host"``
            (GPU: rows in host memory, a cache in HBM); see ``lightrec.lightning.table_tiering``.
        cache_load_factor / cache_algorithm / ssd_storage_directory: the tiered tables' cache size
            (None: the planner's choice when sharded, else 0.2), ``"lru"`` / ``"lfu"``, and where
            the row files go.
        managed_collisions: put the tables ``RecModule`` builds behind managed collisions: ``True``
            (defaults), a dict of ``ManagedCollisionOptions`` settings (``eviction_policy``,
            ``eviction_interval``, ``input_hash_size``, ``buckets``, ...) or None (off). Each table's
            ``num_embeddings`` is its number of rows; the model's sparse module then returns
            ``(embeddings, None)``, which ``lightrec.models`` take. Not with tiered tables (yet).
    """

    def __init__(
        self,
        dense_optimizer: str | type[torch.optim.Optimizer] = "adagrad",
        dense_lr: float = 0.01,
        dense_optimizer_kwargs: dict[str, Any] | None = None,
        warmup_steps: int = 0,
        decay_start_step: int | None = None,
        decay_steps: int = 0,
        decay_power: float = 2.0,
        metrics: tuple[str, ...] | None = ("auc", "ne", "calibration", "ctr", "accuracy"),
        train_metrics: bool = False,
        embedding_optimizer: str = "rowwise_adagrad",
        embedding_lr: float = 0.05,
        embedding_eps: float = 1e-8,
        nonfinite_loss: Literal["raise", "skip"] | None = "raise",
        tables_on: Literal["memory", "ssd", "host"] = "memory",
        cache_load_factor: float | None = None,
        cache_algorithm: Literal["lru", "lfu"] = "lru",
        ssd_storage_directory: str | None = None,
        managed_collisions: dict[str, Any] | bool | None = None,
    ) -> None:
        super().__init__()
        self.table_tiering = TableTiering(tables_on, cache_load_factor, cache_algorithm, ssd_storage_directory)
        self.managed_collisions = ManagedCollisionOptions.parse(managed_collisions)
        if self.table_tiering.tiered and self.managed_collisions is not None:
            raise ValueError(
                f"tables_on={tables_on!r} with managed_collisions is not supported: managed-collision tables keep "
                "their rows in memory; use tables_on='memory' with managed_collisions, or drop managed_collisions"
            )
        self.nonfinite_loss = check_nonfinite_policy(nonfinite_loss)
        self.skipped_nonfinite_batches = 0
        self._gradient_window = GradientWindow()  # what a skipped micro-batch keeps (nonfinite.py)
        if isinstance(dense_optimizer, str) and dense_optimizer.lower() not in _DENSE_OPTIMIZERS:
            raise ValueError(
                f"dense_optimizer must be one of {sorted(_DENSE_OPTIMIZERS)} or an Optimizer class, "
                f"got {dense_optimizer!r}"
            )
        if embedding_optimizer not in EMBEDDING_OPTIMIZERS:
            raise ValueError(
                f"embedding_optimizer must be one of {sorted(EMBEDDING_OPTIMIZERS)}, got {embedding_optimizer!r}"
            )
        self.embedding_optimizer = embedding_optimizer
        self._embedding_optimizer_kwargs: dict[str, float] = {"lr": embedding_lr}
        if embedding_optimizer != "sgd":
            self._embedding_optimizer_kwargs["eps"] = embedding_eps
        self._dense_optimizer = dense_optimizer
        self._dense_lr = dense_lr
        self._dense_optimizer_kwargs = dict(dense_optimizer_kwargs or {})
        self._lr_lambda = dlrm_lr_lambda(warmup_steps, decay_start_step, decay_steps, decay_power)
        self._schedule_is_constant = warmup_steps == 0 and decay_start_step is None
        names = _metric_names(metrics)
        self.train_metrics = rec_metrics(names, prefix="train/") if train_metrics and names else None
        self.val_metrics = rec_metrics(names, prefix="val/") if names else MetricCollection({}, prefix="val/")
        self.test_metrics = rec_metrics(names, prefix="test/") if names else MetricCollection({}, prefix="test/")
        self._step_started_at: float | None = None
        self._resumed_logging_step: int | None = None
        self.model: nn.Module | None = None

    # ------------------------------------------------------------------ steps
    def _logits_and_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self(batch.dense_features, batch.sparse_features).reshape(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels.to(logits.dtype))
        return logits, loss

    @override
    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """``{"loss", "logits" [B]}``: logits from before this batch's update (``ProgressiveValidation``).

        A subclass may return the loss alone (Lightning's other form); ``ProgressiveValidation`` then
        refuses it with a TypeError that names the fix.
        """
        logits, loss = self._logits_and_loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch.batch_size)
        if self.train_metrics is not None:
            self.train_metrics.update(torch.sigmoid(logits.detach()), batch.labels)
            self.log_dict(self.train_metrics, on_step=False, on_epoch=True, batch_size=batch.batch_size)
        return {"loss": loss, "logits": logits.detach()}

    @override
    def validation_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        logits, loss = self._logits_and_loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=batch.batch_size)
        self.val_metrics.update(torch.sigmoid(logits), batch.labels)
        self.log_dict(self.val_metrics, on_step=False, on_epoch=True, batch_size=batch.batch_size)
        run_metric = self._run_metric()
        if run_metric is not None:
            # TensorBoard's HPARAMS tab compares runs by "hp_metric" (Lightning writes a -1 placeholder
            # when fitting starts): the run's validation AUC (NE without AUC), updated every validation.
            self.log("hp_metric", run_metric, on_step=False, on_epoch=True, batch_size=batch.batch_size)
        return loss

    @override
    def on_fit_start(self) -> None:
        # The optimizers are set up by now: warn when a configure_optimizers override schedules the
        # learning rate of optimizers that leave out the fused embedding tables (they keep their LR).
        if self._trainer is not None:
            warn_schedulers_that_miss_fused_tables(self._trainer, list(self.fused_optimizers()))

    @override
    def on_fit_end(self) -> None:
        # Each later stage of the same Trainer (the recipes' test after fit) would write Lightning's
        # placeholder hp_metric = -1 again, after the validation AUC: TensorBoard's HPARAMS tab shows a
        # run's last hp_metric, so it showed -1 again. The fit declared the metric; no more placeholders.
        if self._run_metric() is not None:
            for logger in self.loggers:
                stop_hp_metric_placeholder(logger)

    def _run_metric(self) -> Metric | None:
        """The validation metric runs are compared by (``hp_metric``): AUC, else NE, else none."""
        for name in ("auc", "ne"):
            if name in self.val_metrics:
                metric: Metric = self.val_metrics[name]
                return metric
        return None

    @override
    def test_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        logits, loss = self._logits_and_loss(batch)
        self.log("test/loss", loss, sync_dist=True, batch_size=batch.batch_size)
        self.test_metrics.update(torch.sigmoid(logits), batch.labels)
        self.log_dict(self.test_metrics, on_step=False, on_epoch=True, batch_size=batch.batch_size)
        return loss

    @override
    def predict_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        """Click probabilities ``[B]``."""
        return torch.sigmoid(self(batch.dense_features, batch.sparse_features).reshape(-1))

    @override
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``loss.backward()`` unless the loss is NaN/inf on some rank (``nonfinite_loss``)."""
        if self.nonfinite_loss is not None:
            bad = nonfinite_ranks(loss)  # every rank takes the same decision
            if bad:
                step = self.trainer.global_step if self._trainer is not None else None
                if self.nonfinite_loss == "raise":
                    raise NonFiniteLossError(
                        f"the training loss is not finite on rank(s) {bad} at global step {step} (this rank's loss: "
                        f"{loss.detach().float().item()}); stopped before backward, so no weight changed. Pass "
                        "RecModule(nonfinite_loss='skip') to skip such batches, or find the bad input/learning rate"
                    )
                self.skipped_nonfinite_batches += 1
                # Only this batch's contribution is dropped: the good micro-batches of its accumulation window
                # keep their gradients (see nonfinite.GradientWindow).
                scaler = getattr(self._trainer.precision_plugin, "scaler", None) if self._trainer is not None else None
                self._gradient_window.skip(self.parameters(), self.dense_parameters().values(), scaler)
                return
        self._gradient_window.before_backward()
        super().backward(loss, *args, **kwargs)
        self._gradient_window.after_backward()

    @override
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        # Lightning zeroes the gradients at the first batch of each accumulation window (automatic
        # optimization): a skipped non-finite batch then has no good gradient of the window to keep.
        self._gradient_window.reset()

    # ------------------------------------------------------------------ throughput
    @override
    def on_train_batch_start(self, batch: Batch, batch_idx: int) -> None:
        self._step_started_at = time.perf_counter()
        if self._resumed_logging_step is not None and self._trainer is not None:  # see loop_state
            set_logging_step(self.trainer, self._resumed_logging_step)
            self._resumed_logging_step = None

    @override
    def on_train_batch_end(self, outputs: STEP_OUTPUT, batch: Batch, batch_idx: int) -> None:
        if self._step_started_at is None:
            return
        every = int(getattr(self.trainer, "log_every_n_steps", 1)) if self._trainer is not None else 1
        if (self.trainer.global_step if self._trainer is not None else 0) % max(every, 1):
            return  # self.log costs ~0.6 ms; only log on the steps the logger writes anyway
        seconds = max(time.perf_counter() - self._step_started_at, 1e-9)
        world = self.trainer.world_size if self._trainer is not None else 1
        self.log("train/samples_per_sec", batch.batch_size * world / seconds, batch_size=batch.batch_size)

    # ------------------------------------------------------------------ optimizers
    def fused_optimizers(self) -> Iterator[tuple[str, KeyedOptimizer]]:
        """``(module path, fused_optimizer)`` of every outermost collection that updates rows in backward.

        A sharded collection's optimizer already covers its inner kernels, so the walk does not
        descend below a module that exposes one.
        """
        owners: list[str] = []
        for name, module in self.named_modules():
            if any(name.startswith(owner + ".") for owner in owners):
                continue
            optimizer = module.fused_optimizer if isinstance(module, FusedOptimizerModule) else None
            if isinstance(optimizer, KeyedOptimizer):
                owners.append(name)
                yield name, optimizer

    def dense_parameters(self) -> dict[str, nn.Parameter]:
        """Trainable parameters that no fused optimizer updates (those the dense optimizer steps)."""
        return {n: p for n, p in in_backward_optimizer_filter(self.named_parameters()) if p.requires_grad}

    def _dense_optimizer_class(self) -> type[torch.optim.Optimizer]:
        if isinstance(self._dense_optimizer, str):
            return _DENSE_OPTIMIZERS[self._dense_optimizer.lower()]
        return self._dense_optimizer

    @override
    def configure_optimizers(self) -> OptimizerLRScheduler:
        """One ``CombinedOptimizer`` (fused embedding part + dense part) and one LR schedule for both."""
        parts: list[tuple[str, KeyedOptimizer]] = [(path or "embeddings", opt) for path, opt in self.fused_optimizers()]
        if parts and self._trainer is not None:
            warn_trainer_flags_with_fused_tables(self.trainer)
        dense = self.dense_parameters()
        if dense:
            cls, kwargs = self._dense_optimizer_class(), dict(lr=self._dense_lr, **self._dense_optimizer_kwargs)
            parts.append(("dense", KeyedOptimizerWrapper(dense, lambda params: cls(params, **kwargs))))
        if not parts:
            raise ValueError(
                f"{type(self).__name__} has no trainable parameters and no fused embedding optimizer to configure"
            )
        optimizer = CombinedOptimizer(parts)
        if self._schedule_is_constant:
            return optimizer
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, self._lr_lambda)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ------------------------------------------------------------------ a model built from tables
    def embedding_collection(self, tables: list[EmbeddingBagConfig], sharded: bool) -> nn.Module:
        """``tables`` with the embedding optimizer: on ``meta`` and marked for the sharders when
        ``sharded``, else a materialised ``FusedEmbeddingBagCollection`` (see the module docstring)."""
        optimizer = EMBEDDING_OPTIMIZERS[self.embedding_optimizer]
        if sharded:
            ebc: nn.Module = EmbeddingBagCollection(tables=tables, device="meta")
            # The mark names the fused optimizer the sharders build; nothing steps a meta tensor.
            apply_optimizer_in_backward(optimizer, ebc.parameters(), self._embedding_optimizer_kwargs, False)
        else:
            ebc = FusedEmbeddingBagCollection(
                tables, optimizer_type=optimizer, optimizer_kwargs=self._embedding_optimizer_kwargs,
                tiering=self.table_tiering.tiering(),
            )  # fmt: skip
        return self._managed(ebc, tables, "meta" if sharded else None)

    def _managed(self, ebc: nn.Module, tables: list[EmbeddingBagConfig], device: str | None) -> nn.Module:
        """``ebc`` behind managed collisions when ``managed_collisions`` is set (id maps on ``device``)."""
        return ebc if self.managed_collisions is None else self.managed_collisions.wrap(ebc, tables, device)

    def fused_params(self) -> dict[str, Any]:
        """The embedding optimizer as torchrec-style ``fused_params`` (for sharders and the planner),
        with the tiered tables' keys (``cache_load_factor`` ...) when ``tables_on`` is not memory."""
        spec = optimizer_class_to_spec(EMBEDDING_OPTIMIZERS[self.embedding_optimizer], self._embedding_optimizer_kwargs)
        return {**spec.to_fused_params(), **self.table_tiering.fused_params()}

    def planner_constraints(self) -> dict[str, ParameterConstraints]:
        """The planner's constraints of the tables ``RecModule`` builds: their tiered kernel when
        ``tables_on`` asks for one (``RecStrategy`` and ``lightrec plan`` add them to their own)."""
        if not self.table_tiering.tiered or not self._defines_tables():
            return {}
        return self.table_tiering.constraints(c.name for c in self.table_configs())

    def sharding_request(self) -> ShardingRequest:
        """What ``RecStrategy`` hands its sharders and planner (``lightrec.lightning.contracts``): the
        embedding optimizer of the tables ``RecModule`` builds (:meth:`fused_params`; a model built by
        the subclass itself carries its own) and :meth:`planner_constraints`."""
        return ShardingRequest(
            fused_params=self.fused_params() if self.builds_from_tables else None,
            constraints=self.planner_constraints(),
        )

    # ---- the hooks of a model built from tables (module docstring); override both ----------
    def table_configs(self) -> list[EmbeddingBagConfig]:
        """The tables of the model ``RecModule`` builds (override together with :meth:`build_model`)."""
        raise TypeError(self._builds_own_model())

    def build_model(self, embedding_bag_collection: nn.Module) -> nn.Module:
        """The model around ``embedding_bag_collection`` (the tables of :meth:`table_configs`, made
        for the strategy in use); ``RecModule`` builds it in ``configure_model``."""
        raise TypeError(self._builds_own_model())

    def for_serving(self, model: nn.Module) -> nn.Module:
        """The part of ``model`` that serves requests (the export's input); default: all of it."""
        return model

    @property
    def builds_from_tables(self) -> bool:
        """Whether the subclass defines :meth:`build_model`, so ``RecModule`` builds ``self.model``."""
        return type(self).build_model is not RecModule.build_model

    def _defines_tables(self) -> bool:
        return type(self).table_configs is not RecModule.table_configs

    def _builds_own_model(self) -> str:
        return (
            f"{type(self).__name__} builds its own model; define table_configs() and "
            "build_model(embedding_bag_collection) to let RecModule build it from tables"
        )

    def _model_from_tables(self, collection: Callable[[list[EmbeddingBagConfig]], nn.Module]) -> nn.Module:
        """``build_model(collection(table_configs()))``: the subclass's model around tables made by ``collection``."""
        if not self.builds_from_tables or not self._defines_tables():
            raise TypeError(self._builds_own_model())
        return self.build_model(collection(self.table_configs()))

    @override
    def configure_model(self) -> None:
        """Build ``self.model`` once, for the strategy in use, when the subclass defines ``build_model``."""
        if self.model is not None or not self.builds_from_tables:
            return
        # Tables on meta for a strategy that shards them (its sharders materialise each rank's shards).
        sharded = self._trainer is not None and isinstance(self._trainer.strategy, EmbeddingShardingStrategy)
        self.model = self._model_from_tables(lambda tables: self.embedding_collection(tables, sharded))

    def built_model(self) -> nn.Module:
        """``self.model``, built on first use outside a Trainer (e.g. after ``load_from_checkpoint``)."""
        if self.model is None:
            self.configure_model()
        if self.model is None:
            raise TypeError(f"{type(self).__name__} has no model: set self.model, or define build_model()")
        return self.model

    def model_for_planning(self) -> nn.Module:
        """The model with ``meta`` tables, as ``RecStrategy`` would shard it (for ``lightrec plan``)."""
        return self._model_from_tables(lambda tables: self.embedding_collection(tables, sharded=True))

    def serving_model(self) -> nn.Module:
        """The trained model with plain ``EmbeddingBagCollection`` tables, on CPU, in eval mode.

        The input of ``lightrec.inference.quantize``/``export`` for an unsharded module (the fused
        collection's state-dict keys are the plain collection's, so the weights load one to one).
        """
        if self.table_tiering.tiered:
            raise ValueError(refuse_tiered_export([c.name for c in self.table_configs()] if self._defines_tables() else []))
        model = self._model_from_tables(
            lambda tables: self._managed(EmbeddingBagCollection(tables=tables, device="cpu"), tables, "cpu")
        )
        model.load_state_dict({k: v.detach().cpu() for k, v in self.built_model().state_dict().items()})
        return self.for_serving(model).eval()

    def serving_factory(self) -> nn.Module:
        """An untrained serving model with ``meta`` tables (``export_from_checkpoint``'s model factory)."""
        return self.for_serving(
            self._model_from_tables(
                lambda tables: self._managed(EmbeddingBagCollection(tables=tables, device="meta"), tables, "meta")
            )
        )

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lets `lightrec export <checkpoint>` find the class that rebuilds this model from tables.
        if self.builds_from_tables:
            checkpoint["lightrec_module"] = class_reference(type(self))
        # The state (Adagrad accumulators, Adam moments) of fused optimizers that a configure_optimizers
        # override left out, which Lightning does not save; RecStrategy saves them itself (sharded).
        if "optimizer_states" in checkpoint and self._trainer is not None and not self._tables_sharded():
            save_unlisted_fused_states(checkpoint, self.trainer.optimizers, list(self.fused_optimizers()))

    def _tables_sharded(self) -> bool:
        return self._trainer is not None and isinstance(self._trainer.strategy, EmbeddingShardingStrategy)

    @classmethod
    def load_from_checkpoint(
        cls, checkpoint_path: str | os.PathLike | IO[bytes], *args: Any, **kwargs: Any
    ) -> Self:
        """Lightning's ``load_from_checkpoint``, also for a sharded checkpoint folder (``last.ckpt/``).

        A folder written by ``RecStrategy`` on any number of ranks is gathered into full tables in
        this one process first (``consolidate_checkpoint``, through a temporary file), so the
        module loads with whole tables on one process, as from a single-file checkpoint.
        """
        load = getattr(super(), "load_from_checkpoint")  # noqa: B009 - Lightning's restricted classmethod
        if isinstance(checkpoint_path, (str, os.PathLike)) and is_sharded_checkpoint(checkpoint_path):
            with tempfile.TemporaryDirectory(prefix="lightrec-consolidated-") as tmp:
                full = os.path.join(tmp, "full.ckpt")
                consolidate_checkpoint(checkpoint_path, full)
                loaded: Self = load(full, *args, **kwargs)
                return loaded
        loaded = load(checkpoint_path, *args, **kwargs)
        return loaded

    @override
    def configure_callbacks(self) -> list[pl.Callback]:
        """A :class:`RecModelSummary` in place of the Trainer's default model summary: it counts the
        whole embedding tables (every rank's shards) and counts them as trained."""
        summary = summary_for(self._trainer)
        callbacks: list[pl.Callback] = [summary] if summary is not None else []
        trainer_callbacks = getattr(self._trainer, "callbacks", []) if self._trainer is not None else []
        if self.table_tiering.tiered and not any(isinstance(c, TieredTableMonitor) for c in trainer_callbacks):
            callbacks.append(TieredTableMonitor())  # hit rate, rows and bytes moved in TensorBoard
        return callbacks

    @override
    def setup(self, stage: str) -> None:
        """Make a sharded checkpoint folder given to a strategy other than ``RecStrategy`` (e.g.
        ``Trainer(strategy="auto").test(ckpt_path=folder)``) fail with a :class:`ShardedCheckpointFolderError`
        that says what to do, not ``torch.load``'s ``IsADirectoryError``. A subclass overriding ``setup``
        calls ``super().setup(stage)`` to keep this."""
        if self._trainer is not None:
            ShardedFolderRefusal.install(self._trainer.strategy)
            if stage == "fit":
                builds_fused = self.model is None and self.builds_from_tables and self._defines_tables()
                refuse_fused_tables_under_data_parallel(self, self._trainer.strategy, builds_fused)

    @override
    def teardown(self, stage: str) -> None:
        if self._trainer is not None:
            ShardedFolderRefusal.uninstall(self._trainer.strategy)

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Runs before Lightning restores its loops from the same dict: a checkpoint of a finished
        # epoch resumes into a whole next epoch, one of an epoch cut by max_steps into the rest of
        # that epoch (see lightrec.lightning.loop_state; RecStrategy does the same for any module).
        if fix_resume_counters(checkpoint) is not None:
            self._resumed_logging_step = logging_step_of(checkpoint)
        if self._trainer is not None and self._trainer.state.fn == "fit" and not self._tables_sharded():
            restore_unlisted_fused_states(checkpoint, dict(self.fused_optimizers()), type(self).__name__)


def _metric_names(metrics: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """``RecModule(metrics=...)`` as a tuple of names: ``None`` and an empty sequence are no metrics."""
    if metrics is None:
        return ()
    if isinstance(metrics, str):
        return (metrics,)
    return tuple(metrics)
