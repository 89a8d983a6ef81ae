"""Batched lookup modules: a group of tables served by one kernel call per forward (fbgemm TBE,
Triton or pure torch: an ``EmbeddingKernel``, chosen by ``kernel_backend``, see
:mod:`lightrec.kernels.kernel_registry`).

Input layout (fbgemm TBE's flattened layout; ``T`` features, batch ``B``)::

    offsets  [T*B + 1]   bags ordered feature-major: feature 0's B bags, then feature 1's, ...
    indices  [N]         ids of bag k are indices[offsets[k]:offsets[k+1]] (local to the table)
    per_sample_weights [N] | None

    example T=2 (f0 -> table A, f1 -> table B), B=2:
        bag:      (f0,s0) (f0,s1) (f1,s0) (f1,s1)
        offsets:  0       2       3       3       5
        indices:  [a a    a       |       b b]

``feature_table_map[f]`` names the table of feature ``f``; several features may share a table.

Outputs: :class:`BatchedEmbeddingBag` returns ``[B, sum_f D_f]`` (feature ``f`` occupies its own
column block, in feature order); :class:`BatchedEmbedding` returns ``[N, D]`` (one row per id).

Each module owns per-table ``nn.Parameter`` views (``weights.<table>``) of a storage the backend
owns. With ``optimizer=None`` those parameters receive ordinary dense gradients; with a fused
optimizer they do not require grad, the update happens inside backward, and ``fused_optimizer``
(a :class:`EmbeddingFusedOptimizer`) exposes and checkpoints the optimizer state.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import torch
from torch import nn

from lightrec.kernels.empty_lookup import EmptyLookup
from lightrec.kernels.input_checks import ID_CHECK_MODES, LookupInputChecker
from lightrec.kernels.kernel_interface import EmbeddingKernel, KernelConfig, LookupBatch, OutRows
from lightrec.kernels.kernel_registry import build_kernel
from lightrec.kernels.tiered.config import TieringConfig
from lightrec.kernels.tiered.transfer import TransferFailedError
from lightrec.kernels.tiered.weight_rows import rows_through_cache
from lightrec.kernels.weight_grad import with_weight_grad
from lightrec.modules.embedding_configs import BaseEmbeddingConfig, PoolingType
from lightrec.modules.kernel_backend import resolve_kernel_backend
from lightrec.modules.managed_collision.ops import uniform_block
from lightrec.optim.fused_spec import FusedOptimizerSpec
from lightrec.optim.keyed import KeyedOptimizer

__all__ = [
    "BatchedEmbedding",
    "BatchedEmbeddingBag",
    "EmbeddingFusedOptimizer",
    "BatchedTableSpec",
    "TableSpec",
    "flush_kernels",
]


#: What the batched modules accept as a table: a config (``EmbeddingBagConfig`` / ``EmbeddingConfig``:
#: rows, dim, name, init), a :class:`BatchedTableSpec` or a ``(rows, dim)`` tuple.
TableLike = Union["BatchedTableSpec", BaseEmbeddingConfig, tuple[int, int]]


@dataclass
class BatchedTableSpec:
    """Shape of one table (or one shard of a table) served by a batched training module."""

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    init_fn: Callable[[torch.Tensor], object] | None = None


TableSpec = BatchedTableSpec
"""The name ``BatchedTableSpec`` had before 0.1 (``lightrec.kernels.TableSpec``)."""


class EmbeddingFusedOptimizer(KeyedOptimizer):
    """The optimizer a batched module applies in backward, as a checkpointable ``KeyedOptimizer``.

    ``state[param]`` holds the live optimizer state of that table (views of the kernel's storage,
    e.g. ``{"momentum1": [rows]}`` for row-wise Adagrad). ``step()`` does nothing: rows were
    already updated in backward. ``param_groups[0]["lr"]`` is read at every forward, so LR
    schedulers driving this optimizer (or a ``CombinedOptimizer`` holding it) take effect at once.
    """

    def __init__(
        self,
        spec: FusedOptimizerSpec,
        params: Mapping[str, nn.Parameter],
        states: Sequence[dict[str, torch.Tensor]],
        kernel: EmbeddingKernel | None = None,
    ) -> None:
        self.spec = spec
        self._kernel = kernel
        state = {p: dict(s) for p, s in zip(params.values(), states, strict=True)}
        super().__init__(params, state, [{"params": list(params.values()), "lr": spec.learning_rate}])

    def state_dict(self) -> dict[str, Any]:
        """The state (and param groups) by parameter name; a tiered kernel's cache is flushed first,
        so the state tensors (its backing store) hold every row's current value."""
        if self._kernel is not None:
            self._kernel.flush()
        return super().state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load by parameter name (in place); a tiered kernel writes its cache back first and drops
        it after, so lookups read the loaded rows."""
        if self._kernel is not None:
            _flush_for_load(self._kernel)
        super().load_state_dict(state_dict)
        if self._kernel is not None:
            self._kernel.invalidate()

    def _refresh(self, states: Sequence[dict[str, torch.Tensor]]) -> None:
        for p, s in zip(self.params.values(), states, strict=True):
            self.state[p] = dict(s)


def _table_specs(tables: Sequence[TableLike]) -> list[BatchedTableSpec]:
    out = []
    for i, t in enumerate(tables):
        if isinstance(t, BatchedTableSpec):
            spec = t
        elif isinstance(t, tuple) and len(t) == 2:
            spec = BatchedTableSpec(int(t[0]), int(t[1]))
        elif hasattr(t, "num_embeddings") and hasattr(t, "embedding_dim"):
            init = getattr(t, "init_weight", None)
            spec = BatchedTableSpec(t.num_embeddings, t.embedding_dim, getattr(t, "name", ""), init)
        else:
            raise TypeError(
                f"tables[{i}] must be an EmbeddingBagConfig/EmbeddingConfig, a BatchedTableSpec or a (rows, dim) "
                f"tuple, got {type(t).__name__}"
            )
        if spec.num_embeddings <= 0 or spec.embedding_dim <= 0:
            raise ValueError(
                f"tables[{i}] needs positive rows and dim, got {spec.num_embeddings}x{spec.embedding_dim}"
            )
        out.append(spec)
    return out


class _BatchedLookupBase(nn.Module):
    """Shared construction, validation, parameter views and fused-optimizer plumbing."""

    def __init__(
        self,
        tables: Sequence[TableLike],
        feature_table_map: Sequence[int] | None,
        pooling: PoolingType,
        optimizer: FusedOptimizerSpec | Mapping[str, object] | None,
        kernel_backend: str,
        device: torch.device | str | None,
        optimizer_param_names: Sequence[str] | None,
        id_check: str = "auto",
        tiering: TieringConfig | None = None,
    ) -> None:
        super().__init__()
        specs = _table_specs(tables)
        if not specs:
            raise ValueError("a batched embedding module needs at least one table")
        self.table_names = [s.name or f"t{i}" for i, s in enumerate(specs)]
        if len(set(self.table_names)) != len(self.table_names) or any("." in n for n in self.table_names):
            raise ValueError(f"table names must be unique and contain no '.', got {self.table_names}")
        self.rows = [s.num_embeddings for s in specs]
        self.dims = [s.embedding_dim for s in specs]
        ftm = list(range(len(specs))) if feature_table_map is None else [int(t) for t in feature_table_map]
        bad = [t for t in ftm if not 0 <= t < len(specs)]
        if bad or not ftm:
            raise ValueError(
                f"feature_table_map={ftm} must name tables 0..{len(specs) - 1} (at least one feature)"
            )
        unused = sorted(set(range(len(specs))) - set(ftm))
        if unused:
            raise ValueError(
                f"tables {[self.table_names[t] for t in unused]} are read by no feature in feature_table_map"
            )
        self.feature_table_map = ftm
        self.pooling = pooling
        self.optimizer_spec = FusedOptimizerSpec.coerce(optimizer)
        device = torch.device(device) if device is not None else torch.device("cpu")
        config = KernelConfig(
            self.rows, self.dims, ftm, pooling, self.optimizer_spec, device, self.table_names, tiering=tiering
        )
        self.tiering = tiering
        self.backend_name, self._backend = build_kernel(kernel_backend, config)
        self._input_checker = LookupInputChecker(
            self.rows, ftm, self.table_names, _id_check_mode(id_check, self._backend, device)
        )

        fused = self.optimizer_spec is not None
        self.weights = nn.ParameterDict()
        for name, view, spec in zip(self.table_names, self._backend.split_embedding_weights(), specs, strict=True):
            if spec.init_fn is not None:
                spec.init_fn(view)
            else:
                bound = math.sqrt(1.0 / view.shape[0])
                with torch.no_grad():
                    view.uniform_(-bound, bound)
            self.weights[name] = nn.Parameter(view, requires_grad=not fused)
        self._placeholder = torch.zeros(0, device=device, requires_grad=True)  # lets autograd reach backward
        names = (
            list(optimizer_param_names)
            if optimizer_param_names
            else [f"weights.{n}" for n in self.table_names]
        )
        if len(names) != len(self.table_names):
            raise ValueError(f"optimizer_param_names needs {len(self.table_names)} names, got {names}")
        self._fused_optimizer: EmbeddingFusedOptimizer | None = None
        if fused:
            assert self.optimizer_spec is not None
            params = dict(zip(names, self.weights.values(), strict=True))
            self._fused_optimizer = EmbeddingFusedOptimizer(
                self.optimizer_spec, params, self._backend.split_optimizer_states(), self._backend
            )
            for p in self.weights.values():
                p._in_backward_optimizers = [self._fused_optimizer]
        # A kernel that holds rows outside the split views (a cache over host memory or SSD) writes
        # them back before anything reads the views, and forgets them after a load wrote the views.
        self.register_state_dict_pre_hook(_flush_before_state_dict)
        self._register_load_state_dict_pre_hook(_flush_before_load, with_module=True)
        self.register_load_state_dict_post_hook(_invalidate_after_load)

    @property
    def fused_optimizer(self) -> EmbeddingFusedOptimizer:
        if self._fused_optimizer is None:
            raise AttributeError("this module has no fused optimizer (built with optimizer=None)")
        return self._fused_optimizer

    @property
    def num_features(self) -> int:
        return len(self.feature_table_map)

    @property
    def kernel(self) -> EmbeddingKernel:
        """The backend serving the tables (``lightrec.kernels.kernel_interface.EmbeddingKernel``):
        row access (``read_rows`` / ``write_rows`` / ``reset_rows``) and the split views."""
        return self._backend

    @property
    def prefetches(self) -> bool:
        """Whether the kernel wants a later batch's ids ahead (:meth:`prefetch`); in-memory kernels do not."""
        return self._backend.prefetches

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        """The ids a later call will look up (a kernel behind a cache fetches the rows it misses)."""
        self._backend.prefetch(indices, offsets)

    def reset_rows(self, table: str, rows: torch.Tensor, weights: torch.Tensor) -> None:
        """Give ``rows`` (local ids) of ``table`` fresh ``weights`` ``[n, D]`` and a zero fused-optimizer
        state, as a new row has (what a managed-collision eviction does to the rows it frees)."""
        if table not in self.table_names:
            raise KeyError(f"reset_rows: no table {table!r}; the tables are {self.table_names}")
        self._backend.reset_rows(self.table_names.index(table), rows, weights)

    def _check_reset_tables(self, resets: Mapping[str, object]) -> None:
        unknown = sorted(set(resets) - set(self.table_names))
        if unknown:
            raise KeyError(f"reset_rows: no table {unknown[0]!r}; the tables are {self.table_names}")

    def reset_rows_of_tables(self, resets: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """:meth:`reset_rows` of several tables (``{table: (rows, weights)}``) in one kernel call."""
        self._check_reset_tables(resets)
        self._backend.reset_tables([(self.table_names.index(t), rows, w) for t, (rows, w) in resets.items()])

    def reset_rows_uniform_of_tables(self, resets: dict[str, tuple[torch.Tensor, int, float, float]]) -> None:
        """:meth:`reset_rows_of_tables` with the fresh weights drawn by the kernel: ``{table: (rows, seed,
        low, high)}``, row ``rows[k]`` gets row ``k`` of ``managed_collision.ops.uniform_block(len(rows), D, seed, low,
        high, float32)`` (``ResidentRows.reset_tables_uniform``; kernels without it get the block)."""
        self._check_reset_tables(resets)
        draw = getattr(self._backend, "reset_tables_uniform", None)
        if callable(draw):
            draw([(self.table_names.index(t), rows, seed, lo, hi) for t, (rows, seed, lo, hi) in resets.items()])
            return
        dims = dict(zip(self.table_names, self.dims, strict=True))
        self.reset_rows_of_tables({t: (rows, uniform_block(rows.numel(), dims[t], seed, lo, hi, torch.float32))
                                   for t, (rows, seed, lo, hi) in resets.items()})  # fmt: skip

    def split_embedding_weights(self) -> list[nn.Parameter]:
        """Per table ``[rows, D]`` weights (the parameters themselves; they alias the storage, which a
        tiered kernel brings up to date first: ``flush``)."""
        self._backend.flush()
        return list(self.weights.values())

    def flush(self) -> None:
        """Write rows the kernel holds outside its split views (a tiered table's dirty cached rows) back."""
        self._backend.flush()

    def named_split_embedding_weights(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.weights.items())

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> _BatchedLookupBase:
        # The per-table parameters alias one storage; converting them one by one would split it.
        self._backend.apply(fn)
        for p in self.weights.values():
            if p.grad is not None:
                p.grad = fn(p.grad)
        self._placeholder = fn(self._placeholder.detach()).requires_grad_(True)
        self._relink()
        return self

    def _relink(self) -> None:
        """Point each table parameter (and the fused optimizer's state) at the backend's storage."""
        for p, view in zip(self.weights.values(), self._backend.split_embedding_weights(), strict=True):
            if p.data.data_ptr() != view.data_ptr() or p.data.shape != view.shape or p.dtype != view.dtype:
                p.data = view
        if self._fused_optimizer is not None:
            self._fused_optimizer._refresh(self._backend.split_optimizer_states())
            for p in self.weights.values():
                p._in_backward_optimizers = [self._fused_optimizer]

    def __deepcopy__(self, memo: dict[int, object]) -> _BatchedLookupBase:
        # Default deep copies clone each parameter on its own (Parameter.__deepcopy__), which
        # would detach the table weights from the copied kernel storage; re-link them.
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = copy.deepcopy(value, memo)
        new._relink()
        return new

    @property
    def tiered(self) -> bool:
        """Whether the tables are tiered (a cache of hot rows over host memory or SSD)."""
        return self.tiering is not None

    @property
    def id_check(self) -> str:
        """How ids and offsets are checked: ``"sync"`` or ``"async"`` (see ``lightrec.kernels.input_checks``)."""
        return self._input_checker.mode

    def report_pending_errors(self) -> None:
        """Raise now an input error that asynchronous id checks found in an earlier call (if any).

        With ``id_check="async"`` a bad id is reported by the call after the one that carried it;
        call this after the last batch (e.g. at the end of an epoch) to hear about that one too.
        It does not wait for the device: checks whose result has not arrived stay pending.
        """
        self._input_checker.report_pending()

    def _run(
        self, indices: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None, out_rows: OutRows | None = None
    ) -> torch.Tensor:
        checker = self._input_checker
        if checker.mode == "async":
            checker.report_pending()
        batch = checker.check_shapes(indices, offsets, psw)
        singletons = None
        kernel = self._backend
        if checker.mode == "sync":
            # A kernel's one-id-per-bag fast path learns its answer in the same host read.
            want = kernel.wants_singletons and self.pooling != PoolingType.NONE
            singletons = checker.check_values(indices, offsets, batch, want_singletons=want, per_sample_weights=psw)
        optimizer = self._fused_optimizer
        fused = optimizer is not None
        inputs = [self._placeholder] if fused else list(self.weights.values())

        def lr() -> float:  # read when the kernel runs, so LR schedulers take effect at once
            if optimizer is None:
                return 0.0
            current: float = optimizer.param_groups[0]["lr"]
            return current

        if batch == 0:  # nothing to look up; keep the output shape contract
            width = (
                sum(self.dims[t] for t in self.feature_table_map)
                if self.pooling != PoolingType.NONE
                else self.dims[0]
            )
            rows = 0 if self.pooling != PoolingType.NONE else indices.numel()
            # Still one autograd node over the same inputs as a real lookup: backward reaches the
            # parameters in the same order on every rank (data-parallel replicas all-reduce their
            # gradient there, so a rank with no samples must join, in step with the others).
            dtype = next(iter(self.weights.values())).dtype
            count_step = kernel.count_step if fused else None
            empty: torch.Tensor = EmptyLookup.apply(rows, width, self._placeholder.device, dtype, count_step, *inputs)
            if out_rows is not None:
                out_rows.copy_from(empty)
            return empty
        # The kernels treat per-id weights as constants; with_weight_grad differentiates learned ones.
        learned = psw is not None and psw.requires_grad and torch.is_grad_enabled() and self.pooling != PoolingType.NONE
        weights_in, psw = (psw, psw.detach()) if learned and psw is not None else (None, psw)
        # Learned per-id weights change the output after the kernel: the kernel may not place it then.
        placing = out_rows if weights_in is None else None
        request = LookupBatch(indices, offsets, psw, batch, checked=checker.mode == "sync", singletons=singletons,
                              out_rows=placing)  # fmt: skip
        out = kernel.lookup(request, inputs, lr)
        if checker.mode == "async":  # a kernel that finds bad ids on the device (checks_ids_on_device)
            if kernel.error_flag is None:
                raise RuntimeError(f"the {kernel.name!r} kernel checks ids on the device but has no error flag")
            checker.arm(kernel.error_flag, indices, offsets, batch)
        if weights_in is not None:
            # A tiered kernel's split views are its backing store, older than the cache's dirty rows.
            ids, table_rows, tables = (
                (indices, kernel.split_embedding_weights, self.feature_table_map) if self.tiering is None
                else rows_through_cache(kernel, indices, offsets, batch, self.feature_table_map)
            )  # fmt: skip
            out = with_weight_grad(out, weights_in, ids, offsets, batch, table_rows, tables, self.pooling == PoolingType.MEAN)
        if out_rows is not None and not out_rows.placed:
            out_rows.copy_from(out)
        return out

    def extra_repr(self) -> str:
        opt = (
            "None"
            if self.optimizer_spec is None
            else f"{self.optimizer_spec.optimizer.name}(lr={self.fused_optimizer.param_groups[0]['lr']})"
        )
        tiering = ""
        if self.tiering is not None:
            inner = getattr(self._backend, "inner_name", self.backend_name)
            tiering = (
                f", tiering={self.tiering.backing}/{self.tiering.algorithm}, cache_rows="
                f"{[self.tiering.cache_rows_for(r) for r in self.rows]}, cache_kernel='{inner}'"
            )
        return (
            f"tables={self.table_names}, rows={self.rows}, dims={self.dims}, features={self.num_features}, "
            f"pooling={self.pooling.name}, kernel_backend='{self.backend_name}', optimizer={opt}, "
            f"id_check='{self.id_check}'{tiering}"
        )


def flush_kernels(module: nn.Module) -> None:
    """Flush every batched lookup inside ``module``: tiered tables write their dirty cached rows back,
    so their split views (the backing stores) hold every row's current value."""
    for m in module.modules():
        if isinstance(m, _BatchedLookupBase):
            m.flush()


def _flush_before_state_dict(module: nn.Module, prefix: str, keep_vars: bool) -> None:
    if isinstance(module, _BatchedLookupBase):  # always (registered on one)
        module.flush()


def _flush_before_load(module: _BatchedLookupBase, *args: object) -> None:
    _flush_for_load(module.kernel)


def _flush_for_load(kernel: EmbeddingKernel) -> None:
    """Write a cache back before a load. A tiered cache broken by a failed transfer holds nothing worth
    writing back (``TransferFailedError``): the load replaces its rows and ``invalidate()`` drops it."""
    try:
        kernel.flush()
    except TransferFailedError:
        pass


def _invalidate_after_load(module: nn.Module, incompatible_keys: object) -> None:
    if isinstance(module, _BatchedLookupBase):  # always (registered on one)
        module.kernel.invalidate()


def _id_check_mode(id_check: str, kernel: EmbeddingKernel, device: torch.device) -> str:
    """``"auto"``: asynchronous (device-side) checks for a kernel that checks ids on the device
    (Triton) on CUDA, else ``"sync"``."""
    if id_check not in ID_CHECK_MODES:
        raise ValueError(f"id_check must be one of {ID_CHECK_MODES}, got {id_check!r}")
    if id_check == "async" and not kernel.checks_ids_on_device:
        raise ValueError(
            f"id_check='async' needs a kernel that checks ids on the device (Triton: its kernels skip bad ids; "
            f"the {kernel.name!r} kernel would read out of bounds); use id_check='sync' or kernel_backend='triton'"
        )
    if id_check == "auto":
        return "async" if kernel.checks_ids_on_device and device.type == "cuda" else "sync"
    return id_check


class BatchedEmbeddingBag(_BatchedLookupBase):
    """Pooled lookup of a group of tables in one kernel call.

    Args:
        tables: ``EmbeddingBagConfig`` s (their ``init_weight`` initialises the rows), ``BatchedTableSpec`` s
            or ``(rows, dim)`` tuples; a shard is just a table with the shard's rows/dim.
        feature_table_map: ``[T]`` table index of each feature (default: one feature per table).
        pooling: ``PoolingType.SUM`` or ``PoolingType.MEAN``.
        optimizer: fused optimizer (``FusedOptimizerSpec`` or torchrec ``fused_params`` dict), or
            None for plain autograd gradients on ``weights.<table>``.
        kernel_backend: ``"auto"`` (fbgemm when it supports the configuration; else triton on CUDA;
            else torch), ``"fbgemm"``, ``"triton"`` (CUDA, or CPU under ``TRITON_INTERPRET=1``),
            ``"torch"`` or a kernel added with ``register_kernel``; ``backend_name`` says which runs
            (``lightrec.kernels.kernel_registry`` has the rule).
        device: where the tables live.
        optimizer_param_names: names under which ``fused_optimizer`` checkpoints each table
            (default ``weights.<table>``); collections pass ``embedding_bags.<table>.weight``.
        id_check: ``"sync"`` (ids and offsets checked before the kernel, one host read per call),
            ``"async"`` (Triton only: checked by the kernels on the device, no host read; an error
            is raised by the next call or :meth:`report_pending_errors`) or ``"auto"`` (async for
            Triton on CUDA, else sync). See ``lightrec.kernels.input_checks``.
        tiering: keep the tables' rows in a backing tier (host memory or SSD) with a cache of hot rows
            on ``device`` (``lightrec.kernels.tiered.config.TieringConfig``; ``kernel_backend`` then
            picks the kernel serving the cache; docs/tiered-tables.md). Needs a fused optimizer.
        backend: the former name of ``kernel_backend`` (deprecated).

    ``forward(indices [N], offsets [T*B+1], per_sample_weights [N] | None) -> [B, sum_f D_f]``.
    """

    def __init__(
        self,
        tables: Sequence[TableLike],
        feature_table_map: Sequence[int] | None = None,
        pooling: PoolingType = PoolingType.SUM,
        optimizer: FusedOptimizerSpec | Mapping[str, object] | None = None,
        kernel_backend: str = "auto",
        device: torch.device | str | None = None,
        optimizer_param_names: Sequence[str] | None = None,
        id_check: str = "auto",
        *,
        tiering: TieringConfig | None = None,
        backend: str | None = None,
    ) -> None:
        if pooling not in (PoolingType.SUM, PoolingType.MEAN):
            raise ValueError(
                f"BatchedEmbeddingBag pools with SUM or MEAN, got {pooling}; use BatchedEmbedding for NONE"
            )
        kernel_backend = resolve_kernel_backend(kernel_backend, "BatchedEmbeddingBag", backend=backend)
        super().__init__(
            tables, feature_table_map, pooling, optimizer, kernel_backend, device, optimizer_param_names, id_check,
            tiering,
        )  # fmt: skip

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
        out_rows: OutRows | None = None,
    ) -> torch.Tensor:
        """``[B, sum D]`` pooled output; with ``out_rows`` its rows are (also) written there, and the
        returned tensor holds values only where ``out_rows.placed`` stays False (see :class:`OutRows`)."""
        return self._run(indices, offsets, per_sample_weights, out_rows)


