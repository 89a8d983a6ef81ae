"""Pure-PyTorch batched lookup: works wherever torch does (no fbgemm wheel needed).

Storage: the tables of a group are concatenated row-wise, one ``[sum rows, D]`` tensor per
distinct embedding dim (a *dim group*; usually there is one). Table ``t`` is the row range
``[row_offset[t], row_offset[t] + rows[t])`` of its dim group's tensor, so a lookup of all
features of a dim group is ONE ``F.embedding_bag`` (or ``F.embedding``) call on shifted ids::

    storage (one dim group, D=4):     rows 0..9  -> table A   (features f0, f2 read it)
                                      rows 10..16 -> table B  (feature f1)
    global id = local id + row_offset[table of the id's feature]

The backward is a custom ``autograd.Function``. Fused mode: the gradient of each bag is spread to
its ids, duplicate ids are summed, and the optimizer updates just those rows in place; no
``[rows, D]`` gradient is ever allocated. On CPU that is one native pass over the output gradient
(``cpu_update.native_fused_update``: de-duplicate, sum per row, update each row once, on torch's
intra-op threads); elsewhere, or without the native library, a composition of stock ops
(``sparse_update.apply_sparse_update``) with the same results. Non-fused mode: dense per-table
gradients are returned, as ``nn.EmbeddingBag`` would produce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from lightrec._host_memory import empty_host_tensor
from lightrec._native import cpu_ops_loaded
from lightrec.kernels.cpu_gather import gather_rows, gather_rows_into
from lightrec.kernels.cpu_update import (
    NATIVE_OPTIMIZERS,
    native_fused_update,
    native_update_available,
    new_scratch,
)
from lightrec.kernels.kernel_interface import KernelConfig, LookupBatch, LookupContext, OutRows, ResidentRows
from lightrec.kernels.sparse_update import apply_sparse_update, compute_dtype
from lightrec.modules.embedding_configs import PoolingType

__all__ = ["TorchBatchedLookup", "dim_groups"]


@dataclass
class _DimGroup:
    dim: int
    tables: list[int]  # table indices stored here, in storage order
    features: list[int]  # feature indices whose table is stored here, in feature order
    weight: torch.Tensor  # [R, dim]
    states: dict[str, torch.Tensor] = field(default_factory=dict)
    scratch: torch.Tensor | None = None  # [R] int32 de-duplication scratch of the native update

    def update_scratch(self) -> torch.Tensor:
        if self.scratch is None or self.scratch.numel() != self.weight.shape[0]:
            self.scratch = new_scratch(self.weight.shape[0])
        return self.scratch


class TorchBatchedLookup(ResidentRows):
    """Storage, lookup and fused update of a group of tables in plain PyTorch (an ``EmbeddingKernel``).

    Args:
        config: the tables (``rows``, ``dims``), ``feature_table_map``, ``pooling`` (SUM / MEAN, or
            NONE for the unpooled lookup: all dims equal), the fused optimizer ``spec`` (None: plain
            autograd gradients), ``device`` and ``dtype`` of the weights.
        storage: None to allocate the tables; else the storage to serve, one ``(weight [R, D],
            {state name: [R] or [R, D]})`` per dim group in :func:`dim_groups` order (another
            kernel's live tables, e.g. fbgemm's: ``cpu_shared_lookup.py``). Used as given, never
            copied; its shapes must be the ones this kernel would allocate.

    Raises:
        ValueError: ``storage`` does not have one entry per dim group of the right shapes.
    """

    name: ClassVar[str] = "torch"
    checks_ids_on_device: ClassVar[bool] = False
    wants_singletons: ClassVar[bool] = True

    @classmethod
    def supports(cls, config: KernelConfig) -> str | None:
        """Plain torch serves every configuration on every device."""
        return None

    def __init__(
        self, config: KernelConfig, storage: Sequence[tuple[torch.Tensor, dict[str, torch.Tensor]]] | None = None
    ) -> None:
        rows, dims, device, dtype = config.rows, config.dims, config.device, config.dtype
        self.rows, self.dims, self.ftm = list(rows), list(dims), list(config.feature_table_map)
        self.pooling, self.spec = config.pooling, config.spec
        # Backward passes so far (Adam's t). It lives with the weights and is read on the device, so a
        # CUDA backward needs no host sync for it; int64 like fbgemm's ``iter`` (float32 stops at 2^24).
        self.step = torch.zeros((), dtype=torch.int64, device=device)
        self.row_offset = [0] * len(self.rows)
        self.table_group = [0] * len(self.rows)
        self.groups: list[_DimGroup] = []
        grouped = dim_groups(self.dims)
        if storage is not None and len(storage) != len(grouped):
            raise ValueError(f"storage needs one (weight, states) per dim group ({len(grouped)}), got {len(storage)}")
        for dim, tables in grouped:
            total = 0
            for t in tables:
                self.row_offset[t], self.table_group[t] = total, len(self.groups)
                total += self.rows[t]
            features = [f for f, t in enumerate(self.ftm) if self.dims[t] == dim]
            if storage is None:
                # Huge pages on CPU: the lookup and the update read rows at random (far fewer TLB misses).
                weight = empty_host_tensor((total, dim), dtype, device)
                states = self._new_states(total, dim, weight)
            else:
                weight, states = storage[len(self.groups)]
                self._check_storage(weight, states, total, dim)
            self.groups.append(_DimGroup(dim, tables, features, weight, states))
        # Per-feature shift of ids into the dim group's storage (row offset of the feature's table).
        self.feature_shift = torch.tensor(
            [self.row_offset[t] for t in self.ftm], dtype=torch.long, device=device
        )
        self.feature_cols = [sum(self.dims[t] for t in self.ftm[:f]) for f in range(len(self.ftm))]
        self.native_update = False
        self._choose_update()

    def _choose_update(self) -> None:
        """Use the native CPU update where it serves the storage (built on first use, see
        ``lightrec._native``), else the stock-op one."""
        weight = self.groups[0].weight if self.groups else None
        self.native_update = (
            self.spec is not None
            and self.spec.optimizer in NATIVE_OPTIMIZERS
            and weight is not None
            and native_update_available(weight.device, weight.dtype)
        )

    def _check_storage(self, weight: torch.Tensor, states: dict[str, torch.Tensor], total: int, dim: int) -> None:
        """Refuse given storage whose shapes differ from what this kernel would allocate."""
        spec = self.spec
        want = {} if spec is None else {name: spec.state_shape(name, total, dim) for name in spec.state_names}
        got = {name: tuple(t.shape) for name, t in states.items()}
        if tuple(weight.shape) != (total, dim) or got != want:
            raise ValueError(
                f"storage of a dim group must be a [{total}, {dim}] weight and states {want}, "
                f"got {list(weight.shape)} and {got}"
            )

    def _new_states(self, total: int, dim: int, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.spec is None:
            return {}
        # float32 state for float16 / bfloat16 tables (compute_dtype): a half-precision Adagrad sum
        # or Adam moment underflows (eps=1e-8 is 0 in float16) and the rows become inf.
        dtype = compute_dtype(weight.dtype)
        return {
            name: empty_host_tensor(self.spec.state_shape(name, total, dim), dtype, weight.device)
            for name in self.spec.state_names
        }

    # ---- views -------------------------------------------------------------------------------

    def split_embedding_weights(self) -> list[torch.Tensor]:
        """``[rows, D]`` view of each table (aliases the storage; in-place writes are visible)."""
        out = []
        for t, n in enumerate(self.rows):
            g = self.groups[self.table_group[t]]
            out.append(g.weight.detach()[self.row_offset[t] : self.row_offset[t] + n])
        return out

    def split_optimizer_states(self) -> list[dict[str, torch.Tensor]]:
        """Per table ``{state name: view}``; Adam tables also share the ``"step"`` counter."""
        out = []
        for t, n in enumerate(self.rows):
            g = self.groups[self.table_group[t]]
            st = {k: v[self.row_offset[t] : self.row_offset[t] + n] for k, v in g.states.items()}
            if self.spec is not None and self.spec.uses_step:
                st["step"] = self.step
            out.append(st)
        return out

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Convert every tensor (``nn.Module._apply`` semantics: ``.to()``, ``.double()``, ...)."""
        for g in self.groups:
            g.weight = fn(g.weight)
            g.states = {k: _converted_state(fn, v, g.weight.dtype) for k, v in g.states.items()}
            g.scratch = None
        self.feature_shift = self.feature_shift.to(self.groups[0].weight.device)
        self.step = self.step.to(self.groups[0].weight.device)
        self._choose_update()

    # ---- lookup -------------------------------------------------------------------------------

    def _group_inputs(
        self, g: _DimGroup, indices: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None, batch: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Storage ids, bag offsets (``[T_g * B + 1]``) and weights of the features of ``g``."""
        num_features = len(self.ftm)
        if len(g.features) == num_features:
            feature_starts = offsets[::batch]
            counts = feature_starts[1:] - feature_starts[:-1]
            if len(self.groups[0].tables) == 1 and len(self.groups) == 1:
                ids = indices  # one table: no shift needed
            else:
                ids = indices + torch.repeat_interleave(
                    self.feature_shift, counts, output_size=indices.numel()
                )
            return ids, offsets, psw
        # Mixed dims: gather this group's feature segments (one slice per feature).
        id_parts, off_parts, w_parts = [], [], []
        base: torch.Tensor | int = 0
        for f in g.features:
            lo, hi = offsets[f * batch], offsets[(f + 1) * batch]
            id_parts.append(indices[lo:hi] + self.row_offset[self.ftm[f]])
            off_parts.append(offsets[f * batch : (f + 1) * batch] - lo + base)
            if psw is not None:
                w_parts.append(psw[lo:hi])
            base = base + (hi - lo)
        off_parts.append(torch.as_tensor(base, device=offsets.device).reshape(1))
        return torch.cat(id_parts), torch.cat(off_parts), (torch.cat(w_parts) if psw is not None else None)

    def count_step(self) -> None:
        """A fused backward of no samples: ``step`` advances as a lookup's backward advances it."""
        if self.spec is not None:
            self.step += 1

    def lookup(
        self, batch: LookupBatch, weight_inputs: Sequence[torch.Tensor], lr: Callable[[], float]
    ) -> torch.Tensor:
        """Pooled ``[B, sum D]`` (features in order) or unpooled ``[N, D]`` output.

        ``batch.singletons``: whether every bag holds one id, when the caller already knows (its
        input check reads it with the id check, saving a host sync); None computes it here.
        """
        out: torch.Tensor = _LookupFunction.apply(
            self, batch.indices.long(), batch.offsets.long(), batch.per_sample_weights, batch.batch_size, lr,
            batch.singletons, batch.out_rows, *weight_inputs,
        )  # fmt: skip
        return out


# What :class:`_LookupFunction`'s forward leaves for its backward; ``saved`` holds per lookup group
# (ids, per-bag offsets or None for one id per bag, per-sample weights or None).
_LookupContext = LookupContext[
    TorchBatchedLookup, list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]
]


