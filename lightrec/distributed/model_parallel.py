"""``DistributedModelParallel``: shard every embedding collection of a model, replicate the rest.

::

    model = DLRM(EmbeddingBagCollection(tables, device="meta"), ...)
    model = DistributedModelParallel(model, device=torch.device("cpu"))     # plans, shards, wraps in DDP
    opt = CombinedOptimizer([model.fused_optimizer,
                             KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                                   lambda ps: torch.optim.Adagrad(ps, lr=0.01))])
    loss = model(dense, kjt).sum(); loss.backward(); opt.step()

Construction (collective: every rank builds the same model and calls it together):

1. **Plan** -- the given ``plan``, else ``lightrec.distributed.planner.plan_sharding`` with
   ``collective=True`` (``EmbeddingShardingPlanner``: rank 0 plans, every rank receives it).
2. **Shard** -- every module at a path of the plan whose type a sharder handles is replaced by its
   sharded version. Tables on ``meta`` are created only as this rank's shards (a table never
   exists whole anywhere), each initialised from its config with a per-table seed so the values do
   not depend on the plan or world size. Tables that already hold weights **keep them** (each rank
   copies its blocks) -- unlike torchrec, which re-initialises them.
   Before sharding, the ranks compare a fingerprint of their tables, plan and world
   (``lightrec.distributed.dmp.fingerprint``); a difference raises ``RankMismatchError`` on every rank.
3. **Dense part** -- everything outside the sharded modules (parameters, buffers, metric states)
   moves to ``device``, ``meta`` dense parameters are materialised (``reset_parameters``), then
   every trainable parameter outside the sharded modules is wrapped in ``DistributedDataParallel``
   (on its own process group, so its all-reduces never interleave with the embedding all-to-alls).

A module that already holds sharded collections (a ``DistributedModelParallel`` built on it
before, e.g. by ``RecStrategy`` for an earlier ``fit``) keeps them as they are: their plan is
taken over (a plan naming them must agree) and the wrapper is rebuilt around them, so the same
sharded tables serve fit, validate, test and predict. They must be on this world and ``device``.

The dense part is wrapped by a ``DataParallelWrapper`` (torchrec's hook: ``wrap(dmp, env, device)``
sets ``dmp._dmp_wrapped_module``); the default, :class:`DefaultDataParallelWrapper`, is the DDP of
step 3 with torchrec's arguments, which override lightrec's DDP defaults only when given.

Gradient semantics (docs/sharding.md): every parameter, dense or embedding, model-parallel or
replicated, receives the gradient of the *mean* of the per-rank losses.
"""

from __future__ import annotations

import abc
import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from lightrec._compat import ddp_buffer_sync
from lightrec.distributed.comm.failures import collective_guard, timeout_of
from lightrec.distributed.comm.sharding_env import ShardingEnv, as_env, resolve_group
from lightrec.distributed.comm.shm_allreduce import register_shm_allreduce
from lightrec.distributed.dmp.default_sharders import get_default_sharders
from lightrec.distributed.dmp.fingerprint import check_ranks_agree, describe
from lightrec.distributed.dmp.placement import move_dense_to_device, outermost
from lightrec.distributed.model_tracker import (
    DeltaTrackerConfig,
    ModelDeltaTracker,
    ModelDeltaTrackerTrec,
    Trackers,
)
from lightrec.distributed.planner.plan import ModuleSharder, ShardingPlan, shardable_modules
from lightrec.distributed.planner.planning import plan_sharding, topology_for
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.collection_sharder import CollectionSharder
from lightrec.distributed.sharding.state_dict import gather_full_state_dict
from lightrec.distributed.train_pipeline.sparse_dist_pipeline import SparseDistPipeline
from lightrec.optim.keyed import CombinedOptimizer

__all__ = [
    "DataParallelWrapper",
    "DefaultDataParallelWrapper",
    "DistributedModelParallel",
    "get_module",
    "get_unwrapped_module",
]


