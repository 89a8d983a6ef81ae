"""``RecStrategy``: Lightning strategy for model-parallel embeddings + data-parallel dense layers.

It is a ``DDPStrategy`` in everything that is about processes — launchers (subprocess script,
spawn, torchrun/SLURM environments), process-group initialisation in ``setup_environment``
(gloo on CPU, NCCL on GPU), ``reduce``/``barrier``/``broadcast``/``all_gather`` — and differs in
what ``setup`` does to the model: instead of wrapping it in DDP, it hands the LightningModule to
``DistributedModelParallel``, which plans (or takes the given plan), replaces every embedding
collection by its sharded version (materialising only local shards of meta-device tables) and
wraps the remaining dense parameters in DDP.

Nothing here creates process groups inside the user's module or skips moving the model: dense
parameters are moved to the root device, embedding shards are placed by the plan. Sharders, plan
and plan report come from ``lightrec.distributed.planner``, as for ``DistributedModelParallel``
and ``lightrec plan``.

``DDPStrategy`` options that concern the dense part's DDP wrapper are forwarded to it:
``Trainer(sync_batchnorm=True)`` (or any ``LayerSync`` plugin) converts the dense layers when
fitting, as ``DDPStrategy`` does (torch's ``SyncBatchNorm`` needs CUDA: on CPU the strategy says
so at setup instead of failing in the first forward); ``ddp_comm_hook`` / ``ddp_comm_state`` /
``ddp_comm_wrapper`` are registered on the dense part's ``DistributedDataParallel`` on every
device type (``DDPStrategy`` registers them on CUDA only). Post-local SGD (``model_averaging_period``
or a ``PostLocalSGDState``) is rejected: its model averager would have to average the
data-parallel embedding tables too, which it cannot see.

Device placement across stages (one ``Trainer``: fit, then validate / test / predict):

* ``model_to_device`` moves the *dense part* with the module's own ``.to()`` -- parameters,
  buffers and every other kind of device state, torchmetrics states included -- with the
  embedding collections taken out of the tree meanwhile (``lightrec.distributed.dmp.placement``):
  unsharded ones are placed by their sharder, sharded ones already are where the plan put them;
* ``setup`` shards the model for every stage. A module already sharded by an earlier stage keeps
  its sharded collections -- same objects, same values, same plan -- and only the wrapper is
  rebuilt (with DDP for ``fit``, without for the others);
* ``teardown`` leaves the model and the optimizer state where they are, as Lightning's own
  ``FSDPStrategy`` and ``ModelParallelStrategy`` do: sharded storage cannot follow a
  ``module.cpu()`` (kernel state, fused optimizer state and index tensors are not all parameters),
  and the next stage runs on the same devices. Delete the model to release its memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState
from torch.optim import Optimizer
from typing_extensions import override

from lightrec._compat import default_pg_timeout, optimizers_to_device, set_logging_step
from lightrec._malloc_policy import apply_malloc_policy
from lightrec.distributed.checkpoint import (
    CheckpointSource,
    ForeignCheckpointError,
    UnsafeCheckpointError,
    is_sharded_checkpoint,
    load_sharded_checkpoint,
    open_checkpoint,
    save_sharded_checkpoint,
)
from lightrec.distributed.comm.failures import collective_guard
from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.dmp.default_sharders import get_default_sharders
from lightrec.distributed.dmp.placement import detached, move_dense_to_device
from lightrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
from lightrec.distributed.planner import ParameterConstraints, PlannerReport, Topology
from lightrec.distributed.planner.plan import ModuleSharder, ShardingPlan, shardable_modules
from lightrec.distributed.planner.planning import plan_sharding, topology_for
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.kernels.kernel_registry import check_kernel_backend
from lightrec.lightning.contracts import (
    EmbeddingShardingStrategy,
    ShardedModelProvider,
    ShardingRequest,
    UnshardableModuleError,
    planning_batch_size,
)
from lightrec.lightning.fused_tables_checks import unlisted_fused_optimizers
from lightrec.lightning.loop_state import fix_resume_counters, logging_step_of
from lightrec.lightning.process_group_exit import destroy_process_groups_at_exit
from lightrec.lightning.sigterm_agreement import AgreedSigtermConnector, install_agreed_sigterm
from lightrec.modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.modules.managed_collision.embedding_collections import BaseManagedCollisionEmbeddingCollection
from lightrec.optim import KeyedOptimizer

__all__ = ["RecStrategy"]

#: Checkpoint entry: how many fused optimizers, not among the trainer's, follow its optimizer states.
_UNLISTED_FUSED = "lightrec_unlisted_fused_optimizers"

#: Placed by the plan, not by ``model_to_device``: unsharded collections (possibly on ``meta``;
#: their sharder materialises this rank's shards; managed-collision ones with their id maps) and
#: sharded ones (already placed).
_PLACED_BY_PLAN = (
    EmbeddingBagCollection, EmbeddingCollection, BaseManagedCollisionEmbeddingCollection, ShardedCollectionBase,
)  # fmt: skip


def _sharding_plan(plan: str | os.PathLike[str] | ShardingPlan | dict[str, Any] | None) -> ShardingPlan | None:
    """``RecStrategy(plan=...)`` as a plan: a path is read, a JSON object (a config's ``plan: plan.json``,
    which Lightning's parser reads for us) is converted."""
    if isinstance(plan, (str, os.PathLike)):
        return ShardingPlan.load(plan)
    if isinstance(plan, dict):
        try:
            return ShardingPlan.from_dict(plan)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"RecStrategy(plan=...) got a JSON object that is not a sharding plan ({exc}); give the file "
                "`lightrec plan --json` wrote"
            ) from exc
    return plan


