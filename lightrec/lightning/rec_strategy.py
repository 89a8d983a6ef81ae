"""``RecStrategy``: Lightning strategy for model-parallel embeddings + data-parallel dense layers.

It is a ``DDPStrategy`` in everything that is about processes — launchers (subprocess script,
spawn, torchrun/SLURM environments), process-group initialisation in ``setup_environment``
(gloo on CPU, NCCL on GPU), ``reduce``/``barrier``/``broadcast``/``all_gather`` — and differs in
what ``setup`` does to the model: instead of wrapping it in DDP, it hands the LightningModule to
``DistributedModelParallel``, which plans (or takes the given plan), replaces every embedding
collection by its sharded version (materialising only local shards of meta-device tables) and
wraps the remaining dense parameters in DDP.

Nothing here creates process groups inside the user's module or skips moving the model: dense
parameters are moved to the root device, embedding shards are placed by the plan.

Device placement across stages (one ``Trainer``: fit, then validate / test / predict):

* ``model_to_device`` moves the *dense part* with the module's own ``.to()`` -- parameters,
  buffers and every other kind of device state, torchmetrics states included -- with the
  embedding collections taken out of the tree meanwhile (``lightrec.distributed.placement``):
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
from datetime import timedelta
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn
from typing_extensions import override

from lightrec._compat import default_pg_timeout, optimizers_to_device
from lightrec.distributed.placement import detached, move_dense_to_device
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.modules import EmbeddingBagCollection, EmbeddingCollection

__all__ = ["RecStrategy"]

#: Placed by the plan, not by ``model_to_device``: unsharded collections (possibly on ``meta``;
#: their sharder materialises this rank's shards) and sharded ones (already placed).
_PLACED_BY_PLAN = (EmbeddingBagCollection, EmbeddingCollection, ShardedCollectionBase)


def _has_unsharded_collections(module: nn.Module) -> bool:
    return any(type(m) in (EmbeddingBagCollection, EmbeddingCollection) for m in module.modules())


class RecStrategy(DDPStrategy):
    """Shard embedding collections across ranks; run everything else data-parallel.

    Args:
        plan: a fixed ``ShardingPlan`` or a path to its JSON; planned automatically when ``None``.
        topology / constraints: planner inputs (``lightrec.distributed.planner.Topology``,
            ``{table: ParameterConstraints}``) used when ``plan`` is ``None``.
        fused_params: the fused embedding optimizer, torchrec style, e.g.
            ``{"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.02, "eps": 1e-8}``.
        sharders: custom sharders (default: EBC and EC sharders built from ``fused_params``).
        kernel_backend: lookup kernels of the default sharders: ``"auto"`` (fbgemm TBE where it
            supports the tables, else Triton on CUDA, else pure torch), ``"fbgemm"``, ``"triton"`` or ``"torch"``.
        process_group_backend / timeout / start_method: as for ``DDPStrategy``.
        **ddp_kwargs: forwarded to the DDP wrapper of the dense parameters.
    """

    strategy_name = "lightrec"

    def __init__(
        self,
        accelerator: pl.accelerators.Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        plan: Any = None,
        topology: Any = None,
        constraints: dict[str, Any] | None = None,
        fused_params: dict[str, Any] | None = None,
        sharders: list[Any] | None = None,
        kernel_backend: str = "auto",
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        **ddp_kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            **ddp_kwargs,
        )
        if isinstance(plan, (str, os.PathLike)):
            from lightrec.distributed.types import ShardingPlan

            plan = ShardingPlan.load(plan)
        self._plan = plan
        self._topology = topology
        self._constraints = constraints
        self._fused_params = dict(fused_params or {})
        self._sharders = sharders
        from lightrec.distributed.sharding.collection import check_kernel_backend

        check_kernel_backend(kernel_backend)
        self._kernel_backend = kernel_backend
        self.dmp: nn.Module | None = None
        self._used_plan: Any = None
        self.plan_report: Any = None  # the planner's PlanReport when this strategy planned

    # ------------------------------------------------------------------ model set-up
    @property
    def plan(self) -> Any:
        """The ``ShardingPlan`` in use (after ``setup``; kept after ``teardown``), or the one given."""
        if self.dmp is not None:
            return self.dmp.plan
        return self._used_plan if self._used_plan is not None else self._plan

    @override
    def model_to_device(self) -> None:
        """Move the dense part (parameters, buffers, metric states, ...) to the root device; embedding
        collections are placed by the plan (see the module docstring)."""
        assert self.model is not None
        move_dense_to_device(self.model, self.root_device, _PLACED_BY_PLAN)

    def _build_sharders(self) -> list[Any]:
        if self._sharders is not None:
            return self._sharders
        from lightrec.distributed import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder

        params = self._fused_params or None
        backend = self._kernel_backend
        return [
            EmbeddingBagCollectionSharder(fused_params=params, kernel_backend=backend),
            EmbeddingCollectionSharder(fused_params=params, kernel_backend=backend),
        ]

    def _plan_for(self, module: nn.Module, sharders: list[Any]) -> Any:
        if self._plan is not None:
            return self._plan
        sharded = any(isinstance(m, ShardedCollectionBase) for m in module.modules())
        if sharded and not _has_unsharded_collections(module):
            # Sharded by an earlier stage: DistributedModelParallel takes over the plan it was sharded by.
            return None
        from lightrec.distributed.planner import EmbeddingShardingPlanner, Topology

        topology = self._topology or Topology(
            world_size=self.world_size,
            local_world_size=self.num_processes,
            compute_device=self.root_device.type,
        )
        planner = EmbeddingShardingPlanner(topology=topology, constraints=self._constraints)
        plan = planner.collective_plan(module, sharders, torch.distributed.group.WORLD)
        self.plan_report = planner.last_report
        return plan

    def _shard(self, module: pl.LightningModule, data_parallel: bool) -> nn.Module:
        from lightrec.distributed import DistributedModelParallel, ShardingEnv

        sharders = self._build_sharders()
        plan = self._plan_for(module, sharders)
        self.dmp = DistributedModelParallel(
            module,
            device=self.root_device,
            plan=plan,
            sharders=sharders,
            env=ShardingEnv.from_process_group(torch.distributed.group.WORLD),
            init_data_parallel=data_parallel,
            **({"ddp_kwargs": self._ddp_kwargs} if self._ddp_kwargs else {}),
        )
        return self.dmp

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        fitting = trainer.state.fn == TrainerFn.FITTING
        with detached(self.model, (ShardedCollectionBase,)):  # sharded by an earlier stage: kept as is
            self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        # Shard for every stage: tables may not fit on one rank even for validate/test/predict.
        self.model = self._shard(self.lightning_module, data_parallel=fitting)
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
        from lightrec.distributed.checkpoint import save_sharded_checkpoint

        training = "optimizer_states" in checkpoint
        save_sharded_checkpoint(
            filepath,
            checkpoint,
            self.lightning_module,
            self.optimizers if training else (),
            [c.scheduler for c in self.lr_scheduler_configs] if "lr_schedulers" in checkpoint else (),
        )

    @override
    def load_checkpoint(self, checkpoint_path: str | os.PathLike, weights_only: bool | None = None) -> dict[str, Any]:
        """Read a sharded checkpoint (or a consolidated one) cut to this rank's shards, for any plan
        and world size; any other file is read as a plain Lightning checkpoint (full tables reshard
        on load, optimizer state must then match the live optimizers)."""
        from lightrec.distributed.checkpoint import (
            CheckpointError,
            is_sharded_checkpoint,
            load_sharded_checkpoint,
            open_checkpoint,
        )

        if is_sharded_checkpoint(checkpoint_path):  # an incomplete folder raises, naming what is missing
            return load_sharded_checkpoint(checkpoint_path, self.lightning_module, self.optimizers)
        try:
            source = open_checkpoint(checkpoint_path)  # a consolidated file, read once
        except CheckpointError:  # any other file: a plain Lightning checkpoint
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        return load_sharded_checkpoint(source, self.lightning_module, self.optimizers)

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
    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Move a ``Batch`` (or any collection holding KJTs) without blocking the host."""
        device = device or self.root_device
        mover = getattr(batch, "to", None)
        if callable(mover) and not isinstance(batch, torch.Tensor):
            return mover(device, non_blocking=True)
        return super().batch_to_device(batch, device, dataloader_idx)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="lightrec: sharded embeddings + data-parallel dense layers"
        )
        strategy_registry.register(
            "lightrec_spawn", cls, description="lightrec with start_method='spawn'", start_method="spawn"
        )
