"""The kernel interface: what a batched lookup backend does for a group of tables.

Every backend -- fbgemm TBE, Triton, pure torch, and the ones to come (a cache over host memory or
SSD, a managed-collision remapper) -- is a class that implements :class:`EmbeddingKernel` and is
registered by name in :mod:`lightrec.kernels.kernel_registry`. ``BatchedEmbeddingBag`` /
``BatchedEmbedding`` build one through the registry and talk to it only through this interface::

    construction   Kernel(KernelConfig(rows, dims, feature_table_map, pooling, spec, device, names))
                   Kernel.supports(config) -> None, or why it cannot serve the group here
    lookup         kernel.lookup(LookupBatch(indices, offsets, weights, batch_size, ...),
                                 weight_inputs, lr) -> pooled [B, sum D] | sequence [N, D]
    fused update   the backward of that output: ``spec``'s optimizer applied to the looked-up rows
                   in place (``lr()`` read then); without ``spec``, dense gradients of weight_inputs
    storage        split_embedding_weights() -> [rows, D] per table (views of the live storage)
                   split_optimizer_states() -> {state name: [rows] | [rows, D]} per table
                   apply(fn): nn.Module._apply's device / dtype conversion (or a clear refusal)
    rows           read_rows / write_rows / reset_rows(table, rows, ...): one table's rows and their
                   optimizer state (managed-collision eviction resets both; a cache moves both);
                   reset_tables([(table, rows, weights), ...]): reset_rows of several tables at once
    prefetch       prefetches: bool; prefetch(indices, offsets): a later batch's ids, handed over
                   while the current batch trains (a cached table fetches the rows it will miss)
    consistency    flush(): rows held elsewhere (a cache) written back, so the split views are
                   current; invalidate(): the split views were written from outside (a load), drop
                   any other copy of their rows

The three in-memory backends share :class:`ResidentRows`: row access over their split views, and a
prefetch, a flush and an invalidate that do nothing. The tiered kernel (``tiered/backend.py``: a
cache of hot rows over host memory or SSD) is built from a config with ``tiering`` set.
docs/kernels.md ("Adding a kernel") walks through adding one.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Generic, Protocol, TypeVar, runtime_checkable

import torch

from lightrec.kernels.tiered.config import TieringConfig
from lightrec.modules.embedding_configs import PoolingType
from lightrec.modules.managed_collision.mch_native import native_step_available
from lightrec.modules.managed_collision.ops import uniform_block
from lightrec.optim.fused_spec import FusedOptimizerSpec

__all__ = [
    "EmbeddingKernel",
    "KernelConfig",
    "LayoutCheck",
    "LayoutGatedKernel",
    "LookupContext",
    "LookupBatch",
    "OutRows",
    "ResidentRows",
    "RowState",
    "require_support",
]


@dataclass(frozen=True)
class KernelConfig:
    """What a kernel serves: a group of tables (or shards of tables) read by a list of features.

    Attributes:
        rows, dims: ``[T]`` rows and embedding dim of each table.
        feature_table_map: ``[F]`` table index of each feature (several features may share a table).
        pooling: ``SUM`` / ``MEAN`` (pooled lookup), or ``NONE`` (one row per id; all dims equal).
        spec: the fused optimizer applied in backward, or None for dense autograd gradients.
        device: where the tables live.
        table_names: ``[T]`` names (the kernel may use them in messages and its own bookkeeping).
        dtype: the tables' storage type.
        tiering: None for tables held whole in ``device`` memory; else where their rows live and
            how big their cache is (``lightrec.kernels.tiered.config``).
    """

    rows: Sequence[int]
    dims: Sequence[int]
    feature_table_map: Sequence[int]
    pooling: PoolingType
    spec: FusedOptimizerSpec | None
    device: torch.device
    table_names: Sequence[str] = ()
    dtype: torch.dtype = torch.float32
    tiering: TieringConfig | None = None


class LayoutCheck(Protocol):
    """A backend's test of a table layout (``fbgemm_supports``, ``triton_supports``): None when it
    serves the layout, else the reason it cannot."""

    def __call__(
        self,
        spec: FusedOptimizerSpec | None,
        device: torch.device,
        dims: Sequence[int],
        pooling: PoolingType,
        feature_table_map: Sequence[int],
    ) -> str | None: ...


def check_layout(check: LayoutCheck, config: KernelConfig) -> str | None:
    """``check`` of ``config``'s optimizer, device, dims, pooling and feature map."""
    return check(config.spec, config.device, config.dims, config.pooling, config.feature_table_map)


def require_support(reason: str | None, kernel_backend: str) -> None:
    """Refuse to build a kernel its own ``supports`` turned down.

    Raises:
        ValueError: ``reason`` is not None; the message names ``kernel_backend`` and the reason.
    """
    if reason is not None:
        raise ValueError(f"kernel_backend={kernel_backend!r} cannot serve this lookup: {reason}")