def _has_unsharded_collections(module: nn.Module) -> bool:
    return any(type(m) in (EmbeddingBagCollection, EmbeddingCollection) for m in module.modules())


class RecStrategy(DDPStrategy, EmbeddingShardingStrategy):
    """Shard embedding collections across ranks; run everything else data-parallel.

    Args:
        plan: a fixed ``ShardingPlan``, a path to its JSON (``lightrec plan --json``), or that JSON's
            object (what a LightningCLI config's ``plan: plan.json`` hands over: Lightning's parser
            reads a file a config value names); planned automatically when ``None``.
        topology / constraints: planner inputs (``lightrec.distributed.planner.Topology``,
            ``{table: ParameterConstraints}``) used when ``plan`` is ``None``.
        fused_params: the fused embedding optimizer, torchrec style, e.g.
            ``{"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.02, "eps": 1e-8}``.
        sharders: custom sharders (default: ``get_default_sharders(fused_params, kernel_backend)``).
        kernel_backend: lookup kernels of the default sharders: ``"auto"`` (fbgemm TBE where it
            supports the tables, else Triton on CUDA, else pure torch), ``"fbgemm"``, ``"triton"`` or ``"torch"``.
        ddp_comm_state / ddp_comm_hook / ddp_comm_wrapper: a DDP communication hook for the dense
            part's gradients (``DistributedDataParallel.register_comm_hook(state, hook)``; the
            wrapper, if any, wraps the hook first), as for ``DDPStrategy``.
        model_averaging_period: not supported (post-local SGD); must be None.
        process_group_backend / timeout / start_method: as for ``DDPStrategy``.
        malloc_policy: glibc malloc thresholds of this process and of the ranks it launches:
            ``"tuned"`` (fixed thresholds: no page-fault storms from released activations),
            ``"default"`` (glibc's own), a ``{"MALLOC_MMAP_THRESHOLD_": bytes, ...}`` mapping, or None
            for ``$LIGHTREC_MALLOC_POLICY`` (default ``"tuned"``); ``MALLOC_*`` variables already in the
            environment win (``lightrec._malloc_policy``, docs/performance.md).
        **ddp_kwargs: forwarded to the DDP wrapper of the dense parameters.
    """

    strategy_name = "lightrec"

    def __init__(
        self,
        accelerator: pl.accelerators.Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        plan: dict[str, Any] | ShardingPlan | str | os.PathLike[str] | None = None,
        topology: Topology | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        fused_params: dict[str, Any] | None = None,
        sharders: Sequence[ModuleSharder] | None = None,
        kernel_backend: str = "auto",
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_wrapper: Callable[..., Any] | None = None,
        model_averaging_period: int | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        malloc_policy: str | dict[str, int] | None = None,
        **ddp_kwargs: Any,
    ) -> None:
        # Before any rank is launched: they inherit the environment (and this process is a rank).
        self.malloc_policy = apply_malloc_policy(malloc_policy)
        if model_averaging_period is not None or isinstance(ddp_comm_state, PostLocalSGDState):
            raise ValueError(
                "RecStrategy does not support post-local SGD (got model_averaging_period="
                f"{model_averaging_period!r}, ddp_comm_state={type(ddp_comm_state).__name__}): its periodic model "
                "averaging would leave the data-parallel embedding tables out. Drop model_averaging_period and use "
                "a plain DDP communication hook (e.g. torch's fp16_compress_hook) instead"
            )
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            ddp_comm_state=ddp_comm_state,
            ddp_comm_hook=ddp_comm_hook,
            ddp_comm_wrapper=ddp_comm_wrapper,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            **ddp_kwargs,
        )
        self._plan = _sharding_plan(plan)
        self._topology = topology
        self._constraints = constraints
        self._fused_params = dict(fused_params or {})
        self._sharders = list(sharders) if sharders is not None else None
        check_kernel_backend(kernel_backend)
        self._kernel_backend = kernel_backend
        self.dmp: DistributedModelParallel | None = None
        self._resumed_logging_step: int | None = None  # put back at the first batch after a resume
        self._used_plan: ShardingPlan | None = None
        self._sigterm: AgreedSigtermConnector | None = None  # the trainer's, from setup on (sigterm_agreement)
        self.plan_report: PlannerReport | None = None  # the planner's report when this strategy planned

    @override
    def setup_distributed(self) -> None:
        """``DDPStrategy``'s process group, destroyed at interpreter exit whatever its backend
        (Lightning does that for NCCL only; a gloo group left to the interpreter's teardown can abort
        the rank at exit: ``lightrec.lightning.process_group_exit``)."""
        super().setup_distributed()
        destroy_process_groups_at_exit()

    # ------------------------------------------------------------------ model set-up
    @property
    def plan(self) -> ShardingPlan | None:
        """The ``ShardingPlan`` in use (after ``setup``; kept after ``teardown``), or the one given."""
        if self.dmp is not None:
            return self.dmp.plan
        return self._used_plan if self._used_plan is not None else self._plan

    @property
    def topology(self) -> Topology | None:
        """The ``Topology`` given to plan for (None: the world this strategy runs, see ``setup``)."""
        return self._topology

    @property
    def fused_params(self) -> dict[str, object]:
        """The fused embedding optimizer of the default sharders (empty: their default)."""
        return dict(self._fused_params)

    def _connected_module(self) -> pl.LightningModule:
        module = self.lightning_module
        if module is None:
            raise RuntimeError(
                "RecStrategy has no LightningModule: the Trainer connects it in fit/validate/test/predict"
            )
        return module

    @override
    def model_to_device(self) -> None:
        """Move the dense part (parameters, buffers, metric states, ...) to the root device; embedding
        collections are placed by the plan (see the module docstring)."""
        assert self.model is not None
        move_dense_to_device(self.model, self.root_device, _PLACED_BY_PLAN)

    def _sharders_for(self, request: ShardingRequest) -> list[ModuleSharder]:
        if self._sharders is not None:
            return self._sharders
        # The module's embedding optimizer (RecModule: that of the tables it builds) lets the planner
        # count its state in table memory, as `lightrec plan` does: both print the same plan numbers.
        return get_default_sharders(self._fused_params or request.fused_params, self._kernel_backend)

    def _plan_for(
        self, module: nn.Module, sharders: list[ModuleSharder], request: ShardingRequest, trainer: pl.Trainer
    ) -> ShardingPlan | None:
        if self._plan is not None:
            return self._plan
        sharded = any(isinstance(m, ShardedCollectionBase) for m in module.modules())
        if sharded and not _has_unsharded_collections(module):
            # Sharded by an earlier stage: DistributedModelParallel takes over the plan it was sharded by.
            return None
        topology = self._topology or topology_for(self.world_size, self.root_device.type, self.num_processes)
        # A RecModule building tiered tables (tables_on="ssd") constrains their kernel; the
        # strategy's own constraints win for the tables they name.
        constraints = {**request.constraints, **(self._constraints or {})}
        # The cost model's batch is the DataModule's per-rank batch, as `lightrec plan` passes it:
        # both then print the same plan numbers. Foreign objects, read where present: Lightning's data
        # connector sets `trainer.datamodule` (the Trainer class does not declare it); the batch size
        # is the BatchSizedData contract (LightningDataModule declares none).
        batch_size = planning_batch_size(getattr(trainer, "datamodule", None))
        planned = plan_sharding(module, sharders, topology, constraints or None, batch_size=batch_size, collective=True)
        self.plan_report = planned.report
        return planned.plan

    def _check_shardable(self, module: pl.LightningModule, sharders: list[ModuleSharder]) -> None:
        """Refuse a module that brings nothing to shard and declares nothing (see ``lightrec.lightning.contracts``)."""
        if isinstance(module, ShardedModelProvider) or shardable_modules(module, sharders):
            return
        if any(isinstance(m, ShardedCollectionBase) for m in module.modules()):
            return
        raise UnshardableModuleError(
            f"RecStrategy shards embedding collections, but the {type(module).__name__} it was given holds none "
            "after configure_model() and is not a lightrec RecModule. Build its EmbeddingBagCollection / "
            "EmbeddingCollection in __init__ or configure_model(), derive it from lightrec.RecModule (with "
            "table_configs() and build_model() it builds its tables itself), or train a model without embedding "
            "tables with strategy='ddp'"
        )

    def _shard(self, module: pl.LightningModule, data_parallel: bool, trainer: pl.Trainer) -> DistributedModelParallel:
        request = module.sharding_request() if isinstance(module, ShardedModelProvider) else ShardingRequest()
        sharders = self._sharders_for(request)
        self._check_shardable(module, sharders)
        plan = self._plan_for(module, sharders, request, trainer)
        self.dmp = DistributedModelParallel(
            module,
            device=self.root_device,
            plan=plan,
            sharders=sharders,
            env=ShardingEnv.from_process_group(None),
            init_data_parallel=data_parallel,
            ddp_kwargs=self._ddp_kwargs or None,
            # DDP takes one communication hook: the user's, else lightrec's shared-memory all-reduce
            data_parallel_wrapper=DefaultDataParallelWrapper(),
        )
        if data_parallel:
            self._register_comm_hook(self.dmp)
        return self.dmp

    def _register_comm_hook(self, dmp: DistributedModelParallel) -> None:
        """Register ``ddp_comm_hook`` (wrapped by ``ddp_comm_wrapper``) on the dense part's DDP."""
        hook = self._ddp_comm_hook
        if hook is None:
            return
        ddp = dmp.data_parallel
        if ddp is None:  # one rank, or nothing dense to train: no gradient all-reduce to hook
            return
        if self._ddp_comm_wrapper is not None:
            hook = self._ddp_comm_wrapper(hook)
        ddp.register_comm_hook(state=self._ddp_comm_state, hook=hook)

    def _sync_layers(self) -> None:
        """Apply the trainer's ``LayerSync`` plugin (``sync_batchnorm=True``) to the dense part."""
        layer_sync = self._layer_sync
        if layer_sync is None:
            return
        assert self.model is not None
        with detached(self.model, _PLACED_BY_PLAN):  # the embedding collections have no layers to sync
            self.model = layer_sync.apply(self.model)
        synced = [name for name, m in self.model.named_modules() if isinstance(m, nn.SyncBatchNorm)]
        if synced and self.root_device.type == "cpu":
            raise ValueError(
                f"sync_batchnorm=True converted {synced} to torch.nn.SyncBatchNorm, which runs on CUDA only, but "
                "this RecStrategy trains on CPU: train without sync_batchnorm, or on GPUs (accelerator='gpu')"
            )

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self._sigterm = install_agreed_sigterm(trainer)  # before the trainer registers its handlers
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            self._sync_layers()
        with detached(self.model, (ShardedCollectionBase,)):  # sharded by an earlier stage: kept as is
            self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        # Shard for every stage: tables may not fit on one rank even for validate/test/predict.
        self.model = self._shard(self._connected_module(), fitting, trainer)
        if fitting:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if fitting:
            optimizers_to_device(self.optimizers, self.root_device)

    # ------------------------------------------------------------------ checkpoints
    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        # A sharded checkpoint is cut to the live plan, which exists only once setup has sharded.
        return True

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | os.PathLike, storage_options: Any | None = None
    ) -> None:
        """Every rank writes its own shards into the checkpoint directory ``filepath`` (atomically).

        Layout and guarantees: ``lightrec.distributed.checkpoint``. ``ModelCheckpoint`` and
        ``Trainer.save_checkpoint`` call this on every rank, as they do for any strategy.
        """
        if storage_options is not None:
            raise TypeError(
                "RecStrategy.save_checkpoint writes a sharded checkpoint directory and takes no storage_options; "
                f"got {storage_options!r}"
            )
        training = "optimizer_states" in checkpoint
        unlisted = self._unlisted_fused_optimizers() if training else []
        if unlisted:  # saved after the trainer's own, counted so a load knows they are there
            checkpoint = {
                **checkpoint,
                "optimizer_states": [*checkpoint["optimizer_states"], *(o.state_dict() for o in unlisted)],
                _UNLISTED_FUSED: len(unlisted),
            }
        save_sharded_checkpoint(
            filepath,
            checkpoint,
            self._connected_module(),
            [*self.optimizers, *unlisted] if training else (),
            [c.scheduler for c in self.lr_scheduler_configs] if "lr_schedulers" in checkpoint else (),
        )

    @override
    def load_checkpoint(self, checkpoint_path: str | os.PathLike, weights_only: bool | None = None) -> dict[str, Any]:
        """Read a sharded checkpoint (or a consolidated one) cut to this rank's shards, for any plan
        and world size; any other file is read as a plain Lightning checkpoint (full tables reshard
        on load, optimizer state must then match the live optimizers).

        lightrec's files are always read with ``weights_only=True`` (they never need code); a plain
        file is read with ``weights_only=True`` unless the caller passes ``weights_only=False``.

        The loop counters are fixed for any ``LightningModule`` before Lightning restores its loops
        (``lightrec.lightning.loop_state``): a checkpoint of a finished epoch resumes into the next
        epoch, one written after ``max_steps`` cut an epoch resumes into the rest of that epoch.
        """
        checkpoint = self._read_checkpoint(checkpoint_path, weights_only)
        if fix_resume_counters(checkpoint) is not None:
            self._resumed_logging_step = logging_step_of(checkpoint)
        return checkpoint

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        if self._sigterm is not None:  # every rank, every batch: a SIGTERM stops all after this one
            self._sigterm.agree()
        module = self.lightning_module
        if self._resumed_logging_step is not None and module is not None:  # see lightrec.lightning.loop_state
            set_logging_step(module.trainer, self._resumed_logging_step)
            self._resumed_logging_step = None

    def _read_checkpoint(self, checkpoint_path: str | os.PathLike, weights_only: bool | None) -> dict[str, Any]:
        if is_sharded_checkpoint(checkpoint_path):  # an incomplete or damaged folder raises, naming the file
            source = open_checkpoint(checkpoint_path)
            return self._load_sharded(source)
        try:
            source = open_checkpoint(checkpoint_path)  # a consolidated file, read once
        except UnsafeCheckpointError:
            if weights_only is not False:
                raise
            return super().load_checkpoint(os.fspath(checkpoint_path), weights_only=False)
        except ForeignCheckpointError:  # any other readable file: a plain Lightning checkpoint
            return super().load_checkpoint(os.fspath(checkpoint_path), weights_only=weights_only is not False)
        return self._load_sharded(source)

    def _load_sharded(self, source: CheckpointSource) -> dict[str, Any]:
        # Checked against the module as strictly as Lightning will then load it (strict_loading), on
        # every rank alike, so a checkpoint that does not fit fails before anything is restored.
        module = self._connected_module()
        return load_sharded_checkpoint(source, module, self._optimizers_of(source), strict=module.strict_loading)

    # A plain LightningModule (not a RecModule) rarely puts the sharded tables' fused optimizers into
    # configure_optimizers: their state (row-wise Adagrad accumulators, Adam moments) was then neither
    # saved nor restored, and a resumed run's embedding updates differed from an uninterrupted run's.
    def _unlisted_fused_optimizers(self) -> list[KeyedOptimizer]:
        """The sharded model's fused embedding optimizers that none of the trainer's optimizers holds (by
        parameter group, as ``RecModule`` compares them on one device)."""
        if self.dmp is None:
            return []
        return [opt for _, opt in unlisted_fused_optimizers(list(self.optimizers), self.dmp.fused_optimizer.optimizers)]

    def _optimizers_of(self, source: CheckpointSource) -> list[Optimizer]:
        """The live optimizers a checkpoint's optimizer states are for: the trainer's, then the fused
        optimizers it saved for a module that does not list them (when the live run has the same)."""
        unlisted = self._unlisted_fused_optimizers() if self.optimizers else []
        if not unlisted or source.meta.get(_UNLISTED_FUSED) != len(unlisted):
            return list(self.optimizers)
        return [*self.optimizers, *unlisted]

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Lightning's restore of the trainer's optimizers, then of the fused optimizers a module
        that does not list them had saved (see ``save_checkpoint``)."""
        super().load_optimizer_state_dict(checkpoint)
        unlisted = self._unlisted_fused_optimizers()
        states = checkpoint.get("optimizer_states", [])[len(self.optimizers) :]
        if checkpoint.get(_UNLISTED_FUSED) == len(unlisted) == len(states):
            for opt, state in zip(unlisted, states, strict=True):
                opt.load_state_dict(state)

    @override
    def teardown(self) -> None:
        """Release the stage's resources but leave the model and optimizer state on their devices.

        Unlike ``DDPStrategy.teardown`` this does not call ``module.cpu()`` nor move optimizer
        state to the CPU (the module docstring says why); like it, the model is unwrapped, so
        ``strategy.model`` is the ``LightningModule`` (its sharded collections stay in it).
        """
        if self.dmp is not None:
            self._used_plan = self.dmp.plan
        self.dmp = None
        self.model = self.lightning_module
        assert self.cluster_environment is not None and self.accelerator is not None
        self.cluster_environment.teardown()
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()

    @override
    def backward(self, closure_loss: torch.Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Backward as ``DDPStrategy`` does; a dead or stuck peer raises ``CollectiveError`` naming it."""
        with collective_guard(
            "a backward collective (embedding gradient all-to-all, or the dense gradients' all-reduce of DDP)"
        ):
            return super().backward(closure_loss, optimizer, *args, **kwargs)

    @override
    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Move a ``Batch`` (or any collection holding KJTs) without blocking the host."""
        device = device or self.root_device
        mover = getattr(batch, "to", None)
        if callable(mover) and not isinstance(batch, torch.Tensor):
            return mover(device, non_blocking=True)
        return super().batch_to_device(batch, device, dataloader_idx)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="lightrec: sharded embeddings + data-parallel dense layers"
        )
        strategy_registry.register(
            "lightrec_spawn", cls, description="lightrec with start_method='spawn'", start_method="spawn"
        )