class _LookupFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: _LookupContext,
        backend: TorchBatchedLookup,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        psw: torch.Tensor | None,
        batch: int,
        lr: Callable[[], float],
        singletons: bool | None,
        out_rows: OutRows | None,
        *weight_inputs: torch.Tensor,
    ) -> torch.Tensor:
        pooled = backend.pooling != PoolingType.NONE
        ctx.backend, ctx.batch, ctx.lr = backend, batch, lr
        ctx.out_rows = None
        ctx.num_weight_inputs = len(weight_inputs)
        if singletons is None:
            singletons = pooled and len(backend.groups) == 1 and _all_singletons(offsets, indices.numel())
        if pooled and len(backend.groups) == 1 and singletons:
            # One id per bag (the common "one id per feature" batch): pooling is a row gather. Reading
            # the ids sample-major makes the gather land directly in the [B, T*D] output layout,
            # saving the feature-major -> sample-major transposes of output and gradient.
            g = backend.groups[0]
            num_features = len(g.features)
            ids, w = _sample_major_inputs(backend, g, indices, offsets, psw, batch)
            ctx.saved = [(ids, None, w)]
            if out_rows is not None:
                ctx.out_rows = out_rows  # the backward takes its gradient rows from it
                return _gather_into(g, ids, w, out_rows, batch)
            out = gather_rows(g.weight, ids)
            if w is not None:
                out = out * w.to(out.dtype).unsqueeze(1)
            return out.view(batch, num_features * g.dim)
        saved: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
        outputs = []
        for g in backend.groups:
            ids, offs, w = backend._group_inputs(g, indices, offsets, psw, batch)
            if pooled:
                weighted_mean = backend.pooling == PoolingType.MEAN and w is not None
                mode = "sum" if weighted_mean else backend.pooling.value.lower()
                # embedding_bag wants weights of the table's dtype: float32 weights on a "16-true"
                # table, or float64 ones on any, are cast as fbgemm casts them (not refused).
                out = F.embedding_bag(
                    ids, g.weight, offs, mode=mode, include_last_offset=True,
                    per_sample_weights=w.to(g.weight.dtype) if w is not None else None,
                )
                if weighted_mean:  # fbgemm's rule: weighted sum divided by the number of ids in the bag
                    out = out / (offs[1:] - offs[:-1]).clamp(min=1).to(out.dtype).unsqueeze(1)
                outputs.append(out.view(len(g.features), batch, g.dim))
            else:
                outputs.append(gather_rows(g.weight, ids))
            saved.append((ids, offs, w))
        ctx.saved = saved
        if not pooled:
            return outputs[0]
        if len(backend.groups) == 1:
            g = backend.groups[0]
            return outputs[0].transpose(0, 1).reshape(batch, len(g.features) * g.dim)
        per_feature: dict[int, torch.Tensor] = {}
        for g, out in zip(backend.groups, outputs, strict=True):
            for i, f in enumerate(g.features):
                per_feature[f] = out[i]
        return torch.cat([per_feature[f] for f in range(len(backend.ftm))], dim=1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: _LookupContext, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        backend: TorchBatchedLookup = ctx.backend
        # Rows written in place (OutRows): the gradient's rows arrive where the exchange left them and
        # grad_out is a stand-in without values.
        handed = ctx.out_rows.take_grad() if ctx.out_rows is not None else None
        fused = backend.spec is not None
        if fused:
            backend.step += 1
            lr, step = float(ctx.lr()), backend.step
        if handed is not None and backend.spec is not None and backend.native_update:
            (g,), ((ids, _, w),) = backend.groups, ctx.saved  # the one-group, one-id-per-bag forward
            parts, release = handed
            # [b, F * D] sample rows as [b * F, D] id rows (a copy only where a block has a row stride of its own)
            dim_parts = [(start * len(g.features), rows.reshape(-1, g.dim)) for start, rows in parts]
            native_fused_update(backend.spec, lr, step, g.weight, g.states, g.update_scratch(), ids, None, None, w,
                                grad_parts=dim_parts)  # fmt: skip
            release()
            return (None, None, None, None, None, None, None, None, *([None] * ctx.num_weight_inputs))
        if handed is not None:
            parts, release = handed
            grad_out = torch.cat([rows for _, rows in parts])
            release()
        # A loss like out.sum() hands back an expanded (stride-0) gradient; arithmetic on it takes
        # a slow broadcasting path on CPU (measured 20 ms vs 1 ms for [53k, 64]), a copy is cheap.
        grad_out = grad_out.contiguous()
        pooled = backend.pooling != PoolingType.NONE
        if backend.spec is not None and backend.native_update:
            spec = backend.spec
            for g, (ids, offs, w) in zip(backend.groups, ctx.saved, strict=True):
                grad, bag_of_id, scale = _native_grad_inputs(backend, g, grad_out, ids, offs, w, ctx.batch)
                native_fused_update(
                    spec, lr, step, g.weight, g.states, g.update_scratch(), ids, grad, bag_of_id, scale
                )
            return (None, None, None, None, None, None, None, None, *([None] * ctx.num_weight_inputs))
        dense_grads = []
        for g, (ids, offs, w) in zip(backend.groups, ctx.saved, strict=True):
            if not pooled:
                contrib = grad_out
            elif offs is None:  # one id per bag, ids in sample-major order (see forward)
                contrib = grad_out.reshape(-1, g.dim)
                if w is not None:
                    contrib = contrib * w.to(contrib.dtype).unsqueeze(1)
            else:
                contrib = _spread_bag_grads(backend, g, grad_out, ids, offs, w, ctx.batch)
            if fused:
                apply_sparse_update(backend.spec, lr, step, g.weight, g.states, ids, contrib)  # type: ignore[arg-type]
            else:
                dense = torch.zeros_like(g.weight)
                dense.index_add_(0, ids, contrib)
                dense_grads.append(dense)
        weight_grads: list[torch.Tensor | None] = [None] * ctx.num_weight_inputs
        if not fused:
            for t, n in enumerate(backend.rows):
                off = backend.row_offset[t]
                weight_grads[t] = dense_grads[backend.table_group[t]][off : off + n]
        return (None, None, None, None, None, None, None, None, *weight_grads)


def _converted_state(
    fn: Callable[[torch.Tensor], torch.Tensor], state: torch.Tensor, weight_dtype: torch.dtype
) -> torch.Tensor:
    """``state`` converted along with the weights by ``fn`` (``module.to(...)``, ``.half()``), but kept
    in :func:`compute_dtype` of the new weight dtype: ``module.half()`` (Lightning's "16-true")
    leaves the optimizer state float32, as fbgemm and the Triton kernel keep it."""
    converted = fn(state)
    want = compute_dtype(weight_dtype) if converted.is_floating_point() else converted.dtype
    if converted.dtype == want:
        return converted
    return state.to(device=converted.device, dtype=want)


def _gather_into(g: _DimGroup, ids: torch.Tensor, w: torch.Tensor | None, out_rows: OutRows, batch: int) -> torch.Tensor:
    """The one-id-per-bag pooled forward written straight into ``out_rows``' destinations (sample ``b``'s
    ``F`` rows side by side in its row): the same values as the gather into a new tensor, one copy
    fewer. Returns a ``[B, F * D]`` stand-in without values (see :class:`OutRows`)."""
    num_features = len(g.features)
    for start, dst in out_rows.blocks:
        rows = slice(start * num_features, (start + dst.shape[0]) * num_features)
        gather_rows_into(g.weight, ids[rows], dst)
        if w is not None:
            dst.view(dst.shape[0], num_features, g.dim).mul_(w[rows].to(dst.dtype).view(-1, num_features, 1))
    out_rows.written(placed=True)
    return g.weight.new_zeros(()).expand(batch, num_features * g.dim)


def dim_groups(dims: Sequence[int]) -> list[tuple[int, list[int]]]:
    """``(dim, table indices)`` of each dim group of a kernel's tables, in storage order (dims in the
    order they first appear, tables in index order): ``[16, 64, 16]`` gives ``[(16, [0, 2]), (64, [1])]``."""
    return [(dim, [t for t, d in enumerate(dims) if d == dim]) for dim in sorted(set(dims), key=list(dims).index)]


def _sample_major_inputs(
    backend: TorchBatchedLookup,
    g: _DimGroup,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    psw: torch.Tensor | None,
    batch: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B * F]`` storage ids (and weights) of a one-group, one-id-per-bag batch in sample-major order:
    entry ``b * F + f`` is sample ``b``'s id of feature ``f``, shifted to its table's rows.

    On CPU one native pass (``lightrec/csrc/lookup_inputs.cpp``) shifts and transposes the ids;
    elsewhere (or without the native library) the same from torch ops.
    """
    num_features = len(g.features)
    if indices.device.type == "cpu" and backend.feature_shift.device.type == "cpu" and cpu_ops_loaded():
        ids = torch.ops.lightrec_cpu.sample_major_ids(indices.contiguous(), backend.feature_shift, batch)
    else:
        ids, _, _ = backend._group_inputs(g, indices, offsets, None, batch)
        ids = ids.view(num_features, batch).t().reshape(-1)
    w = psw.view(num_features, batch).t().reshape(-1) if psw is not None else None
    return ids, w


def _all_singletons(offsets: torch.Tensor, num_ids: int) -> bool:
    """True when every bag holds exactly one id (offsets == arange)."""
    if num_ids != offsets.numel() - 1:
        return False
    return bool(torch.equal(offsets, torch.arange(num_ids + 1, device=offsets.device, dtype=offsets.dtype)))


def _bag_grads(backend: TorchBatchedLookup, g: _DimGroup, grad_out: torch.Tensor, batch: int) -> torch.Tensor:
    """``[F_g, B, D]`` gradient of each bag of the group's features (a view when it can be)."""
    if len(backend.groups) == 1:
        return grad_out.view(batch, len(g.features), g.dim).transpose(0, 1)
    cols = [grad_out[:, backend.feature_cols[f] : backend.feature_cols[f] + g.dim] for f in g.features]
    return torch.stack(cols)


def _bag_of_id_and_scale(
    backend: TorchBatchedLookup,
    ids: torch.Tensor,
    offs: torch.Tensor,
    psw: torch.Tensor | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[N]`` bag of each id, and its factor (MEAN's ``1 / len``, times the per-sample weight) or None."""
    lengths = offs[1:] - offs[:-1]
    bag_of_id = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=ids.device), lengths, output_size=ids.numel()
    )
    scale = None
    if backend.pooling == PoolingType.MEAN:
        scale = (1.0 / lengths.clamp(min=1).to(dtype)).index_select(0, bag_of_id)
    if psw is not None:
        # In ``dtype`` (the gradient's): float64 weights on a float32 table, or float32 ones on a
        # float16 table, would promote the contributions past the table's dtype.
        scale = psw.to(dtype) if scale is None else scale * psw.to(dtype)
    return bag_of_id, scale


def _spread_bag_grads(
    backend: TorchBatchedLookup,
    g: _DimGroup,
    grad_out: torch.Tensor,
    ids: torch.Tensor,
    offs: torch.Tensor,
    psw: torch.Tensor | None,
    batch: int,
) -> torch.Tensor:
    """``[N_g, D]`` gradient of each looked-up row from the ``[B, sum D]`` output gradient."""
    bag_grads = _bag_grads(backend, g, grad_out, batch).reshape(-1, g.dim)
    bag_of_id, scale = _bag_of_id_and_scale(backend, ids, offs, psw, bag_grads.dtype)
    contrib = bag_grads.index_select(0, bag_of_id)
    if scale is not None:
        contrib = contrib * scale.unsqueeze(1)
    return contrib


def _native_grad_inputs(
    backend: TorchBatchedLookup,
    g: _DimGroup,
    grad_out: torch.Tensor,
    ids: torch.Tensor,
    offs: torch.Tensor | None,
    psw: torch.Tensor | None,
    batch: int,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(grad [A, C, D], bag_of_id, scale)`` of ``native_fused_update`` for one dim group: the
    output gradient itself (unpooled rows, or one id per bag in sample-major order), or a view of
    it as ``[F, B, D]`` bags with each id's bag and factor."""
    if backend.pooling == PoolingType.NONE:
        return grad_out.view(1, -1, g.dim), None, None
    if offs is None:  # one id per bag, ids in sample-major order (see forward)
        return grad_out.view(1, -1, g.dim), None, psw
    bag_grads = _bag_grads(backend, g, grad_out, batch)
    bag_of_id, scale = _bag_of_id_and_scale(backend, ids, offs, psw, bag_grads.dtype)
    return bag_grads, bag_of_id, scale