KernelT = TypeVar("KernelT")
SavedT = TypeVar("SavedT")


class LookupContext(Protocol, Generic[KernelT, SavedT]):
    """What a kernel's lookup ``autograd.Function`` forward leaves on the context for its backward:
    the kernel, the batch size ``B``, the learning-rate getter (read when the backward runs), how many
    weight inputs followed (each gets a gradient slot), ``saved``, the kernel's own tensors, and
    ``out_rows``, where it wrote its output rows in place (:class:`OutRows`; None otherwise)."""

    backend: KernelT
    batch: int
    lr: Callable[[], float]
    num_weight_inputs: int
    saved: SavedT
    out_rows: OutRows | None


class OutRows:
    """Where a caller wants a pooled lookup's ``[B, W]`` output rows written: ``blocks`` of
    ``(first row, destination [b, W])`` covering rows ``0 .. B - 1`` (destinations with unit column
    stride and any row stride: a column block of a wider tensor, a shared-memory segment).

    A kernel that writes its rows there itself sets ``placed``; the output it returns then holds no
    values (only its shape and autograd history count), and the caller reads the destinations. Such
    a kernel also takes its backward's gradient rows where they arrive: the caller hands them over
    with :meth:`give_grad` before it passes a stand-in gradient through autograd, and the kernel's
    backward reads them with :meth:`take_grad`. Else the caller copies the output into the
    destinations (:meth:`copy_from`) and the backward is autograd's. Used by a sharded collection,
    whose lookup writes straight into the pooled exchange (``distributed/comm/pooled_all_to_all.py``).

    The destinations are dropped once written (:meth:`written`): the object outlives the forward in
    autograd's graph, and a reference from there to the output would be a cycle Python cannot collect.
    """

    __slots__ = ("blocks", "placed", "_grad")

    def __init__(self, blocks: Sequence[tuple[int, torch.Tensor]]) -> None:
        self.blocks = list(blocks)
        self.placed = False
        self._grad: tuple[list[tuple[int, torch.Tensor]], Callable[[], None]] | None = None

    def written(self, placed: bool) -> None:
        """The rows are in the destinations (``placed``: by the kernel); forget the destinations."""
        self.placed = placed
        self.blocks = []

    def copy_from(self, out: torch.Tensor) -> None:
        """Copy the ``[B, W]`` output's rows into the destinations (no autograd history)."""
        with torch.no_grad():
            for start, dst in self.blocks:
                dst.copy_(out[start : start + dst.shape[0]])
        self.written(False)

    def give_grad(self, parts: list[tuple[int, torch.Tensor]], release: Callable[[], None]) -> None:
        """The output gradient's rows as ``(first row, [n, W])`` blocks back to back from row 0, valid
        until ``release()`` runs (the kernel's backward calls it once it read them)."""
        self._grad = (parts, release)

    def take_grad(self) -> tuple[list[tuple[int, torch.Tensor]], Callable[[], None]] | None:
        """What :meth:`give_grad` handed over (once), or None."""
        grad, self._grad = self._grad, None
        return grad


@dataclass(frozen=True)
class LookupBatch:
    """One lookup's input, in fbgemm TBE's flattened layout (``F`` features, batch ``B``).

    Attributes:
        indices: ``[N]`` ids, local to their table, int32 or int64 (a kernel converts what it needs).
        offsets: ``[F * B + 1]`` bag boundaries, feature-major, the dtype of ``indices``.
        per_sample_weights: ``[N]`` per-id weights, or None.
        batch_size: ``B``.
        checked: the ids and offsets were verified on the host before (``id_check="sync"``).
        singletons: whether every bag holds exactly one id, when the host check learned it (None:
            unknown).
        out_rows: where the caller wants a pooled output's rows (:class:`OutRows`), or None; a kernel
            may ignore it.
    """

    indices: torch.Tensor
    offsets: torch.Tensor
    per_sample_weights: torch.Tensor | None
    batch_size: int
    checked: bool = True
    singletons: bool | None = None
    out_rows: OutRows | None = None


@dataclass
class RowState:
    """Some rows of one table: their weights and their fused-optimizer state.

    Attributes:
        weights: ``[n, D]``.
        states: ``{state name: [n] | [n, D]}`` (the per-row part of ``split_optimizer_states``;
            counters shared by every row, such as Adam's step, are not row state).
    """

    weights: torch.Tensor
    states: dict[str, torch.Tensor] = field(default_factory=dict)


