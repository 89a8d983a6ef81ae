"""Machinery shared by ``ShardedEmbeddingBagCollection`` and ``ShardedEmbeddingCollection``.

A sharded collection groups its tables by sharding type (in order of first appearance in the
table list, the same on every rank) and chains, per type, the three parts built by the sharding
classes::

    _input_dists[i](kjt)   -> DistContext (the KJT all-to-all is in flight)
    _lookups[i](kjt_local) -> this rank's embeddings (one kernel call per optimizer group)
    _output_dists[i](...)  -> awaitable of this rank's samples' embeddings

All input dists are started before any is waited, so their all-to-alls overlap.

Pipelining (``SparseDistPrefetch``): the input dist of the *next* batch may be started ahead of
its forward, in two stages -- :meth:`ShardedCollectionBase.start_input_dist` (the splits
exchange) and :meth:`~ShardedCollectionBase.progress_input_dists` (wait for the splits, start the
lengths/values/weights exchange). The batch's own forward then finds the input dist in flight
and only waits for it before its lookup, which therefore still runs after the previous batch's
backward (the fused optimizer updates rows there). The input dist reads only the ids, never the
tables, so starting it early does not change any result. On CUDA both stages may be issued on a
side stream (``start_input_dist(kjt, stream=...)``): the forward waits for it there, makes its
own stream wait for the side stream and ``record_stream``s what it received
(``lightrec/distributed/streams.py``); the stage-2 host sync then waits for the count exchange only,
not for the work queued on the main stream.

State dict: the kernels' parameters are renamed to the unsharded collection's keys
(``<attr>.<table>.weight``); a model-parallel table's value is a
:class:`~lightrec.distributed.state_dict.ShardedTableState`, a data-parallel table's is its
tensor. Loading takes either form (see ``state_dict.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.sharding import SHARDING_CLASSES
from lightrec.distributed.sharding.common import (
    DistContext,
    EmbeddingSharding,
    ShardedTable,
)
from lightrec.distributed.sharding.data_parallel import DpEmbeddingSharding
from lightrec.distributed.sharding.id_bounds import IdBounds
from lightrec.distributed.sharding.lookups import _GroupedLookupBase
from lightrec.distributed.state_dict import ShardedTableState, local_slice
from lightrec.distributed.streams import handoff, on_stream
from lightrec.distributed.types import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    ModuleSharder,
    ShardingEnv,
    ShardingType,
    ShardMetadata,
    placement_for,
)
from lightrec.kernels.batched_embedding import BACKENDS
from lightrec.modules.embedding_configs import BaseEmbeddingConfig, PoolingType
from lightrec.modules.feature_checks import check_feature_keys
from lightrec.optim.fused_spec import FusedOptimizerSpec
from lightrec.optim.in_backward import fused_spec_from_parameter
from lightrec.optim.keyed import CombinedOptimizer, KeyedOptimizer

__all__ = ["ShardedCollectionBase", "as_env", "normalized_fused_params", "same_features"]


def normalized_fused_params(
    fused_params: Mapping[str, Any] | FusedOptimizerSpec | None,
) -> dict[str, Any] | None:
    """Validate a sharder's ``fused_params`` (errors name the bad key) and return the full dict,
    with the optimizer spelled by its enum *name* (``"ROWWISE_ADAGRAD"``), the spelling every
    consumer (the fused spec, the planner's storage model) understands."""
    spec = FusedOptimizerSpec.coerce(fused_params)
    if spec is None:
        return None
    params = spec.to_fused_params()
    params["optimizer"] = spec.optimizer.name
    return params


def same_features(a: Any, b: Any) -> bool:
    """Whether KJTs ``a`` and ``b`` hold the very same tensors (``b`` may be ``a.to(its device)``,
    which builds a new KJT around the same tensors, as Lightning's ``batch_to_device`` does)."""
    if a is b:
        return True
    if a.values() is not b.values() or a.weights_or_none() is not b.weights_or_none() or a.keys() != b.keys():
        return False
    la, lb, oa, ob = a.lengths_or_none(), b.lengths_or_none(), a.offsets_or_none(), b.offsets_or_none()
    return (la is not None and la is lb) or (oa is not None and oa is ob)


@dataclass
class _PendingInputDist:
    """An input dist started before its forward (``start_input_dist``).

    Attributes:
        features: the KJT it was started for (kept alive, so its tensors identify it).
        stream: the side CUDA stream its work is issued on, or None (the current stream).
        positions: key index in ``features`` of each collection feature (None: same order).
        contexts: one per sharding type; their splits exchanges are in flight.
        bounded: ``features`` after the ``bounds_check`` rewrite (what the input dist sent).
        tensors: one lengths/values exchange awaitable per sharding type once the splits were
            waited (``progress``), else None.
    """

    features: Any
    positions: list[int] | None
    contexts: list[DistContext]
    bounded: Any
    tensors: list[Any] | None = None
    stream: Any = None

    def progress(self) -> list[Any]:
        if self.tensors is None:
            with on_stream(self.stream):
                self.tensors = [c.splits.wait() for c in self.contexts]  # type: ignore[attr-defined]
        return self.tensors

    def received(self, device: torch.device) -> list[Any]:
        """The KJT each sharding looks up (waits for the exchanges). With a side stream: waited
        there, then handed to the current stream of ``device`` (``lightrec.distributed.streams``)."""
        tensors = self.progress()
        with on_stream(self.stream):
            kjts = [t.wait() for t in tensors]
        handoff((kjts, tensors, self.contexts, self.bounded), self.stream, device)
        return kjts


def check_kernel_backend(kernel_backend: str) -> None:
    """Reject an unknown ``kernel_backend`` (one of ``lightrec.kernels`` ``BACKENDS``)."""
    if kernel_backend not in BACKENDS:
        raise ValueError(
            f"kernel_backend must be one of {BACKENDS} (auto: fbgemm where it supports the tables, else "
            f"pure torch), got {kernel_backend!r}"
        )


def as_env(env: ShardingEnv | dist.ProcessGroup | None) -> ShardingEnv:
    """Accept a ``ShardingEnv``, a process group, or None (the default group)."""
    if isinstance(env, ShardingEnv):
        return env
    if env is None or isinstance(env, dist.ProcessGroup):
        if not dist.is_initialized():
            raise RuntimeError(
                "sharding needs torch.distributed: call dist.init_process_group('gloo') (or 'nccl') first, "
                "even for a single process (world size 1)"
            )
        return ShardingEnv.from_process_group(env or dist.group.WORLD)  # type: ignore[arg-type]
    raise TypeError(f"env must be a ShardingEnv or a ProcessGroup, got {type(env).__name__}")


class ShardedCollectionBase(nn.Module):
    """Common construction, forward plumbing, optimizer and state dict of sharded collections.

    Args:
        module: the unsharded collection (on ``meta``: shards are initialised; otherwise the
            local blocks of its weights are copied -- the weights are kept, see docs/sharding.md).
        table_plan: ``{table: ParameterSharding}`` for every table of ``module``.
        env: sharding environment.
        device: where this rank's shards live.
        fused_params: the sharder's fused optimizer (torchrec-style dict or spec), used for
            tables whose weight was not marked with ``apply_optimizer_in_backward``.
        seed: base seed of shard initialisation.
        kernel_backend: ``"auto"`` (fbgemm TBE where it supports a table group, else Triton on
            CUDA, else pure torch), ``"fbgemm"`` (an error names a group it cannot run), ``"triton"`` or ``"torch"``.
    """

    _attr = "embedding_bags"
    _pooled = True
    _configs_getter = "embedding_bag_configs"

    def __init__(
        self,
        module: nn.Module,
        table_plan: EmbeddingModuleShardingPlan | Mapping[str, Any],
        env: ShardingEnv,
        device: torch.device,
        fused_params: Mapping[str, Any] | FusedOptimizerSpec | None,
        seed: int = 0,
        kernel_backend: str = "auto",
    ) -> None:
        super().__init__()
        check_kernel_backend(kernel_backend)
        configs = self._configs_of(module)
        self._configs = list(configs)
        self._env = env
        self._device = device
        self._is_weighted = bool(getattr(module, "is_weighted", lambda: False)())
        self._id_bounds = IdBounds(
            getattr(module, "_bounds_check", "error"),
            {f: c.num_embeddings for c in configs for f in c.feature_names},
        )
        self._check_plan(configs, table_plan)
        self._feature_order = [f for c in configs for f in c.feature_names]
        default_spec = FusedOptimizerSpec.coerce(fused_params) or FusedOptimizerSpec()
        holders = getattr(module, self._attr)
        by_type: dict[str, list[ShardedTable]] = {}
        for c in configs:
            ps = table_plan[c.name]
            weight = holders[c.name].weight
            dense = ps.compute_kernel == EmbeddingComputeKernel.DENSE.value
            spec: FusedOptimizerSpec | None = fused_spec_from_parameter(weight) or default_spec
            if dense and ps.sharding_type != ShardingType.DATA_PARALLEL.value:
                spec = None  # plain autograd gradients; the dense optimizer steps the shards
            shards = list(ps.sharding_spec or [])
            if ps.sharding_type == ShardingType.DATA_PARALLEL.value or not shards:
                shards = [ShardMetadata([0, 0], [c.num_embeddings, c.embedding_dim],
                                        placement_for(env.rank, device.type, env.world_size))]  # fmt: skip
            bad = [s.placement for s in shards if s.rank >= env.world_size]
            if bad:
                raise ValueError(
                    f"table {c.name!r} is placed on {bad}, beyond world size {env.world_size}; re-plan"
                )
            source = None if weight.device.type == "meta" else weight.detach()
            pooling = getattr(c, "pooling", PoolingType.NONE) if self._pooled else PoolingType.NONE
            by_type.setdefault(ps.sharding_type, []).append(
                ShardedTable(c, ps, shards, spec, source, pooling, kernel_backend)
            )
        self._shardings: list[EmbeddingSharding] = [
            SHARDING_CLASSES[st](
                tables, self._feature_order, env, device, self._pooled, self._is_weighted, seed
            )
            for st, tables in by_type.items()
        ]
        self._column_index = self._output_column_index() if self._pooled else None
        self._input_dists = nn.ModuleList(s.create_input_dist() for s in self._shardings)
        self._lookups = nn.ModuleList(s.create_lookup() for s in self._shardings)
        self._output_dists = nn.ModuleList(s.create_output_dist() for s in self._shardings)
        self._tables = {t.name: t for tables in by_type.values() for t in tables}
        for t in self._tables.values():
            t.source = None  # never keep a reference to the unsharded weight
        setattr(self, self._attr, nn.ModuleDict({c.name: nn.Module() for c in configs}))
        self._local_params = self._index_local_params()
        self._fused_optimizer = self._build_fused_optimizer()
        self._positions_cache: dict[tuple[str, ...], list[int]] = {}
        self._prefetchable: dict[tuple[str, ...], bool] = {}
        self._prefetched: tuple[Any, Any] | None = None
        self._pending_input_dists: list[_PendingInputDist] = []  # oldest first
        self._register_state_dict_hook(_state_dict_hook)
        self._register_load_state_dict_pre_hook(_load_pre_hook, with_module=True)

    # ---- construction helpers ---------------------------------------------------------------
    def _configs_of(self, module: nn.Module) -> list[BaseEmbeddingConfig]:
        getter = getattr(module, self._configs_getter, None)
        if not callable(getter):
            raise TypeError(
                f"{type(self).__name__} shards modules with a {self._configs_getter}() method, got {type(module).__name__}"
            )
        return list(getter())

    def _check_plan(self, configs: list[BaseEmbeddingConfig], plan: Mapping[str, Any]) -> None:
        names = [c.name for c in configs]
        missing = [n for n in names if n not in plan]
        unknown = [n for n in plan if n not in names]
        if missing or unknown:
            raise KeyError(
                f"the module plan must give a ParameterSharding for every table of the {type(self).__name__}: "
                f"missing {missing}, unknown {unknown} (tables: {names})"
            )

    def _output_column_index(self) -> torch.Tensor | None:
        """Columns of the concatenated sharding outputs, in feature order (None: already so).

        A collection with a single all-to-all sharding type has its output dist write the
        feature order directly (no extra copy); then the index is None as well.
        """
        layout = [block for s in self._shardings for block in s.output_layout()]
        starts: dict[tuple[str, int], int] = {}
        col = 0
        for feature, col_offset, cols in layout:
            starts[(feature, col_offset)] = col
            col += cols
        index: list[int] = []
        for feature in self._feature_order:
            for _, col_offset, cols in sorted((b for b in layout if b[0] == feature), key=lambda b: b[1]):
                start = starts[(feature, col_offset)]
                index += range(start, start + cols)
        if index == list(range(len(index))):
            return None
        if len(self._shardings) == 1 and hasattr(self._shardings[0], "set_column_order"):
            order = [0] * len(index)
            for out_col, in_col in enumerate(index):
                order[in_col] = out_col
            self._shardings[0].set_column_order(order)  # type: ignore[attr-defined]
            return None
        return torch.tensor(index, device=self._device)

    def _index_local_params(self) -> dict[str, list[tuple[str, ShardMetadata, nn.Parameter]]]:
        """``{table: [(state-dict key of the kernel parameter, shard metadata, parameter)]}``."""
        out: dict[str, list[tuple[str, ShardMetadata, nn.Parameter]]] = {t: [] for t in self._tables}
        for i, lookup in enumerate(self._grouped_lookups()):
            for j, (kernel, shards) in enumerate(lookup.kernel_tables()):
                for name, (table, shard), param in zip(kernel.table_names, shards, kernel.weights.values()):
                    key = f"_lookups.{i}._emb_modules.{j}.weights.{name}"
                    out[table].append((key, self._tables[table].shards[shard], param))
        return out

    def _grouped_lookups(self) -> list[_GroupedLookupBase]:
        return list(self._lookups)  # type: ignore[arg-type]

    def _build_fused_optimizer(self) -> CombinedOptimizer:
        optims: list[tuple[str, KeyedOptimizer]] = []
        for sharding, lookup in zip(self._shardings, self._grouped_lookups()):
            if isinstance(sharding, DpEmbeddingSharding):
                assert sharding.sync is not None  # created with the lookup
                optims += [("", o) for o in sharding.sync.optimizers]
                continue
            for kernel, _ in lookup.kernel_tables():
                if kernel._fused_optimizer is not None:
                    optims.append(("", kernel._fused_optimizer))
        return CombinedOptimizer(optims)

    # ---- public surface (torchrec names) ------------------------------------------------------
    @property
    def fused_optimizer(self) -> CombinedOptimizer:
        """The in-backward optimizers of every kernel (and of data-parallel tables), by name."""
        return self._fused_optimizer

    @property
    def input_dist(self) -> nn.ModuleList:
        """One input dist per sharding type (alias of ``_input_dists``)."""
        return self._input_dists

    @property
    def lookups(self) -> nn.ModuleList:
        """One grouped lookup per sharding type (alias of ``_lookups``)."""
        return self._lookups

    @property
    def output_dist(self) -> nn.ModuleList:
        """One output dist per sharding type (alias of ``_output_dists``)."""
        return self._output_dists

    @property
    def shardings(self) -> list[EmbeddingSharding]:
        return list(self._shardings)

    @property
    def device(self) -> torch.device:
        """Where this rank's shards live (fixed: sharded storage is never moved, see ``placement.py``)."""
        return self._device

    @property
    def sharding_env(self) -> ShardingEnv:
        return self._env

    def module_sharding_plan(self) -> EmbeddingModuleShardingPlan:
        """``{table: ParameterSharding}`` this collection was sharded by (its entry of the plan)."""
        return EmbeddingModuleShardingPlan({c.name: self._tables[c.name].sharding for c in self._configs})

    def feature_names(self) -> list[str]:
        return list(self._feature_order)

    def sharded_parameter_names(self) -> list[str]:
        """Names (relative to this module) of every kernel parameter: DDP must ignore them."""
        return [n for n, _ in self.named_parameters()]

    # ---- forward plumbing ---------------------------------------------------------------------
    def _start(self, features: Any) -> Any:
        """Start the lookup of ``features``; returns the awaitable ``forward`` returns."""
        raise TypeError(f"{type(self).__name__} must implement _start")  # every subclass does

    def forward(self, features: Any) -> Any:
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched[0] is features:
            return prefetched[1]
        return self._start(features)

    def prefetch(self, features: Any) -> bool:
        """Start the forward of ``features`` now; the next ``forward(features)`` (same object)
        returns it. ``DistributedModelParallel`` calls this before running the model, so the
        embedding all-to-alls travel while the dense layers compute (and, in backward, the
        gradient all-to-all is started before the dense layers' backward). Returns False (and
        does nothing) when ``features`` does not have exactly this module's keys."""
        ok = self._has_all_keys(features)
        if ok:
            self._prefetched = (features, self._start(features))
        return ok

    def _has_all_keys(self, features: Any) -> bool:
        keys = tuple(features.keys())
        ok = self._prefetchable.get(keys)
        if ok is None:
            ok = self._prefetchable[keys] = len(keys) == len(self._feature_order) and set(keys) == set(
                self._feature_order
            )
        return ok

    # ---- pipelining: input dists started ahead of their forward --------------------------------
    def start_input_dist(self, features: Any, stream: Any = None) -> bool:
        """Start the input dist of a *later* forward of ``features`` (stage 1: the splits exchange).

        Collective: every rank must call it at the same point. The forward of ``features`` (the same
        KJT, or a KJT around the same tensors such as ``features.to(its device)``) then waits for it
        instead of starting its own; until then other forwards run normally, so a validation loop may
        come in between. Returns False (and does nothing) when ``features`` does not have exactly
        this module's keys; True if it was started (or already was).

        Args:
            features: the KJT of the later forward (its tensors must be ready on ``stream``).
            stream: a side ``torch.cuda.Stream`` to issue every stage of this input dist on (the
                forward then makes its own stream wait for it and ``record_stream``s what it
                receives); None: the current stream.
        """
        if not self._has_all_keys(features):
            return False
        if self._find_pending(features) is not None:
            return True
        positions = self._positions(features.keys())
        with on_stream(stream):
            bounded = self._id_bounds(features)  # the unsharded module's bounds_check policy
            contexts = [d(bounded, positions) for d in self._input_dists]
        self._pending_input_dists.append(
            _PendingInputDist(features, positions, contexts, bounded, stream=stream)
        )
        return True

    def progress_input_dists(self) -> None:
        """Stage 2 of every pending input dist: wait for its splits exchange (a host sync) and start
        its lengths/values/weights exchange. Collective; a no-op when nothing is pending."""
        for pending in self._pending_input_dists:
            pending.progress()

    def has_pending_input_dist(self, features: Any | None = None) -> bool:
        """Whether an input dist started by ``start_input_dist`` (for ``features``, or any) waits for its forward."""
        if features is None:
            return bool(self._pending_input_dists)
        return self._find_pending(features) is not None

    def cancel_input_dists(self, wait: bool = True) -> int:
        """Drop every pending input dist and return how many there were.

        With ``wait`` (collective: every rank must call it together) each is completed first, so no
        exchange is left in flight; ``wait=False`` only forgets them (after an error, when the other
        ranks may not take part any more).
        """
        pending, self._pending_input_dists = self._pending_input_dists, []
        if wait:
            for p in pending:
                p.received(self._device)
        return len(pending)

    def _find_pending(self, features: Any) -> _PendingInputDist | None:
        for pending in self._pending_input_dists:
            if same_features(pending.features, features):
                return pending
        return None

    def _take_pending(self, features: Any) -> _PendingInputDist | None:
        pending = self._find_pending(features) if self._pending_input_dists else None
        if pending is not None:
            self._pending_input_dists.remove(pending)
        return pending

    def _positions(self, keys: list[str]) -> list[int] | None:
        if keys == self._feature_order:
            return None
        key = tuple(keys)
        if key not in self._positions_cache:
            index = {k: i for i, k in enumerate(keys)}
            self._positions_cache[key] = [index[f] for f in self._feature_order]
        return self._positions_cache[key]

    def _run(self, features: Any) -> tuple[list[DistContext], list[Any], list[int] | None, Any]:
        """Input dists, lookups and output dists of ``features``.

        Returns:
            ``(contexts, output awaitables, positions, features after the bounds_check rewrite)``.
        """
        pending = self._take_pending(features)
        if pending is not None:  # started ahead by start_input_dist (pipelined training)
            contexts, positions, tensors = pending.contexts, pending.positions, pending.progress()
            bounded = pending.bounded
            if pending.stream is not None:  # issued on a side stream: wait there, hand over to this one
                pending.received(self._device)
        else:
            check_feature_keys(features.keys(), self._feature_order, type(self).__name__)
            positions = self._positions(features.keys())
            bounded = self._id_bounds(features)  # the unsharded module's bounds_check policy
            contexts = [d(bounded, positions) for d in self._input_dists]  # every splits exchange in flight
            tensors = [c.splits.wait() for c in contexts]  # every lengths/values exchange in flight
        results = []
        for ctx, t, lookup, output_dist in zip(contexts, tensors, self._lookups, self._output_dists):
            results.append(output_dist(lookup(t.wait()), t, ctx))
        return contexts, results, positions, bounded

    def __repr__(self) -> str:
        """The seed tutorial's tree: lookups, input dists, output dists, then the table holders."""
        lines = [f"{type(self).__name__}("]
        for key, modules in (("lookups", self._lookups), ("_input_dists", self._input_dists),
                             ("_output_dists", self._output_dists)):  # fmt: skip
            if len(modules):
                lines.append(f"  ({key}):")
                lines += ["    " + line for m in modules for line in repr(m).splitlines()]
        holders = repr(getattr(self, self._attr)).splitlines()
        lines.append(f"  ({self._attr}): {holders[0]}")
        lines += ["  " + line for line in holders[1:]]
        lines.append(")")
        return "\n".join(lines)

    def extra_repr(self) -> str:
        kinds = ", ".join(f"{s.name}: {sorted(s.tables)}" for s in self._shardings)
        return f"rank={self._env.rank}/{self._env.world_size}, {kinds}"


def _state_dict_hook(
    module: ShardedCollectionBase, state_dict: dict, prefix: str, local_metadata: Any
) -> None:
    for key in [k for k in state_dict if k.startswith(prefix + "_lookups.")]:
        del state_dict[key]
    for c in module._configs:
        table = module._tables[c.name]
        key = f"{prefix}{module._attr}.{c.name}.weight"
        local = module._local_params[c.name]
        if table.sharding.sharding_type == ShardingType.DATA_PARALLEL.value:
            state_dict[key] = local[0][2].detach()
        else:
            state_dict[key] = ShardedTableState(
                [c.num_embeddings, c.embedding_dim],
                [(meta, p.detach()) for _, meta, p in local],
                local[0][2].dtype if local else torch.float32,
            )


def _load_pre_hook(module: ShardedCollectionBase, state_dict: dict, prefix: str, *args: Any) -> None:
    """Turn ``<attr>.<table>.weight`` (full tensor or sharded state) into the kernel parameters."""
    for c in module._configs:
        key = f"{prefix}{module._attr}.{c.name}.weight"
        if key not in state_dict:
            continue  # reported as missing under the kernel parameter's key
        value = state_dict.pop(key)
        if isinstance(value, ShardedTableState) and value.global_shape != [c.num_embeddings, c.embedding_dim]:
            raise ValueError(f"state_dict[{key!r}] is a [{value.global_shape}] table, expected "
                             f"[{c.num_embeddings}, {c.embedding_dim}]")  # fmt: skip
        if isinstance(value, torch.Tensor) and tuple(value.shape) != (c.num_embeddings, c.embedding_dim):
            raise ValueError(
                f"state_dict[{key!r}] has shape {tuple(value.shape)}, expected ({c.num_embeddings}, {c.embedding_dim})"
            )
        for param_key, meta, _ in module._local_params[c.name]:
            state_dict[prefix + param_key] = local_slice(value, meta, key)


class CollectionSharder(ModuleSharder):
    """Builds a sharded collection (``_sharded_class``) from an unsharded one (``_module_class``).

    Args:
        fused_params: the fused optimizer of tables not marked by ``apply_optimizer_in_backward``
            (torchrec-style dict, e.g. ``{"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            "learning_rate": 0.02, "eps": 0.002}``, or a ``FusedOptimizerSpec``); default SGD with
            learning rate 0.01, like torchrec.
        kernel_backend: lookup kernels of every shard: ``"auto"``, ``"fbgemm"``, ``"triton"`` or ``"torch"``.
    """

    _module_class: type[nn.Module]
    _sharded_class: type[ShardedCollectionBase]

    def __init__(
        self, fused_params: Mapping[str, Any] | FusedOptimizerSpec | None = None, kernel_backend: str = "auto"
    ) -> None:
        super().__init__(normalized_fused_params(fused_params))
        check_kernel_backend(kernel_backend)
        self.kernel_backend = kernel_backend

    @property
    def module_type(self) -> type[nn.Module]:
        return self._module_class

    def shard(
        self,
        module: nn.Module,
        params: EmbeddingModuleShardingPlan | Mapping[str, Any],
        env: ShardingEnv | dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        module_fqn: str | None = None,
        seed: int = 0,
    ) -> ShardedCollectionBase:
        """Shard ``module`` by ``params`` (its entry of the plan) over ``env`` (collective).

        Args:
            module: the collection (on ``meta`` or materialised; materialised weights are kept).
            params: ``plan.plan["<module path>"]``.
            env: ``ShardingEnv`` (or a process group; default: the world).
            device: where the local shards live (default CPU).
            module_fqn: the module's path (for messages only).
            seed: base seed of shard initialisation of ``meta`` tables.
        """
        if not isinstance(module, self._module_class):
            raise TypeError(
                f"{type(self).__name__} shards {self._module_class.__name__}, got {type(module).__name__}"
                + (f" at {module_fqn!r}" if module_fqn else "")
            )
        device = torch.device(device) if device is not None else torch.device("cpu")
        return self._sharded_class(
            module, params, as_env(env), device, self.fused_params or None, seed, self.kernel_backend
        )
