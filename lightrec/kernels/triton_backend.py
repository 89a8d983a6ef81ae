"""Triton batched lookup: fbgemm-style GPU kernels that need no fbgemm wheel.

Storage (fbgemm TBE's layout): every table of the group lives in ONE flat weight buffer; table
``t`` is the ``rows[t] x dims[t]`` row-major block starting at element ``woff[t]`` (rounded up to
a multiple of 16 elements, so rows load 16 bytes at a time)::

    weight  | table A: 10 x 4 | pad | table B: 7 x 8 | ...        [E] elements
    global row ("key") of table t's row i = row_start[t] + i       (R rows in all)

A lookup of every feature of the group is one launch of ``lookup_forward_kernel``; its backward is
one ``torch.sort`` of the looked-up keys plus a few launches of ``lookup_backward_kernel``, one
per level of its segmented reduction (one launch when the ids fit one tile; else a launch over
the ids, then launches over the two partial sums each program leaves, 128 per program: 2-4
launches for 10^2 to 10^6 ids, see :func:`reduction_levels`). They sum each row's gradient
straight from the output gradient and apply the fused optimizer (or write a dense gradient when
``optimizer=None``). See :mod:`lightrec.kernels.triton_kernels`.

No launch reads a device value on the host: grids come from host ints (batch, number of ids,
number of features), the learning rate is the Python float of the fused optimizer, and Adam's
step counter lives on the device.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from lightrec._triton import triton_device_reason
from lightrec.kernels.kernel_interface import (
    KernelConfig,
    LayoutCheck,
    LayoutGatedKernel,
    LookupBatch,
    LookupContext,
)
from lightrec.kernels.sparse_update import adam_bias_corrections
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import ROW_RULE_OPTIMIZERS, EmbOptimType, FusedOptimizerSpec, WeightDecayMode

if TYPE_CHECKING:  # Triton is optional; the kernels import it on first use
    import triton.language as tl

__all__ = ["LAUNCH_OVERRIDES", "TritonBatchedLookup", "reduction_levels", "triton_supports"]

MAX_DIM = 2048  # widest row one program holds (BLOCK_D = next power of two of the widest dim)
_TABLE_ALIGN = 16  # table starts in the flat buffer are multiples of this many elements
# Tuning knobs read at every launch ({"forward_block_b", "backward_block_n", "backward_steps",
# "num_warps"}), for sweeps in benchmarks/bench_gpu.py and tiny tiles in tests; empty means the
# heuristics of ``_launch_config`` and ``_backward_steps``.
LAUNCH_OVERRIDES: dict[str, int] = {}


def triton_supports(
    spec: FusedOptimizerSpec | None,
    device: torch.device,
    dims: Sequence[int],
    pooling: PoolingType,
    feature_table_map: Sequence[int],
) -> str | None:
    """None when the Triton backend can serve this configuration, else the reason it cannot.

    SGD, Adagrad, row-wise Adagrad and Adam with every weight-decay mode, and every pooling, are served; the limits are the device (CUDA, or
    CPU under ``TRITON_INTERPRET=1``) and the row width (at most ``MAX_DIM``).
    """
    reason = triton_device_reason(device)
    if reason is not None:
        return reason
    if spec is not None and spec.optimizer in ROW_RULE_OPTIMIZERS:
        return f"the Triton kernels do not implement {spec.optimizer.name} (the torch backend does)"
    if max(dims) > MAX_DIM:
        return f"the Triton kernels hold rows of at most {MAX_DIM} elements, got dims {list(dims)}"
    return None


_BACKWARD_SPAN = 128  # sorted ids per backward program at most (tiles of backward_block_n ids)
_BACKWARD_MIN_PROGRAMS = 1024  # fewer ids per program while that leaves fewer programs than this


@dataclass(frozen=True)
class _LaunchConfig:
    forward_block_b: int  # bags per forward program
    backward_block_n: int  # sorted ids per backward tile
    num_warps: int


def _launch_config(block_d: int) -> _LaunchConfig:
    """Tiles of ~4k elements forward (16 KiB of fp32 rows in flight per step) and ~2k backward."""
    forward = max(1, min(64, 4096 // block_d))
    backward = max(1, min(64, 2048 // block_d))
    warps = 4 if block_d * forward >= 2048 else 2
    return _LaunchConfig(
        LAUNCH_OVERRIDES.get("forward_block_b", forward),
        LAUNCH_OVERRIDES.get("backward_block_n", backward),
        LAUNCH_OVERRIDES.get("num_warps", warps),
    )


def reduction_levels(n: int, block_n: int) -> list[tuple[int, int, int]]:
    """``(entries, tiles per program, programs)`` of each launch of the backward over ``n`` ids.

    Depends on ``n`` and the tile size only, never on the ids: a batch whose ids are all one row
    runs the same launches, each program the same number of tiles, as a batch of distinct rows.
    The last level has one program.
    """
    levels = []
    first = True
    while True:
        steps = _backward_steps(n, block_n, first)
        programs = -(-n // (block_n * steps))
        levels.append((n, steps, programs))
        if programs == 1:
            return levels
        n, first = 2 * programs, False


def _backward_steps(n: int, block_n: int, first_level: bool) -> int:
    """Tiles per backward program at one level of the reduction over ``n`` sorted entries.

    Level 1 (the gather of every id's gradient, the bulk of the work): up to ``_BACKWARD_SPAN``
    ids per program, fewer while the launch would otherwise have fewer than
    ``_BACKWARD_MIN_PROGRAMS`` programs (small batches keep the GPU busy). Later levels read only
    ``2 * D`` values per program of the level before, so they take the full span (fewest
    launches), and must cover more than their 2 pieces per program (at least 4 entries), or they
    would not shrink the problem.
    """
    most = max(1, _BACKWARD_SPAN // block_n)
    heuristic = min(most, -(-n // (block_n * _BACKWARD_MIN_PROGRAMS))) if first_level else most
    steps = LAUNCH_OVERRIDES.get("backward_steps", heuristic)
    return max(1, steps) if first_level else max(steps, -(-4 // block_n))


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class TritonBatchedLookup(LayoutGatedKernel):
    """Flat storage, Triton lookup and fused update of a group of tables (an ``EmbeddingKernel``).

    Args:
        config: as for :class:`lightrec.kernels.torch_backend.TorchBatchedLookup`.

    Raises:
        ValueError: ``triton_supports`` says the configuration cannot run here.
    """

    name: ClassVar[str] = "triton"
    checks_ids_on_device: ClassVar[bool] = True
    wants_singletons: ClassVar[bool] = False
    layout_check: ClassVar[LayoutCheck] = triton_supports

    def __init__(self, config: KernelConfig) -> None:
        super().__init__(config)
        _kernels()  # defines the kernels now (reads TRITON_INTERPRET), not at the first lookup
        rows, dims, device, dtype = config.rows, config.dims, config.device, config.dtype
        self.rows, self.dims, self.ftm = list(rows), list(dims), list(config.feature_table_map)
        self.pooling, self.spec = config.pooling, config.spec
        self.woff, self.row_start = [], []
        elements = total_rows = 0
        for r, d in zip(self.rows, self.dims, strict=True):
            elements = -(-elements // _TABLE_ALIGN) * _TABLE_ALIGN
            self.woff.append(elements)
            self.row_start.append(total_rows)
            elements += r * d
            total_rows += r
        self.total_rows = total_rows
        # Zero-filled: the padding between tables is never read, but must not hold NaNs either.
        self.weight = torch.zeros(elements, device=device, dtype=dtype)
        self.states = self._new_states(elements, total_rows, device)
        # Backward passes (Adam's t), int64 like fbgemm's ``iter``: a float32 count would stop at 2^24.
        self.step = torch.zeros((), dtype=torch.int64, device=device)
        self.error_flag: torch.Tensor | None = torch.zeros(1, dtype=torch.int32, device=device)
        feature_dims = [self.dims[t] for t in self.ftm]
        self.fixed_dim = feature_dims[0] if len(set(feature_dims)) == 1 else 0
        self.vec = math.gcd(16, *self.dims)
        self.block_d = _next_power_of_two(max(self.dims))
        self.out_width = sum(feature_dims)
        # Keys (global rows) sort faster as int32; total_rows itself marks a bad id.
        self.key_dtype = torch.int32 if total_rows < 2**31 - 1 else torch.int64
        self._meta_host = {
            "woff": ([self.woff[t] for t in self.ftm], torch.int64),
            "rows": ([self.rows[t] for t in self.ftm], torch.int64),
            "key_base": ([self.row_start[t] for t in self.ftm], torch.int64),
            "dim": (feature_dims, torch.int32),
            "col": ([sum(feature_dims[:f]) for f in range(len(self.ftm))], torch.int32),
        }
        self.meta = {k: torch.tensor(v, dtype=dt, device=device) for k, (v, dt) in self._meta_host.items()}

    def _new_states(self, elements: int, total_rows: int, device: torch.device) -> dict[str, torch.Tensor]:
        if self.spec is None:
            return {}
        shape = (total_rows,) if self.spec.optimizer == EmbOptimType.ROWWISE_ADAGRAD else (elements,)
        # Optimizer state stays float32 whatever the weights' dtype (fp16/bf16 weights keep fp32 sums).
        return {
            name: torch.zeros(shape, device=device, dtype=torch.float32) for name in self.spec.state_names
        }

    # ---- views -------------------------------------------------------------------------------

    def split_embedding_weights(self) -> list[torch.Tensor]:
        """``[rows, D]`` view of each table (aliases the flat buffer; in-place writes are visible)."""
        flat = self.weight.detach()
        return [
            flat[o : o + r * d].view(r, d) for o, r, d in zip(self.woff, self.rows, self.dims, strict=True)
        ]

    def split_optimizer_states(self) -> list[dict[str, torch.Tensor]]:
        """Per table ``{state name: view}`` shaped like the torch backend's (``[rows]`` or ``[rows, D]``)."""
        out = []
        rowwise = self.spec is not None and self.spec.optimizer == EmbOptimType.ROWWISE_ADAGRAD
        for t, (r, d) in enumerate(zip(self.rows, self.dims, strict=True)):
            if rowwise:
                st = {k: v[self.row_start[t] : self.row_start[t] + r] for k, v in self.states.items()}
            else:
                st = {k: v[self.woff[t] : self.woff[t] + r * d].view(r, d) for k, v in self.states.items()}
            if self.spec is not None and self.spec.optimizer == EmbOptimType.ADAM:
                st["step"] = self.step
            out.append(st)
        return out

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Convert the storage (``nn.Module._apply``); optimizer state and counters keep float32."""
        self.weight = fn(self.weight)
        device = self.weight.device
        self.states = {k: v.to(device) for k, v in self.states.items()}
        self.step = self.step.to(device)
        self.error_flag = self.error_flag.to(device) if self.error_flag is not None else None
        self.meta = {k: v.to(device) for k, v in self.meta.items()}

    # ---- lookup -------------------------------------------------------------------------------

    def _check_device(self) -> None:
        reason = triton_device_reason(self.weight.device)
        if reason is not None:
            raise RuntimeError(f"this Triton-backed lookup now lives on {self.weight.device}: {reason}")
        if self.weight.device.type == "cpu" and not isinstance(
            _kernels().lookup_forward_kernel, _interpreted_function_type()
        ):
            raise RuntimeError(
                "TRITON_INTERPRET=1 was set after lightrec.kernels.triton_kernels was imported, so its "
                "kernels are compiled for a GPU; set it before importing lightrec's Triton kernels"
            )

    def count_step(self) -> None:
        """A fused backward of no samples: Adam's ``step`` advances as a lookup's backward advances it."""
        if self.spec is not None and self.spec.optimizer == EmbOptimType.ADAM:
            self.step += 1

    def lookup(
        self, lookup_batch: LookupBatch, weight_inputs: Sequence[torch.Tensor], lr: Callable[[], float]
    ) -> torch.Tensor:
        """Pooled ``[B, sum D]`` (features in order) or unpooled ``[N, D]`` output; int32/int64 ids.

        ``checked``: the offsets were verified on the host before (``id_check="sync"``), so every id
        lies in exactly one bag; else malformed offsets are possible and the unpooled output is
        zero-filled first (positions in no bag are never written by the kernel).
        """
        indices, offsets, batch = lookup_batch.indices, lookup_batch.offsets, lookup_batch.batch_size
        per_sample_weights, checked = lookup_batch.per_sample_weights, lookup_batch.checked
        self._check_device()
        # The kernels index with unit strides (no-ops for the usual contiguous inputs).
        indices, offsets = indices.contiguous(), offsets.contiguous()
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.contiguous()
        training = torch.is_grad_enabled() and any(t.requires_grad for t in weight_inputs)
        if not training:  # no backward will come: skip writing the per-id keys it would need
            return self.forward(indices, offsets, per_sample_weights, batch, False, checked)[0]
        out: torch.Tensor = _TritonLookupFunction.apply(
            self, indices, offsets, per_sample_weights, batch, lr, checked, *weight_inputs
        )
        return out

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        psw: torch.Tensor | None,
        batch: int,
        write_meta: bool,
        checked: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Run the forward kernel; returns ``(output, keys [N] | None, bags [N] | None)``.

        Every bag's pooled row is written. With malformed offsets (possible unless ``checked``)
        some ids lie in no bag: their unpooled rows stay zero and their keys keep the fill value
        ``total_rows`` (the bad-id key), so the backward updates nothing for them. Their bag
        numbers stay unwritten, and are never read for such a key.
        """
        pooled = self.pooling != PoolingType.NONE
        n = indices.numel()
        device, dtype = self.weight.device, self.weight.dtype
        shape = (batch, self.out_width) if pooled else (n, self.dims[0])
        # One memset of the output, only where it can matter: unpooled and unchecked.
        out = torch.empty(shape, device=device, dtype=dtype) if pooled or checked else torch.zeros(
            shape, device=device, dtype=dtype
        )
        # 4-8 bytes per id; cheap next to the lookup, and the backward relies on it.
        keys = torch.full((n if write_meta else 0,), self.total_rows, device=device, dtype=self.key_dtype)
        bags = torch.empty(n if write_meta else 0, device=device, dtype=torch.int32)
        cfg = _launch_config(self.block_d)
        grid = (-(-batch // cfg.forward_block_b), len(self.ftm))
        with _on_device(device):
            _kernels().lookup_forward_kernel[grid](
                self.weight, indices, offsets, psw if psw is not None else self.weight, out,
                self.meta["woff"], self.meta["rows"], self.meta["key_base"], self.meta["dim"], self.meta["col"],
                keys, bags, self.error_flag,
                batch, n, out.stride(0), self.total_rows,
                FIXED_D=self.fixed_dim, VEC=self.vec, BLOCK_B=cfg.forward_block_b, BLOCK_D=self.block_d,
                POOLED=pooled, MEAN=self.pooling == PoolingType.MEAN, HAS_WEIGHTS=psw is not None,
                WRITE_META=write_meta, ACC=_acc_dtype(dtype), num_warps=cfg.num_warps,
            )  # fmt: skip
        return out, (keys if write_meta else None), (bags if write_meta else None)

    def backward(
        self,
        grad_out: torch.Tensor,
        keys: torch.Tensor,
        bags: torch.Tensor,
        offsets: torch.Tensor,
        psw: torch.Tensor | None,
        batch: int,
        lr: float,
    ) -> torch.Tensor | None:
        """Fused update in place (returns None), or the dense ``[E]`` gradient when ``spec is None``."""
        k = _kernels()
        spec = self.spec
        dense = torch.zeros_like(self.weight) if spec is None else None
        if spec is not None and spec.optimizer == EmbOptimType.ADAM:
            self.step += 1
            adam_bias = adam_bias_corrections(self.step, spec.beta1, spec.beta2)
        else:
            adam_bias = self.step  # not read
        n = keys.numel()
        if n == 0:
            return dense
        sorted_keys, order = torch.sort(keys, stable=True)  # a fixed summation order: reproducible
        opt = (
            k.OPT_DENSE_GRAD
            if spec is None
            else {
                EmbOptimType.SGD: k.OPT_SGD,
                EmbOptimType.ADAGRAD: k.OPT_ADAGRAD,
                EmbOptimType.ROWWISE_ADAGRAD: k.OPT_ROWWISE_ADAGRAD,
                EmbOptimType.ADAM: k.OPT_ADAM,
            }[spec.optimizer]
        )
        mode = WeightDecayMode.NONE if spec is None else spec.weight_decay_mode
        wd_mode = {
            WeightDecayMode.NONE: k.WD_NONE,
            WeightDecayMode.L2: k.WD_L2,
            WeightDecayMode.DECOUPLED: k.WD_DECOUPLED,
        }
        wd = spec.weight_decay if spec is not None else 0.0
        beta1 = spec.beta1 if spec is not None else 0.0
        beta2 = spec.beta2 if spec is not None else 0.0
        state1 = self.states.get("momentum1", self.weight)
        state2 = self.states.get("momentum2", self.weight)
        cfg = _launch_config(self.block_d)
        acc = _acc_dtype(self.weight.dtype)
        width = max(self.dims)  # row width of the pieces' partial sums
        sum_dtype = torch.float64 if self.weight.dtype == torch.float64 else torch.float32
        # Level 1 reads the sorted ids; each further level reads the pieces of the one before.
        level_keys, pieces = sorted_keys, (self.weight, self.weight, self.weight)
        for level, (entries, steps, programs) in enumerate(reduction_levels(n, cfg.backward_block_n)):
            out_keys = torch.empty(2 * programs, device=self.weight.device, dtype=self.key_dtype)
            out = (
                torch.empty(2 * programs, device=self.weight.device, dtype=torch.int32),
                torch.empty(2 * programs, device=self.weight.device, dtype=torch.int8),
                torch.empty((2 * programs, width), device=self.weight.device, dtype=sum_dtype),
            )
            with _on_device(self.weight.device):
                k.lookup_backward_kernel[(programs,)](
                    level_keys, order, bags, offsets, psw if psw is not None else self.weight, grad_out,
                    *pieces, out_keys, *out,
                    self.weight, state1, state2, dense if dense is not None else self.weight,
                    self.meta["woff"], self.meta["key_base"], self.meta["dim"], self.meta["col"], adam_bias,
                    entries, batch, grad_out.stride(0), self.total_rows, steps, width,
                    lr, spec.eps if spec is not None else 0.0, wd, 1.0 - lr * wd, beta1, 1.0 - beta1, beta2, 1.0 - beta2,
                    OPT=opt.value, WD_MODE=wd_mode[mode].value, FIXED_D=self.fixed_dim, VEC=self.vec,
                    BLOCK_N=cfg.backward_block_n, BLOCK_D=self.block_d, POOLED=self.pooling != PoolingType.NONE,
                    MEAN=self.pooling == PoolingType.MEAN, HAS_WEIGHTS=psw is not None, GATHER=level == 0,
                    ACC=acc, num_warps=cfg.num_warps,
                )  # fmt: skip
            level_keys, pieces = out_keys, out
        return dense


# What :class:`_TritonLookupFunction`'s forward leaves for its backward; ``saved``: keys, bags, offsets, psw.
_TritonLookupContext = LookupContext[
    TritonBatchedLookup, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]
]


class _TritonLookupFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: _TritonLookupContext,
        backend: TritonBatchedLookup,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        psw: torch.Tensor | None,
        batch: int,
        lr: Callable[[], float],
        checked: bool,
        *weight_inputs: torch.Tensor,
    ) -> torch.Tensor:
        out, keys, bags = backend.forward(indices, offsets, psw, batch, True, checked)
        assert keys is not None and bags is not None  # write_meta=True always returns them
        ctx.backend, ctx.batch, ctx.lr = backend, batch, lr
        ctx.num_weight_inputs = len(weight_inputs)
        ctx.saved = (keys, bags, offsets, psw)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: _TritonLookupContext, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        backend: TritonBatchedLookup = ctx.backend
        keys, bags, offsets, psw = ctx.saved
        fused = backend.spec is not None
        lr = float(ctx.lr()) if fused else 0.0
        # The kernels take any row stride (a column slice of a wider gradient, as a lookup group's
        # share of a concatenated output is, is read in place); only the elements of a row must
        # be adjacent.
        grad = grad_out if grad_out.dim() == 2 and grad_out.stride(1) == 1 else grad_out.contiguous()
        dense = backend.backward(grad, keys, bags, offsets, psw, ctx.batch, lr)
        grads: list[torch.Tensor | None] = [None] * ctx.num_weight_inputs
        if dense is not None:  # non-fused: per-table views of the dense gradient, as parameters' grads
            for t, (o, r, d) in enumerate(zip(backend.woff, backend.rows, backend.dims, strict=True)):
                grads[t] = dense[o : o + r * d].view(r, d)
        return (None, None, None, None, None, None, None, *grads)


def _kernels() -> types.ModuleType:
    """``lightrec.kernels.triton_kernels``, imported on first use (not kept on objects: a module
    object cannot be deep-copied or pickled, and modules holding a backend are)."""
    from lightrec.kernels import triton_kernels

    return triton_kernels


def _acc_dtype(dtype: torch.dtype) -> tl.dtype:
    """Arithmetic type of the kernels: float64 for float64 storage, float32 otherwise."""
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def _interpreted_function_type() -> type:
    from triton.runtime.interpreter import InterpretedFunction

    function_type: type = InterpretedFunction
    return function_type


class _on_device:
    """``torch.cuda.device(d)`` for CUDA tensors (Triton launches on the current device); no-op on CPU."""

    def __init__(self, device: torch.device) -> None:
        self._ctx = torch.cuda.device(device) if device.type == "cuda" else None

    def __enter__(self) -> None:
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
