"""``ShardedCollectionBase``: what ``ShardedEmbeddingBagCollection`` and ``ShardedEmbeddingCollection`` share.

A sharded collection groups its tables by sharding type (in order of first appearance in the
table list, the same on every rank) and chains, per type, the three parts built by the sharding
classes::

    _input_dists[i](kjt)   -> DistContext (the KJT all-to-all is in flight)
    _lookups[i](kjt_local) -> this rank's embeddings (one kernel call per optimizer group)
    _output_dists[i](...)  -> awaitable of this rank's samples' embeddings

Its forward is three explicit stages, which a pipeline may run before the forward that needs them
(``lightrec.distributed.train_pipeline.sparse_dist_pipeline.SparseDistPipeline``)::

    input_dist(kjt, stream)          -> StartedInputDist  every sharding's splits exchange in flight
                                                          (.progress(): lengths/values in flight)
    lookup(started)                  -> this rank's embeddings, one tensor per sharding type
    output_dist(embeddings, started) -> the forward's awaitable
    compute_and_output_dist(started) =  the two above, each output dist started as soon as its
                                        lookup is done (what the forward runs); a pooled exchange
                                        through shared memory is started before its lookup, which
                                        writes its rows where they go (``PooledOutputDist.prepare``)
    prefetch(started)                   the kernels' prefetch hooks with the received ids

All input dists are started before any is waited, so their all-to-alls overlap. Work started
before its forward -- a later batch's input dist, a launched forward -- waits in
:attr:`~ShardedCollectionBase.ahead` (``work_ahead.py``) and is taken by the forward whose KJT holds
the very same tensors. The input dist reads only the ids, never the tables, so starting it early
does not change any result.

Siblings of this file: ``collection_sharder.py`` (``CollectionSharder``, which builds a sharded
collection) and ``state_dict.py`` (the state dict under the unsharded module's keys:
``<attr>.<table>.weight``, a ``ShardedTableState`` for a model-parallel table, a tensor for a
data-parallel one).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar, cast

import torch
from torch import nn

from lightrec.distributed.comm.awaitable import Awaitable
from lightrec.distributed.comm.qcomm import QuantizedCommCodecs
from lightrec.distributed.comm.sharding_env import ShardingEnv
from lightrec.distributed.comm.streams import on_stream
from lightrec.distributed.planner.plan import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    ParameterSharding,
    ShardingType,
    ShardMetadata,
    placement_for,
)
from lightrec.distributed.planner.plan.sharder import FusedParamsLike, PooledTables, SequenceTables
from lightrec.distributed.sharding import SHARDING_CLASSES
from lightrec.distributed.sharding.common import (
    DistContext,
    KJTEmbeddingSharding,
    KJTInputDist,
    KJTOutputDist,
    PooledOutputDist,
    ShardedTable,
    ShardingContext,
)
from lightrec.distributed.sharding.data_parallel import DpEmbeddingSharding
from lightrec.distributed.sharding.id_bounds import IdBounds
from lightrec.distributed.sharding.kernel_agreement import KernelAgreement
from lightrec.distributed.sharding.lookups import GroupedLookup, GroupedPooledEmbeddingsLookup
from lightrec.distributed.sharding.state_dict import (
    load_state_dict_post_hook,
    load_state_dict_pre_hook,
    state_dict_hook,
)
from lightrec.distributed.sharding.tiering import tiering_for, tiering_params
from lightrec.distributed.sharding.work_ahead import AheadQueue, StartedInputDist
from lightrec.kernels.kernel_registry import check_kernel_backend
from lightrec.modules.embedding_configs import BaseEmbeddingConfig, EmbeddingBagConfig, PoolingType
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.modules.feature_checks import check_collection_input, features_of_several_tables
from lightrec.optim.fused_spec import FusedOptimizerSpec
from lightrec.optim.in_backward import fused_spec_from_parameter
from lightrec.optim.keyed import CombinedOptimizer, KeyedOptimizer
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["ShardedCollectionBase"]

#: What a sharded collection's forward returns: an awaitable of its output (``EmbeddingBagCollectionAwaitable``,
#: ``EmbeddingCollectionAwaitable``), or torchrec's pair for managed-collision collections.
Out = TypeVar("Out", covariant=True)


class ShardedCollectionBase(nn.Module, abc.ABC, Generic[Out]):
    """Common construction, forward plumbing, optimizer and state dict of sharded collections.

    Generic in ``Out``, what its forward returns (see the module docstring for the stages: every
    sharding type's ``InputDist`` -> ``GroupedLookup`` -> ``OutputDist``, then :meth:`_assemble`).

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
        qcomm_codecs_registry: quantized communication of the output dists, by comm op
            (``lightrec.distributed.fbgemm_qcomm_codec.get_qcomm_codecs_registry``).

    Every sharded collection takes exactly these arguments; one that shards a wrapper of a
    collection (feature-processed, managed-collision) does not restate them but overrides
    :meth:`_adopt` (return the wrapper's inner collection) and :meth:`_adopted`, and names the
    wrapper's class in ``_adopts`` (the constructor refuses any other module).
    """

    _attr = "embedding_bags"
    _pooled = True
    # The wrapper class a subclass shards (checked before _adopt runs); None: any collection.
    _adopts: type[nn.Module] | None = None
    # Prefix of the table keys in the state dict (a collection nested in a wrapper module keeps the
    # unsharded wrapper's keys, e.g. "_embedding_module." for managed-collision collections).
    _state_prefix = ""

    def __init__(
        self,
        module: nn.Module,
        table_plan: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device,
        fused_params: FusedParamsLike = None,
        seed: int = 0,
        kernel_backend: str = "auto",
        qcomm_codecs_registry: Mapping[str, QuantizedCommCodecs] | None = None,
    ) -> None:
        super().__init__()
        check_kernel_backend(kernel_backend)
        wrapper = module
        if self._adopts is not None and not isinstance(module, self._adopts):
            raise TypeError(f"{type(self).__name__} shards a {self._adopts.__name__}, got {type(module).__name__}")
        module, table_plan = self._adopt(module, table_plan, env, device)
        configs = self._configs_of(module)
        shared = features_of_several_tables([list(c.feature_names) for c in configs])
        if shared:
            raise ValueError(
                f"{type(self).__name__}: features {shared} are read by several tables; a sharded collection "
                "routes each feature to one table's shards. Give each table its own feature name "
                "(copy the KJT key) or keep this collection unsharded"
            )
        self._configs = list(configs)
        self._env = env
        self._device = device
        self._is_weighted = module.is_weighted() if isinstance(module, PooledTables) else False
        # The unsharded module's bounds_check policy (a fused collection has none: ids are checked).
        bounds_check = module._bounds_check if isinstance(module, (EmbeddingBagCollection, EmbeddingCollection)) else "error"
        self._id_bounds = IdBounds(bounds_check, {f: c.num_embeddings for c in configs for f in c.feature_names})
        self._check_plan(configs, table_plan)
        self._feature_order = [f for c in configs for f in c.feature_names]
        dims = {f: c.embedding_dim for c in configs for f in c.feature_names}
        self._length_per_key = [dims[f] for f in self._feature_order]  # pooled output widths
        default_spec = FusedOptimizerSpec.coerce(fused_params) or FusedOptimizerSpec()
        tiering_defaults = tiering_params(fused_params if isinstance(fused_params, Mapping) else None)
        by_type: dict[str, list[ShardedTable]] = {}
        for c in configs:
            ps = table_plan[c.name]
            weight = module.get_parameter(f"{self._attr}.{c.name}.weight")
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
            pooling = c.pooling if self._pooled and isinstance(c, EmbeddingBagConfig) else PoolingType.NONE
            tiering = tiering_for(ps, c, tiering_defaults, env)
            by_type.setdefault(ps.sharding_type, []).append(
                ShardedTable(c, ps, shards, spec, source, pooling, kernel_backend, tiering)
            )
        context = ShardingContext(
            self._feature_order, env, device, self._pooled, self._is_weighted, seed, qcomm_codecs_registry
        )
        self._shardings: list[KJTEmbeddingSharding] = [
            self._make_sharding(st, tables, context) for st, tables in by_type.items()
        ]
        self._column_index = self._output_column_index() if self._pooled else None
        self._input_dists = nn.ModuleList(s.create_input_dist() for s in self._shardings)
        self._lookups = nn.ModuleList(s.create_lookup() for s in self._shardings)
        self._output_dists = nn.ModuleList(s.create_output_dist() for s in self._shardings)
        self._kernel_agreement = KernelAgreement(env, device)  # the ranks' fused CPU kernel trials: one verdict
        self._tables = {t.name: t for tables in by_type.values() for t in tables}
        for t in self._tables.values():
            t.source = None  # never keep a reference to the unsharded weight
        setattr(self, self._attr, nn.ModuleDict({c.name: nn.Module() for c in configs}))
        self._local_params = self._index_local_params()
        self._fused_optimizer = self._build_fused_optimizer()
        self._positions_cache: dict[tuple[str, ...], list[int]] = {}
        self._accepted: dict[tuple[str, ...], bool] = {}
        self.ahead = AheadQueue()  # work started for later forwards (sparse_dist_pipeline drives it)
        self._missing_table_keys: dict[str, str] = {}  # the load hooks' (state_dict.py)
        self._register_state_dict_hook(state_dict_hook)
        self._register_load_state_dict_pre_hook(load_state_dict_pre_hook, with_module=True)
        self.register_load_state_dict_post_hook(load_state_dict_post_hook)
        self._adopted(wrapper, device)

    # ---- construction helpers ---------------------------------------------------------------
    def _adopt(
        self, module: nn.Module, table_plan: Mapping[str, ParameterSharding], env: ShardingEnv, device: torch.device
    ) -> tuple[nn.Module, Mapping[str, ParameterSharding]]:
        """The collection whose tables to shard and the plan to shard them by, from the module the
        constructor was given (an instance of ``_adopts``): itself here; a wrapper (feature-processed,
        managed-collision) keeps what it needs and returns its inner collection. Runs before any
        table is sharded."""
        return module, table_plan

    def _adopted(self, module: nn.Module, device: torch.device) -> None:
        """What a wrapper keeps of ``module`` (the constructor's argument) besides the sharded
        tables; runs last, so the wrapper's submodules come after the tables' in the module tree."""

    def _make_sharding(
        self, sharding_type: str, tables: list[ShardedTable], context: ShardingContext
    ) -> KJTEmbeddingSharding:
        """The sharding of one type (subclasses with their own sharding classes override this)."""
        return SHARDING_CLASSES[sharding_type](tables, context)

    def row_state_tables(self) -> list[tuple[str, list[int], list[tuple[ShardMetadata, torch.Tensor]]]]:
        """Per-row state besides the tables (``(state-dict key, global [rows, cols], this rank's
        blocks)``) that checkpoints save and reshard like a table; none here (managed-collision
        collections have their id maps)."""
        return []

    def _configs_of(self, module: nn.Module) -> list[BaseEmbeddingConfig]:
        if self._pooled and isinstance(module, PooledTables):
            return list(module.embedding_bag_configs())
        if not self._pooled and isinstance(module, SequenceTables):
            return list(module.embedding_configs())
        getter = "embedding_bag_configs" if self._pooled else "embedding_configs"
        raise TypeError(f"{type(self).__name__} shards modules with a {getter}() method, got {type(module).__name__}")

    def _check_plan(self, configs: list[BaseEmbeddingConfig], plan: Mapping[str, ParameterSharding]) -> None:
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
            self._shardings[0].set_column_order(order)
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

    # The stage modules, typed: the ModuleLists hold what the shardings' create_* built (one per
    # sharding type, in order); a wrapper may replace an output dist by another OutputDist.
    def _grouped_lookups(self) -> Sequence[GroupedLookup]:
        return cast("Sequence[GroupedLookup]", self._lookups)

    def _input_dist_modules(self) -> Sequence[KJTInputDist]:
        return cast("Sequence[KJTInputDist]", self._input_dists)

    def _output_dist_modules(self) -> Sequence[KJTOutputDist]:
        return cast("Sequence[KJTOutputDist]", self._output_dists)

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
    def lookups(self) -> nn.ModuleList:
        """One grouped lookup per sharding type (alias of ``_lookups``)."""
        return self._lookups

    @property
    def shardings(self) -> list[KJTEmbeddingSharding]:
        return list(self._shardings)

    @property
    def device(self) -> torch.device:
        """Where this rank's shards live (fixed: sharded storage is never moved, see ``dmp/placement.py``)."""
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

    # ---- the forward, in stages (see the module docstring) ------------------------------------
    def accepts(self, features: KeyedJaggedTensor) -> bool:
        """Whether ``features`` has exactly this collection's keys (in any order): what a pipeline
        may start this collection's stages for."""
        keys = tuple(features.keys())
        ok = self._accepted.get(keys)
        if ok is None:
            ok = self._accepted[keys] = len(keys) == len(self._feature_order) and set(keys) == set(
                self._feature_order
            )
        return ok

    def _prepare(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """What the input dist sends for ``features`` (a subclass may expand or refuse a layout)."""
        return features

    def input_dist(self, features: KeyedJaggedTensor, stream: torch.cuda.Stream | None = None) -> StartedInputDist:
        """Stage 1 of the forward of ``features``: checks the input (on the rank that got it, before any
        collective, never in a peer's kernel after the all-to-all), applies ``bounds_check`` and
        starts every sharding's splits exchange (collective).

        Args:
            features: this rank's KJT, every feature of the collection in any key order.
            stream: a side ``torch.cuda.Stream`` to issue both stages of the input dist on (the
                lookup then makes its own stream wait for it); None: the current stream.
        """
        features = self._prepare(features)
        check_collection_input(features, self._feature_order, type(self).__name__, weighted=self._is_weighted)
        positions = self._positions(features.keys())
        with on_stream(stream):
            bounded = self._id_bounds(features)  # the unsharded module's bounds_check policy
            contexts = [d(bounded, positions) for d in self._input_dist_modules()]
        return StartedInputDist(features, positions, contexts, bounded, stream=stream)

    def _received(self, started: StartedInputDist) -> list[Awaitable[KeyedJaggedTensor]]:
        """Stage 2 of ``started`` (if not run yet); from a side stream, waited and handed over here."""
        tensors = started.progress()
        if started.stream is not None:
            started.received(self._device)
        return tensors

    def lookup(self, started: StartedInputDist) -> list[torch.Tensor]:
        """This rank's lookups of what ``started`` received (waits for its exchanges): one tensor per
        sharding type (pooled ``[sum B, width]``, sequence one row per received id)."""
        tensors = self._received(started)
        lookups = self._grouped_lookups()
        embeddings = [lookup(self._lookup_input(i, t.wait())) for i, (lookup, t) in enumerate(zip(lookups, tensors))]
        self._kernel_agreement.after_lookups(self)
        return embeddings

    def output_dist(self, embeddings: list[torch.Tensor], started: StartedInputDist) -> Out:
        """Send ``embeddings`` (from :meth:`lookup`) back to the ranks owning the samples; returns
        the awaitable the forward returns."""
        tensors = self._received(started)
        results = [
            output_dist(e, t, ctx)
            for output_dist, e, t, ctx in zip(self._output_dist_modules(), embeddings, tensors, started.contexts)
        ]
        return self._assemble(started, results)

    def compute_and_output_dist(self, started: StartedInputDist) -> Out:
        """:meth:`lookup` and :meth:`output_dist` sharding by sharding: each output dist starts as soon
        as its lookup is done, overlapping the next lookup. What the forward runs."""
        tensors = self._received(started)
        results: list[Awaitable[torch.Tensor]] = []
        for i, (ctx, t, lookup, output_dist) in enumerate(
            zip(started.contexts, tensors, self._grouped_lookups(), self._output_dist_modules())
        ):
            results.append(self._lookup_and_send(self._lookup_input(i, t.wait()), t, ctx, lookup, output_dist))
        self._kernel_agreement.after_lookups(self)
        return self._assemble(started, results)

    @staticmethod
    def _lookup_and_send(
        kjt: KeyedJaggedTensor,
        received: Awaitable[KeyedJaggedTensor],
        ctx: DistContext,
        lookup: GroupedLookup,
        output_dist: KJTOutputDist,
    ) -> Awaitable[torch.Tensor]:
        """One sharding's lookup of ``kjt`` and its output dist. A pooled exchange through shared memory
        is started first, so that the lookup writes its rows straight into the exchange and the output
        (``PooledOutputDist.prepare``). Ranks may take different paths (a rank without columns has
        nothing to place): a prepared exchange moves the same bytes as a plain one."""
        if isinstance(lookup, GroupedPooledEmbeddingsLookup) and isinstance(output_dist, PooledOutputDist):
            like = lookup.placeable()
            placed = output_dist.prepare(received, *like) if like is not None else None
            if placed is not None:
                try:
                    embeddings = lookup(kjt, placed.out_rows)
                except BaseException:
                    placed.cancel()  # a caller that goes on after the error finds the exchanges in step
                    raise
                return output_dist.send_placed(embeddings, received, placed)
        return output_dist(lookup(kjt), received, ctx)

    @property
    def prefetches(self) -> bool:
        """Whether a kernel of this collection takes later batches' ids ahead (tiered tables)."""
        return any(lookup.prefetches for lookup in self._grouped_lookups())

    def prefetch(self, started: StartedInputDist) -> None:
        """Hand the ids ``started`` brings to the prefetch hooks of the kernels that have one (tables
        behind a cache fetch the rows they will miss); a no-op -- no wait either -- when none has."""
        lookups = self._grouped_lookups()
        if any(lookup.prefetches for lookup in lookups):
            for lookup, kjt in zip(lookups, started.received(self._device)):
                lookup.prefetch(kjt)

    def replicated_state(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """What every rank keeps whole inside this collection and the dense optimizer trains (none of its
        tables), detached, by the unsharded module's state-dict keys under ``prefix``: nothing here; a
        feature-processed collection's position weights. Publishing dense weights reads it."""
        return {}

    @abc.abstractmethod
    def _assemble(self, started: StartedInputDist, results: list[Awaitable[torch.Tensor]]) -> Out:
        """The forward's awaitable from the output dists' awaitables (one per sharding type)."""

    def forward(self, features: KeyedJaggedTensor) -> Out:
        """Every stage for ``features`` -- or the rest of what a pipeline started for its tensors."""
        work = self.ahead.take(features)
        if work is not None and work.output is not None:
            # launched by DistributedModelParallel's look-ahead: this collection's compute_and_output_dist
            return cast(Out, work.output)
        started = work.started if work is not None and work.started is not None else self.input_dist(features)
        return self.compute_and_output_dist(started)

    def _positions(self, keys: list[str]) -> list[int] | None:
        if keys == self._feature_order:
            return None
        key = tuple(keys)
        if key not in self._positions_cache:
            index = {k: i for i, k in enumerate(keys)}
            self._positions_cache[key] = [index[f] for f in self._feature_order]
        return self._positions_cache[key]

    def _lookup_input(self, sharding: int, received: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The KJT sharding ``sharding`` looks up, from the one its input dist received (a hook:
        the feature-processed collection turns received positions into learned weights here)."""
        return received

    def __repr__(self) -> str:
        """The seed tutorial's tree: lookups, input dists, output dists, then the table holders."""
        lines = [f"{type(self).__name__}("]
        for key, modules in (("lookups", self._lookups), ("_input_dists", self._input_dists),
                             ("_output_dists", self._output_dists)):  # fmt: skip
            if len(modules):
                lines.append(f"  ({key}):")
                lines += ["    " + line for m in modules for line in repr(m).splitlines()]
        holders = repr(self.get_submodule(self._attr)).splitlines()
        lines.append(f"  ({self._attr}): {holders[0]}")
        lines += ["  " + line for line in holders[1:]]
        lines.append(")")
        return "\n".join(lines)

    def extra_repr(self) -> str:
        kinds = ", ".join(f"{s.name}: {sorted(s.tables)}" for s in self._shardings)
        return f"rank={self._env.rank}/{self._env.world_size}, {kinds}"