def _same_device(device: torch.device) -> torch.device:
    """``cuda`` and ``cuda:<current>`` are the same device (so are ``cpu`` and ``cpu:0``)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device.type) if device.type == "cpu" else device


def _with_adopted(plan: ShardingPlan, adopted: Mapping[str, ShardedCollectionBase]) -> ShardingPlan:
    """``plan`` plus the module plans of already-sharded collections it does not name (a new object)."""
    missing = {path: m.module_sharding_plan() for path, m in adopted.items() if path not in plan.plan}
    return ShardingPlan({**plan.plan, **missing}) if missing else plan


@contextlib.contextmanager
def _process_groups_shared() -> Iterator[None]:
    """Inside the block ``copy.deepcopy`` keeps process groups as they are (a copy of a sharded
    model talks over the same groups; a group cannot be copied)."""
    cls = dist.ProcessGroup
    saved = cls.__dict__.get("__deepcopy__")
    setattr(cls, "__deepcopy__", lambda group, memo: group)  # noqa: B010 (a class of torch's C++ bindings)
    try:
        yield
    finally:
        if saved is None:
            delattr(cls, "__deepcopy__")
        else:
            setattr(cls, "__deepcopy__", saved)  # noqa: B010


_COMM_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


class DataParallelWrapper(abc.ABC):
    """Wraps the dense part of a ``DistributedModelParallel`` (torchrec's interface)."""

    @abc.abstractmethod
    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        """Replace ``dmp._dmp_wrapped_module`` (the sharded model) by its data-parallel wrapper."""


class DefaultDataParallelWrapper(DataParallelWrapper):
    """``DistributedDataParallel`` over every trainable parameter outside the sharded collections.

    Args:
        bucket_cap_mb, static_graph, find_unused_parameters: DDP's arguments (None: lightrec's
            defaults, DDP's own except ``gradient_as_bucket_view=True``).
        allreduce_comm_precision: ``"fp16"`` or ``"bf16"``: all-reduce the gradients compressed to
            that precision (torch's compress hooks); None: full precision.
        params_to_ignore: further parameter names (of the unwrapped model) DDP leaves alone.
        ddp_kwargs: any other ``DistributedDataParallel`` arguments.
        shm_allreduce: True: on CPU gloo ranks of one host, all-reduce the full-precision gradients
            through shared memory (``comm/shm_allreduce.py``: the same bytes as gloo's on two ranks;
            ``LIGHTREC_SHM_ALLREDUCE=0`` turns it off everywhere). False (the default): DDP's own
            all-reduce -- measured as fast on the quiet 2-rank DLRM (1.00x: gloo's all-reduce
            already runs beside the backward, 0.3 ms of it exposed), and free to take another
            communication hook on ``dmp.data_parallel`` (DDP takes one).
            ``dmp.dense_allreduce`` says which one runs, and why.

    Raises:
        ValueError: an ``allreduce_comm_precision`` other than ``"fp16"`` / ``"bf16"``.
    """

    def __init__(
        self,
        bucket_cap_mb: int | None = None,
        static_graph: bool | None = None,
        find_unused_parameters: bool | None = None,
        allreduce_comm_precision: str | None = None,
        params_to_ignore: list[str] | None = None,
        ddp_kwargs: dict[str, Any] | None = None,
        shm_allreduce: bool = False,
    ) -> None:
        if allreduce_comm_precision is not None and allreduce_comm_precision not in _COMM_HOOKS:
            raise ValueError(
                f"allreduce_comm_precision must be 'fp16', 'bf16' or None, got {allreduce_comm_precision!r}"
            )
        given = {"bucket_cap_mb": bucket_cap_mb, "static_graph": static_graph,
                 "find_unused_parameters": find_unused_parameters}  # fmt: skip
        self.ddp_kwargs = {**{k: v for k, v in given.items() if v is not None}, **(ddp_kwargs or {})}
        self.allreduce_comm_precision = allreduce_comm_precision
        self.params_to_ignore = list(params_to_ignore or [])
        self.shm_allreduce = shm_allreduce

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        dmp._dmp_wrapped_module = dmp._wrap_dense(dmp._dmp_wrapped_module, self.ddp_kwargs, self.params_to_ignore)
        ddp = dmp.data_parallel
        if ddp is None:
            return
        if self.allreduce_comm_precision is not None:
            ddp.register_comm_hook(None, _COMM_HOOKS[self.allreduce_comm_precision])
            dmp.dense_allreduce = f"DDP's, compressed to {self.allreduce_comm_precision}"
        elif not self.shm_allreduce:
            dmp.dense_allreduce = "DDP's own (shm_allreduce=False)"
        else:  # collective over DDP's group on gloo, as the wrapping is
            reason = register_shm_allreduce(ddp)
            dmp.dense_allreduce = "shared memory" if reason is None else f"DDP's own ({reason})"


class DistributedModelParallel(nn.Module):
    """Model parallel embeddings + data parallel dense layers (see the module docstring).

    Args:
        module: the model (its embedding collections may be on ``meta``).
        env: sharding environment (default: the default process group, which must exist).
        device: where shards and dense parameters live (default CPU).
        plan: a :class:`ShardingPlan` (default: planned, see above).
        sharders: sharders to use (default :func:`get_default_sharders`).
        init_data_parallel: wrap the dense part in DDP when the world has several ranks. With
            ``False`` the dense part stays unwrapped until :meth:`init_data_parallel` is called
            (torchrec's lazy wrapping).
        init_parameters: move the dense part (everything outside the sharded collections:
            parameters, buffers, metric states) to ``device``, materialising ``meta`` dense
            parameters with their ``reset_parameters``. With ``False`` it is left as it is.
        seed: base seed of the initialisation of ``meta`` tables.
        ddp_kwargs: extra ``DistributedDataParallel`` arguments (override lightrec's defaults,
            e.g. ``{"find_unused_parameters": True}``).
        data_parallel_wrapper: wraps the dense part when ``init_data_parallel`` (torchrec's hook;
            default :class:`DefaultDataParallelWrapper`).
    """

    def __init__(
        self,
        module: nn.Module,
        env: ShardingEnv | dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        plan: ShardingPlan | None = None,
        sharders: Sequence[ModuleSharder] | None = None,
        init_data_parallel: bool = True,
        init_parameters: bool = True,
        seed: int = 0,
        ddp_kwargs: dict[str, Any] | None = None,
        data_parallel_wrapper: DataParallelWrapper | None = None,
    ) -> None:
        super().__init__()
        self._ddp_kwargs = dict(ddp_kwargs or {})
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        self._env = as_env(env)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._sharders = list(sharders) if sharders is not None else get_default_sharders()
        if plan is not None and not isinstance(plan, ShardingPlan):
            raise TypeError(f"plan must be a ShardingPlan, got {type(plan).__name__}")
        adopted = {
            p: m
            for p, m in outermost(module, (ShardedCollectionBase,))
            if isinstance(m, ShardedCollectionBase)
        }
        if plan is None and not shardable_modules(module, self._sharders):
            plan = ShardingPlan()  # nothing left to shard: no planning (the sharded ones bring their plan)
        elif plan is None:
            topology = topology_for(self._env.world_size, self.device.type)
            plan = plan_sharding(module, self._sharders, topology, collective=True, pg=self._env.pg).plan
        self._plan = _with_adopted(plan, adopted)
        # Before any collective of the sharding: ranks with other tables or plans fail here, by name.
        mine = describe(module, self._sharders, self._plan, self._env.world_size, self.device.type)
        check_ranks_agree(mine, self._env.pg)
        module, self._sharded_paths = self._shard(module, seed, adopted)
        if init_parameters:
            # The dense part (parameters, buffers, any module's device state such as metric
            # states) goes to `device`; sharded collections already are where the plan put them.
            move_dense_to_device(module, self.device, (ShardedCollectionBase,))
        self._dmp_wrapped_module = module
        # Which all-reduce the dense gradients take (the data-parallel wrapper says; a report line).
        self.dense_allreduce = "none: the dense part is not data parallel"
        self._data_parallel_wrapper = (
            data_parallel_wrapper if data_parallel_wrapper is not None else DefaultDataParallelWrapper()
        )
        self._ddp_wrapped = False
        if init_data_parallel:
            self.init_data_parallel()
        self._bind_sharded()
        self.model_trackers: dict[str, ModelDeltaTracker] = {}  # torchrec's: by Trackers member name

    def __setattr__(self, name: str, value: Any) -> None:
        # nn.Module.__setattr__ registers any nn.Module value as a submodule before a property's
        # setter could run: `dmp.module = m` would add a stray child "module" and change nothing.
        if name == "module":
            object.__setattr__(self, name, value)  # the property's setter
        else:
            super().__setattr__(name, value)

    def _bind_sharded(self) -> None:
        """(Re)build what is built over the sharded collections: the fused optimizer and the pipeline."""
        sharded = self._sharded_modules()
        self._fused_optimizer = CombinedOptimizer([(path, m.fused_optimizer) for path, m in sharded.items()])
        self._pipeline = SparseDistPipeline(sharded.values())

    # ---- construction ---------------------------------------------------------------------
    def _shard(
        self, module: nn.Module, seed: int, adopted: dict[str, ShardedCollectionBase]
    ) -> tuple[nn.Module, list[str]]:
        paths = []
        for path, sharded in adopted.items():
            self._check_adoptable(path, sharded)
            paths.append(path)
        shardable = shardable_modules(module, self._sharders)
        unmatched = sorted(set(self._plan.plan) - set(shardable) - set(adopted))
        if unmatched:
            raise ValueError(
                f"plan names module paths {unmatched} that are not shardable modules of {type(module).__name__}; "
                f"its shardable modules are {sorted(shardable)}. Plan this module (under RecStrategy: the "
                "LightningModule, e.g. 'model.sparse_arch.embedding_bag_collection') or fix the paths"
            )
        for path, (m, sharder) in shardable.items():
            module_plan = self._plan.get_plan_for_module(path)
            if module_plan is None:
                continue  # not in the plan: stays an ordinary (data parallel) module
            shard = getattr(sharder, "shard", None)
            if not callable(shard):
                raise TypeError(
                    f"sharder {type(sharder).__name__} for the module at {path!r} has no shard(module, params, "
                    "env, device, module_fqn) method; give DistributedModelParallel sharders that build sharded "
                    "modules (e.g. lightrec.distributed.get_default_sharders())"
                )
            kwargs = {"seed": seed} if isinstance(sharder, CollectionSharder) else {}
            sharded = shard(m, module_plan, self._env, self.device, path, **kwargs)
            paths.append(path)
            if path == "":
                module = sharded
            else:
                parent_path, _, name = path.rpartition(".")
                setattr(module.get_submodule(parent_path), name, sharded)
        return module, paths

    def _check_adoptable(self, path: str, sharded: ShardedCollectionBase) -> None:
        """An already-sharded collection is kept as is if it was sharded for this world, device and plan."""
        where = f"the module at {path!r} is already a {type(sharded).__name__}"
        self._check_same_world(where, sharded)
        wanted = self._plan.get_plan_for_module(path)
        if wanted is not None and dict(wanted) != dict(sharded.module_sharding_plan()):
            raise ValueError(
                f"{where} sharded by another plan than the one given for it; a live sharded module is never "
                "resharded: save a checkpoint and load it into a model sharded by the new plan"
            )

    def _check_same_world(self, where: str, sharded: ShardedCollectionBase) -> None:
        """``sharded`` was sharded for this rank, world size and device."""
        env = sharded.sharding_env
        if (env.rank, env.world_size) != (self._env.rank, self._env.world_size):
            raise ValueError(
                f"{where} sharded for rank {env.rank} of {env.world_size}, but this DistributedModelParallel "
                f"runs rank {self._env.rank} of {self._env.world_size}; build the model afresh (or load a "
                "checkpoint into a model sharded for this world)"
            )
        if _same_device(sharded.device) != _same_device(self.device):
            raise ValueError(
                f"{where} whose shards live on {sharded.device}, but device={self.device} was asked for; "
                f"sharded tables do not move: pass device={sharded.device} or build the model afresh"
            )

    def _wrap_dense(
        self, module: nn.Module, ddp_kwargs: Mapping[str, Any] | None = None, also_ignore: list[str] | None = None
    ) -> nn.Module:
        """``module`` in DDP (``DefaultDataParallelWrapper``); ``ddp_kwargs`` override ``self._ddp_kwargs``."""
        # Sharded collections sync nothing through DDP: their parameters and their buffers (a
        # managed-collision shard's id map has a size of its own on every rank).
        ignore = [
            f"{path}.{name}" if path else name
            for path in self._sharded_paths
            for name, _ in [*module.get_submodule(path).named_parameters(), *module.get_submodule(path).named_buffers()]
        ] + list(also_ignore or [])
        ignored = set(ignore)
        trainable = [p for n, p in module.named_parameters() if n not in ignored and p.requires_grad]
        if self._env.world_size == 1 or not trainable:
            return module
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, ignore)
        group = resolve_group(self._env.pg)
        ranks = dist.get_process_group_ranks(group)
        # The DDP group inherits the sharding group's timeout: with torch's default (30 min on
        # gloo) a rank that dies inside the dense backward would leave the others hanging.
        ddp_group = dist.new_group(ranks=ranks, backend=dist.get_backend(group), timeout=timeout_of(group))
        # Integer buffers (index tables such as the interaction's triu indices) never change and
        # are the same on every rank by construction: no per-forward broadcast (torch < 2.13 then
        # skips their initial sync too, see lightrec._compat); float buffers (running stats) sync
        # every forward.
        constant_buffers = all(
            not b.is_floating_point() for n, b in module.named_buffers() if n not in ignored
        )
        kwargs: dict[str, Any] = {
            "device_ids": [self.device] if self.device.type == "cuda" else None,
            "process_group": ddp_group,
            "gradient_as_bucket_view": True,
            **ddp_buffer_sync(every_forward=not constant_buffers),
        }
        kwargs.update(self._ddp_kwargs)
        kwargs.update(ddp_kwargs or {})
        return DistributedDataParallel(module, **kwargs)

    def _sharded_modules(self) -> dict[str, ShardedCollectionBase]:
        root = self.module
        out: dict[str, ShardedCollectionBase] = {}
        for path in self._sharded_paths:
            sharded = root.get_submodule(path)
            assert isinstance(sharded, ShardedCollectionBase)  # _shard put it there
            out[path] = sharded
        return out

    # ---- public surface --------------------------------------------------------------------
    def init_data_parallel(self) -> None:
        """Wrap the dense part with the ``data_parallel_wrapper`` (default: DDP), once: what the
        constructor does unless given ``init_data_parallel=False``; later calls do nothing
        (torchrec's method). Collective: every rank calls it together, before the first forward."""
        if not self._ddp_wrapped:
            self._data_parallel_wrapper.wrap(self, self._env, self.device)
            self._ddp_wrapped = True

    @property
    def module(self) -> nn.Module:
        """The sharded model without the DDP wrapper (its state dict keys are the unsharded ones).

        Assigning replaces the model (torchrec's setter), before the dense part is data parallel
        (built with ``init_data_parallel=False``, or on one rank): ``forward``, ``state_dict`` and
        ``named_modules`` then use the new model. Its sharded collections (e.g. the old model's,
        taken over) must be sharded for this world and device; ``plan``, ``fused_optimizer`` and
        ``pipeline`` are rebuilt over them (take them again). Nothing is sharded or moved.

        Raises:
            TypeError: the value is not an ``nn.Module``, or is a DMP / DDP wrapper.
            RuntimeError: the dense part is already data parallel, or a delta tracker watches the model.
            ValueError: a sharded collection of the value was sharded for another world or device.
        """
        wrapped = self._dmp_wrapped_module
        return wrapped.module if isinstance(wrapped, DistributedDataParallel) else wrapped

    @module.setter
    def module(self, value: nn.Module) -> None:
        if not isinstance(value, nn.Module) or isinstance(value, (DistributedModelParallel, DistributedDataParallel)):
            raise TypeError(
                "DistributedModelParallel.module must be set to the unwrapped model (an nn.Module holding sharded "
                f"collections), got {type(value).__name__}"
            )
        if self._dmp_wrapped_module is not self.module or (self._ddp_wrapped and self._env.world_size > 1):
            raise RuntimeError(
                "DistributedModelParallel.module can't be set after init_data_parallel() made the dense part data "
                "parallel (DDP wraps the old model); build it with init_data_parallel=False, set module, then call "
                "init_data_parallel() on every rank"
            )
        if self.model_trackers:
            raise RuntimeError(
                f"DistributedModelParallel.module can't be set while delta trackers {sorted(self.model_trackers)} "
                "watch the current model; set module before init_torchrec_delta_tracker()"
            )
        adopted = outermost(value, (ShardedCollectionBase,))
        for path, sharded in adopted:
            assert isinstance(sharded, ShardedCollectionBase)  # outermost's kinds
            self._check_same_world(f"the module at {path!r} of the new module is a {type(sharded).__name__}", sharded)
        self._dmp_wrapped_module = value
        self._sharded_paths = [path for path, _ in adopted]
        self._plan = _with_adopted(ShardingPlan(), self._sharded_modules())
        self._bind_sharded()

    def copy(self, device: torch.device | str) -> DistributedModelParallel:
        """An independent copy of this model (torchrec's ``copy``): every table shard, dense
        parameter, buffer and fused optimizer state is copied, and nothing is shared with this
        model but the process groups (the copy's forward is collective, as this one's). Local:
        no collective runs, so one rank may copy alone.

        Unlike torchrec's, the copy is not data parallel (wrapping is collective): call its
        :meth:`init_data_parallel` on every rank to train it so; it has no delta trackers.

        Args:
            device: the copy's device; must be this model's (sharded tables do not move: their
                kernels and exchanges are built for it).

        Data-parallel tables train in the copy as here: their in-backward updates are hooked again
        onto the copy's replicas (``DataParallelTableSync.__deepcopy__``), with the copy's state.

        Raises:
            ValueError: ``device`` is not this model's device.
        """
        target = torch.device(device)
        if _same_device(target) != _same_device(self.device):
            raise ValueError(
                f"copy(device={target}) of a DistributedModelParallel on {self.device}: sharded tables do not move "
                f"between devices; copy(device={self.device}) copies it where it is. For {target}, build a "
                f"DistributedModelParallel(..., device={target}) and load this model's state_dict() into it"
            )
        memo: dict[int, Any] = {}
        with _process_groups_shared():
            module = copy.deepcopy(self.module, memo)
            memo[id(self._dmp_wrapped_module)] = module  # the copy holds the model without DDP
            for uncopied in (self._fused_optimizer, self._pipeline, self.model_trackers):
                memo[id(uncopied)] = None  # rebuilt below
            twin = copy.deepcopy(self, memo)
        twin._ddp_wrapped = False
        twin.dense_allreduce = "none: the dense part is not data parallel"
        twin.model_trackers = {}
        twin._bind_sharded()
        return twin

    @property
    def data_parallel(self) -> DistributedDataParallel | None:
        """The ``DistributedDataParallel`` wrapping the dense part, e.g. to register a communication
        hook on (None: not wrapped -- one rank, nothing dense to train, or ``init_data_parallel=False``).
        On CPU gloo ranks of one host it has lightrec's shared-memory hook already (DDP takes one):
        build with ``DefaultDataParallelWrapper(shm_allreduce=False)`` to register another."""
        wrapped = self._dmp_wrapped_module
        return wrapped if isinstance(wrapped, DistributedDataParallel) else None

    @property
    def plan(self) -> ShardingPlan:
        return self._plan

    @property
    def fused_optimizer(self) -> CombinedOptimizer:
        """Every sharded collection's in-backward optimizer, parameter names prefixed by module path."""
        return self._fused_optimizer

    @property
    def pipeline(self) -> SparseDistPipeline:
        """The pipeline over the sharded collections: ``forward`` launches through it, and
        ``SparseDistPrefetch`` (or a train loop) starts the next batch's input dist with it."""
        return self._pipeline

    def init_torchrec_delta_tracker(self, delta_tracker_config: DeltaTrackerConfig) -> ModelDeltaTracker:
        """The model's delta tracker (``lightrec.distributed.model_tracker``), built from
        ``delta_tracker_config`` on the first call (later calls return the same tracker, as torchrec's)."""
        name = Trackers.DELTA_TRACKER.name
        if name not in self.model_trackers:
            config = delta_tracker_config
            self.model_trackers[name] = ModelDeltaTrackerTrec(
                self.module, consumers=config.consumers, delete_on_read=config.delete_on_read,
                auto_compact=config.auto_compact, mode=config.tracking_mode, fqns_to_skip=config.fqns_to_skip,
            )  # fmt: skip
        return self.model_trackers[name]

    def get_delta_tracker(self) -> ModelDeltaTracker | None:
        """The delta tracker :meth:`init_torchrec_delta_tracker` built, or None."""
        return self.model_trackers.get(Trackers.DELTA_TRACKER.name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model. Each sharded collection that one ``KeyedJaggedTensor`` of the arguments
        feeds -- directly, or as a field of a dataclass argument such as ``lightrec.Batch`` (what
        Lightning passes through ``training_step``) -- has its lookup launched first
        (``SparseDistPipeline.launch``): its all-to-alls then overlap with the dense layers, forward
        and backward."""
        for tracker in self.model_trackers.values():
            tracker.step()  # the trackers' batch index (torchrec's order: before the forward)
        with collective_guard("a forward collective of DistributedModelParallel (embedding all-to-alls)"):
            self._pipeline.launch((*args, *kwargs.values()))
            return self._dmp_wrapped_module(*args, **kwargs)

    def state_dict(
        self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False
    ) -> Any:
        """Keys of the unsharded model; model-parallel tables as ``ShardedTableState`` (this rank's shards)."""
        return self.module.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False, *, prefix: str = ""
    ) -> Any:
        """Load a sharded state dict of the same plan, or full tables into any plan (resharding).

        Args:
            state_dict: keys of the unsharded model (what :meth:`state_dict` returns).
            strict, assign: as ``nn.Module.load_state_dict``.
            prefix: torchrec's argument: load the keys that start with it, with it removed (what
                ``state_dict(prefix=...)`` wrote); keys without it are left alone.

        Raises:
            TypeError: ``strict`` is not a bool (torchrec's order is ``(state_dict, prefix, strict)``:
                pass ``prefix`` by keyword).
        """
        if not isinstance(strict, bool):
            raise TypeError(
                f"strict must be a bool, got {strict!r}; lightrec's order is load_state_dict(state_dict, strict, "
                "assign) (torch's): pass torchrec's prefix by keyword, load_state_dict(state_dict, prefix=...)"
            )
        if prefix:
            state_dict = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def gather_full_state_dict(self, dst: int | None = None) -> dict[str, Any]:
        """Full tables (plain tensors) on every rank, or only on rank ``dst`` (``{}`` elsewhere). Collective."""
        return gather_full_state_dict(self.state_dict(), self._env.pg, dst)

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        return self.module.named_parameters(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, torch.Tensor]]:
        return self.module.named_buffers(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)


def get_module(module: nn.Module) -> nn.Module:
    """The model inside a ``DistributedModelParallel`` (torchrec's ``get_module``): its DDP wrapper,
    if any, is kept, so the wrapper's overrides still apply; any other module is returned as is."""
    return module._dmp_wrapped_module if isinstance(module, DistributedModelParallel) else module


def get_unwrapped_module(module: nn.Module) -> nn.Module:
    """The model inside every ``DistributedModelParallel`` / ``DistributedDataParallel`` wrapper."""
    while isinstance(module, (DistributedModelParallel, DistributedDataParallel)):
        module = module._dmp_wrapped_module if isinstance(module, DistributedModelParallel) else module.module
    return module