@runtime_checkable
class EmbeddingKernel(Protocol):
    """A batched lookup backend (see the module docstring for the whole contract)."""

    name: ClassVar[str]
    """The ``kernel_backend`` name it is registered under."""
    checks_ids_on_device: ClassVar[bool]
    """Bad ids are found by the kernel on the device (``id_check="async"`` possible; see
    ``lightrec.kernels.input_checks``); False: the caller must check them on the host first."""
    wants_singletons: ClassVar[bool]
    """The host id check should also report whether every bag holds one id
    (``LookupBatch.singletons``: folded into the check's one host read, it saves the kernel one)."""
    spec: FusedOptimizerSpec | None
    prefetches: bool
    error_flag: torch.Tensor | None
    """``[1]`` int32 on the device, non-zero after a lookup met a bad id (``checks_ids_on_device``)."""

    def __init__(self, config: KernelConfig) -> None:
        """Allocate and lay out the tables (their values are filled by the caller, through the
        split views)."""
        ...

    @classmethod
    def supports(cls, config: KernelConfig) -> str | None:
        """None when this kernel can serve ``config`` here, else the reason it cannot."""
        ...

    def lookup(
        self, batch: LookupBatch, weight_inputs: Sequence[torch.Tensor], lr: Callable[[], float]
    ) -> torch.Tensor:
        """Pooled ``[B, sum_f D_f]`` (features in order) or sequence ``[N, D]`` output.

        With ``spec``, the output's backward is the fused update: the rows it read are updated in
        place (``lr()`` is read when the backward runs, so schedulers take effect at once) and
        ``weight_inputs`` (a placeholder then) get no gradient. Without ``spec``, ``weight_inputs``
        are the tables' ``[rows, D]`` parameters and receive dense gradients.
        """
        ...

    def split_embedding_weights(self) -> list[torch.Tensor]:
        """``[rows, D]`` view of each table (aliases the live storage: in-place writes are visible)."""
        ...

    def split_optimizer_states(self) -> list[dict[str, torch.Tensor]]:
        """Per table ``{state name: view}``, as ``FusedOptimizerSpec.state_names`` names them."""
        ...

    def read_rows(self, table: int, rows: torch.Tensor) -> RowState:
        """Copies of ``rows`` (``[n]`` int64 local ids) of table ``table`` and their optimizer state."""
        ...

    def write_rows(self, table: int, rows: torch.Tensor, state: RowState) -> None:
        """Overwrite ``rows`` of table ``table`` and (the names ``state`` gives) their optimizer state."""
        ...

    def reset_rows(self, table: int, rows: torch.Tensor, weights: torch.Tensor) -> None:
        """Give ``rows`` fresh ``weights`` ``[n, D]`` and a zero per-row optimizer state (as a new row
        has; a counter shared by every row, such as Adam's step, keeps counting)."""
        ...

    def reset_tables(self, resets: Sequence[tuple[int, torch.Tensor, torch.Tensor]]) -> None:
        """``reset_rows(table, rows, weights)`` for each entry, in order (a managed-collision step
        resets rows of every table at once)."""
        ...

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        """The ids (TBE layout) a later lookup will read, handed over while the current one trains."""
        ...

    def count_step(self) -> None:
        """The backward of a training lookup of no samples (a rank's empty batch): advance what a
        lookup's backward advances and shares over every row (Adam's ``t``, fbgemm's ``iter``), as
        fbgemm does for a batch of 0; no row changes."""
        ...

    def flush(self) -> None:
        """Write back rows held outside the split views (a cache's dirty rows): the views are current after."""
        ...

    def invalidate(self) -> None:
        """The split views were overwritten from outside (a load): drop every other copy of their rows."""
        ...

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Convert the storage like ``nn.Module._apply`` (``.to()``, ``.double()``), or raise."""
        ...


def native_reset_serves(weights: torch.Tensor, states: Sequence[torch.Tensor]) -> bool:
    """Whether ``torch.ops.lightrec_mch.reset_rows_uniform`` can reset rows of this table view (CPU,
    float32/float64 rows with unit column stride, contiguous states of the same dtype)."""
    if weights.device.type != "cpu" or weights.dtype not in (torch.float32, torch.float64) or weights.stride(1) != 1:
        return False
    if any(s.device.type != "cpu" or s.dtype != weights.dtype or not s.is_contiguous() for s in states):
        return False
    return native_step_available(weights.device)


class ResidentRows(abc.ABC):
    """Row access and prefetch of kernels whose tables live whole in memory (the split views).

    A subclass provides ``split_embedding_weights`` and ``split_optimizer_states`` returning views of
    its live storage; row state is every state tensor with a leading ``[rows]`` dimension.
    """

    prefetches = False
    error_flag: torch.Tensor | None = None

    @abc.abstractmethod
    def split_embedding_weights(self) -> list[torch.Tensor]:
        """``[rows, D]`` view of each table."""

    @abc.abstractmethod
    def split_optimizer_states(self) -> list[dict[str, torch.Tensor]]:
        """Per table ``{state name: view}``."""

    def _row_states(self, table: int, weight: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        weight = self.split_embedding_weights()[table] if weight is None else weight
        return {
            k: v
            for k, v in self.split_optimizer_states()[table].items()
            if v.dim() >= 1 and v.shape[0] == weight.shape[0]
        }

    def read_rows(self, table: int, rows: torch.Tensor) -> RowState:
        weights = self.split_embedding_weights()[table]
        index = rows.to(weights.device, torch.long)
        return RowState(
            weights.index_select(0, index), {k: v.index_select(0, index) for k, v in self._row_states(table).items()}
        )

    def write_rows(self, table: int, rows: torch.Tensor, state: RowState) -> None:
        weights = self.split_embedding_weights()[table]
        index = rows.to(weights.device, torch.long)
        states = self._row_states(table)
        unknown = sorted(set(state.states) - set(states))
        if unknown:
            raise KeyError(f"write_rows: table {table} has no row state {unknown}; its row states are {sorted(states)}")
        with torch.no_grad():
            weights.index_copy_(0, index, state.weights.to(weights.dtype))
            for name, values in state.states.items():
                states[name].index_copy_(0, index, values.to(states[name].dtype))

    def reset_rows(self, table: int, rows: torch.Tensor, weights: torch.Tensor) -> None:
        self.reset_tables([(table, rows, weights)])

    def reset_tables(self, resets: Sequence[tuple[int, torch.Tensor, torch.Tensor]]) -> None:
        # One read of the views for all the tables (building them is most of the cost: managed
        # collisions reset rows of every table at every step), then a write and a fill per tensor.
        all_weights, all_states = self.split_embedding_weights(), self.split_optimizer_states()
        with torch.no_grad():
            for table, rows, weights in resets:
                table_weights = all_weights[table]
                index = rows.to(table_weights.device, torch.long)
                table_weights.index_copy_(0, index, weights.to(table_weights.device, table_weights.dtype))
                for state in all_states[table].values():
                    if state.dim() >= 1 and state.shape[0] == table_weights.shape[0]:
                        state.index_fill_(0, index, 0)

    def reset_tables_uniform(self, resets: Sequence[tuple[int, torch.Tensor, int, float, float]]) -> None:
        """``reset_tables`` with fresh weights drawn, not given: for each ``(table, rows, seed, low,
        high)``, row ``rows[k]`` gets row ``k`` of ``managed_collision.ops.uniform_block(len(rows), D, seed, low, high,
        float32)`` (in the table's dtype) and a zero per-row state -- in one native pass per table on
        CPU (``torch.ops.lightrec_mch.reset_rows_uniform``), no ``[k, D]`` block in between."""
        all_weights, all_states = self.split_embedding_weights(), self.split_optimizer_states()
        with torch.no_grad():
            for table, rows, seed, low, high in resets:
                weights = all_weights[table]
                states = [s for s in all_states[table].values() if s.dim() >= 1 and s.shape[0] == weights.shape[0]]
                if native_reset_serves(weights, states):
                    torch.ops.lightrec_mch.reset_rows_uniform(weights, states, rows.to(torch.long).contiguous(), seed,
                                                              low, high - low)  # fmt: skip
                    continue
                index = rows.to(weights.device, torch.long)
                fresh = uniform_block(rows.numel(), weights.shape[1], seed, low, high, torch.float32)
                weights.index_copy_(0, index, fresh.to(weights.device, weights.dtype))
                for state in states:
                    state.index_fill_(0, index, 0)

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:  # noqa: B027 - a no-op by design
        """Nothing to fetch: every row is in memory."""

    def flush(self) -> None:  # noqa: B027 - a no-op by design
        """Nothing to write back: the split views are the storage."""

    def invalidate(self) -> None:  # noqa: B027 - a no-op by design
        """No other copy of the rows exists."""


class LayoutGatedKernel(ResidentRows):
    """Resident rows served by a kernel that takes only some layouts (fbgemm, Triton): ``supports`` is
    its ``layout_check`` of the configuration, and construction refuses what that turns down.

    A subclass sets ``name`` and ``layout_check`` and calls ``super().__init__(config)`` first.
    """

    name: ClassVar[str]
    layout_check: ClassVar[LayoutCheck]

    @classmethod
    def supports(cls, config: KernelConfig) -> str | None:
        """``layout_check`` of the configuration's optimizer, device, dims, pooling and feature map."""
        return check_layout(cls.layout_check, config)

    def __init__(self, config: KernelConfig) -> None:
        require_support(self.supports(config), self.name)