class BatchedEmbedding(_BatchedLookupBase):
    """Unpooled (sequence) lookup of a group of tables sharing one embedding dim.

    Same arguments as :class:`BatchedEmbeddingBag` without ``pooling``.
    ``forward(indices [N], offsets [T*B+1]) -> [N, D]`` (row ``i`` is the embedding of ``indices[i]``
    in the table of its feature).
    """

    def __init__(
        self,
        tables: Sequence[TableLike],
        feature_table_map: Sequence[int] | None = None,
        optimizer: FusedOptimizerSpec | Mapping[str, object] | None = None,
        kernel_backend: str = "auto",
        device: torch.device | str | None = None,
        optimizer_param_names: Sequence[str] | None = None,
        id_check: str = "auto",
        *,
        tiering: TieringConfig | None = None,
        backend: str | None = None,
    ) -> None:
        dims = {s.embedding_dim for s in _table_specs(tables)}
        if len(dims) > 1:
            raise ValueError(f"BatchedEmbedding tables must share one embedding_dim, got {sorted(dims)}")
        kernel_backend = resolve_kernel_backend(kernel_backend, "BatchedEmbedding", backend=backend)
        super().__init__(
            tables,
            feature_table_map,
            PoolingType.NONE,
            optimizer,
            kernel_backend,
            device,
            optimizer_param_names,
            id_check,
            tiering,
        )

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self._run(indices, offsets, None)
