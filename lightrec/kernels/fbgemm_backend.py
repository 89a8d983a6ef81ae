"""fbgemm table-batched embedding (TBE) behind the same small interface as the torch backend.

``SplitTableBatchedEmbeddingBagsCodegen`` stores every table of the group in one buffer, looks all
features up in one kernel and applies the optimizer inside its backward. On CPU the tables live in
host memory (``EmbeddingLocation.HOST`` + ``ComputeDevice.CPU``); on CUDA in device memory.

What fbgemm 1.8 can do (anything else makes ``kernel_backend="auto"`` pick another kernel):

=========  =================================================  ===================================
device     optimizers                                         weight decay
=========  =================================================  ===================================
CPU        SGD, ADAGRAD, ROWWISE_ADAGRAD (*)                  none (the CPU kernel ignores it)
CUDA       SGD, ADAGRAD, ROWWISE_ADAGRAD, ADAM, LAMB,         ROWWISE_ADAGRAD; ADAM decoupled;
           LARS_SGD, PARTIAL_ROWWISE_ADAM / _LAMB             the row-rule ones their own
=========  =================================================  ===================================

(fbgemm's LAMB / LARS trust ratios have no guard for zero norms: where a row's norm is 0 its update
differs from the torch backend's, which follows the standard guard, see ``lightrec.optim.row_rules``.)

(*) ADAGRAD / ROWWISE_ADAGRAD not when several features share one table (fbgemm 1.8's CPU
kernels update such a table per feature, not once per batch); ROWWISE_ADAGRAD not when the
features read their tables out of table order (``feature_table_map`` [1, 0]: its CPU backward fails).

No fused optimizer (plain autograd gradients) needs fbgemm's ``OptimType.NONE``, which is
CUDA-only, so non-fused lookups always use the torch backend. Embedding dims must be multiples of 4.
This module imports ``fbgemm_gpu`` only when a backend object is built; callers check
:func:`fbgemm_supports` (which consults ``lightrec._fbgemm``) first.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import torch

from lightrec._fbgemm import fbgemm_available, fbgemm_serves_cuda, fbgemm_unavailable_reason
from lightrec._host_memory import empty_host_tensor
from lightrec.kernels.kernel_interface import (
    KernelConfig,
    LayoutCheck,
    LayoutGatedKernel,
    LookupBatch,
)
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import ROW_RULE_OPTIMIZERS, EmbOptimType, FusedOptimizerSpec, WeightDecayMode

if TYPE_CHECKING:  # fbgemm is optional; the kernel imports it on construction
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation

__all__ = ["FbgemmBatchedLookup", "fbgemm_supports"]

_log = logging.getLogger(__name__)


def fbgemm_supports(
    spec: FusedOptimizerSpec | None,
    device: torch.device,
    dims: Sequence[int],
    pooling: PoolingType,
    feature_table_map: Sequence[int],
) -> str | None:
    """None when the fbgemm backend can serve this configuration, else the reason it cannot."""
    if not fbgemm_available():
        return f"fbgemm is unavailable ({fbgemm_unavailable_reason()})"
    if spec is None:
        return "non-fused lookups (optimizer=None) need fbgemm's CUDA-only OptimType.NONE"
    if device.type not in ("cpu", "cuda"):
        return f"fbgemm serves cpu and cuda devices, not {device.type}"
    if device.type == "cuda" and not fbgemm_serves_cuda():
        return "the installed fbgemm is the CPU build (fbgemm-gpu-cpu): it has no CUDA kernels"
    if any(d % 4 for d in dims):
        return f"fbgemm needs embedding dims that are multiples of 4, got {list(dims)}"
    kind, mode = spec.optimizer, spec.weight_decay_mode
    if kind in ROW_RULE_OPTIMIZERS:
        if device.type != "cuda":
            return f"fbgemm has no CPU kernel for {kind.name}"
    elif kind == EmbOptimType.ADAM:
        if device.type != "cuda":
            return "fbgemm has no CPU kernel for ADAM"
        if mode == WeightDecayMode.L2:
            return "fbgemm's ADAM only has decoupled weight decay"
    elif kind in (EmbOptimType.SGD, EmbOptimType.ADAGRAD) and mode != WeightDecayMode.NONE:
        return f"fbgemm's {kind.name} has no weight decay"
    elif mode != WeightDecayMode.NONE and device.type == "cpu":
        # Measured on fbgemm-gpu-cpu 1.8.0: the CPU row-wise Adagrad kernel silently ignores
        # weight_decay in both L2 and DECOUPLE modes.
        return f"fbgemm's CPU {kind.name} ignores weight decay"
    shared = len(set(feature_table_map)) != len(feature_table_map)
    if kind != EmbOptimType.SGD and device.type == "cpu" and shared:
        # fbgemm 1.8's CPU backward handles a table read by several features feature by feature:
        # row-wise Adagrad fails ("num of rows processed by adagrad ... does not match c_block
        # size") and Adagrad updates a row once per feature instead of once with the summed
        # gradient (tests/kernels compare against the exact rule). SGD is linear, so it is exact.
        return f"fbgemm's CPU {kind.name} is not exact for tables shared by several features"
    in_table_order = list(feature_table_map) == sorted(feature_table_map)
    if kind == EmbOptimType.ROWWISE_ADAGRAD and device.type == "cpu" and not in_table_order:
        # Measured on fbgemm-gpu-cpu 1.8.0: with features out of table order (feature_table_map
        # [1, 0]) the CPU row-wise Adagrad backward fails ("num of rows processed by adagrad: 0
        # does not match c_block size"); SGD and Adagrad are exact in any order.
        return f"fbgemm's CPU {kind.name} needs features in table order (feature_table_map non-decreasing)"
    return None


# The optimizers whose CPU host storage lightrec allocates for fbgemm, and the elements of momentum1 per
# table row (None: no momentum1); weights are rows x dim. fbgemm 1.8's own sizing (fp32, no padding on CPU).
_MOMENTUM1_PER_ROW = {"EXACT_SGD": None, "EXACT_ADAGRAD": "dim", "EXACT_ROWWISE_ADAGRAD": "one"}


def _huge_page_host_buffers(
    tbe_class: type, optimizer: str, rows: Sequence[int], dims: Sequence[int]
) -> dict[str, torch.Tensor] | None:
    """Zeroed huge-page buffers (``lightrec._host_memory``) for a CPU TBE's ``weights_host`` and
    optimizer state, passed to fbgemm as ``preallocated_host_buffers``: fbgemm would allocate them
    with plain ``torch.zeros`` (4 KiB pages), and its lookups and fused update read rows at random.
    Allocated here rather than moved afterwards, so the tables are never held twice. None where
    fbgemm takes no such argument or the optimizer's state layout is not one of
    ``_MOMENTUM1_PER_ROW``."""
    if optimizer not in _MOMENTUM1_PER_ROW or "preallocated_host_buffers" not in inspect.signature(tbe_class).parameters:
        return None
    weights = sum(r * d for r, d in zip(rows, dims, strict=True))
    sizes = {"weights": weights}
    per_row = _MOMENTUM1_PER_ROW[optimizer]
    if per_row is not None:
        sizes["momentum1"] = weights if per_row == "dim" else sum(rows)
    return {name: empty_host_tensor((n,), torch.float32) for name, n in sizes.items()}


class FbgemmBatchedLookup(LayoutGatedKernel):
    """A configured ``SplitTableBatchedEmbeddingBagsCodegen`` plus the views lightrec needs (an
    ``EmbeddingKernel``).

    Args:
        config: as for :class:`lightrec.kernels.torch_backend.TorchBatchedLookup` (``spec`` is
            required: see :func:`fbgemm_supports`).

    Raises:
        ValueError: ``fbgemm_supports`` says the configuration cannot run here.
    """

    name: ClassVar[str] = "fbgemm"
    checks_ids_on_device: ClassVar[bool] = False
    wants_singletons: ClassVar[bool] = False
    layout_check: ClassVar[LayoutCheck] = fbgemm_supports

    def __init__(self, config: KernelConfig) -> None:
        super().__init__(config)
        spec, device, pooling = config.spec, config.device, config.pooling
        assert spec is not None  # fbgemm_supports refuses a lookup without a fused optimizer
        rows, dims, feature_table_map = config.rows, config.dims, config.feature_table_map
        table_names = list(config.table_names) or [f"t{i}" for i in range(len(rows))]
        from fbgemm_gpu.split_embedding_configs import EmbOptimType as FbgemmOptim
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            BoundsCheckMode,
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            WeightDecayMode as FbgemmWeightDecay,
        )

        on_cuda = device.type == "cuda"
        location = self._location(EmbeddingLocation, on_cuda)
        compute = ComputeDevice.CUDA if on_cuda else ComputeDevice.CPU
        optim = {
            EmbOptimType.SGD: FbgemmOptim.EXACT_SGD,
            EmbOptimType.ADAGRAD: FbgemmOptim.EXACT_ADAGRAD,
            EmbOptimType.ROWWISE_ADAGRAD: FbgemmOptim.EXACT_ROWWISE_ADAGRAD,
            EmbOptimType.ADAM: FbgemmOptim.ADAM,
            EmbOptimType.LAMB: FbgemmOptim.LAMB,
            EmbOptimType.LARS_SGD: FbgemmOptim.LARS_SGD,
            EmbOptimType.PARTIAL_ROWWISE_ADAM: FbgemmOptim.PARTIAL_ROWWISE_ADAM,
            EmbOptimType.PARTIAL_ROWWISE_LAMB: FbgemmOptim.PARTIAL_ROWWISE_LAMB,
        }[spec.optimizer]
        wd_mode = {
            WeightDecayMode.NONE: FbgemmWeightDecay.NONE,
            WeightDecayMode.L2: FbgemmWeightDecay.L2,
            WeightDecayMode.DECOUPLED: FbgemmWeightDecay.DECOUPLE,
        }[spec.weight_decay_mode]
        self.spec: FusedOptimizerSpec | None = spec  # never None here (fbgemm_supports); the interface allows it
        self._fused = spec
        self.pooling = pooling
        self._feature_table_map = list(feature_table_map)
        tbe_args: dict[str, object] = dict(
            feature_table_map=list(feature_table_map),
            optimizer=optim,
            learning_rate=spec.learning_rate,
            eps=spec.eps,
            weight_decay=spec.weight_decay,
            weight_decay_mode=wd_mode,
            beta1=spec.beta1,
            beta2=spec.beta2,
            eta=spec.eta,
            momentum=spec.momentum,
            # MEAN runs as SUM with per-id weights 1/len(bag): fbgemm 1.8's CPU backward of weighted
            # MEAN forgets the 1/len factor its forward applies (measured), this way both agree.
            pooling_mode=PoolingMode.NONE if pooling == PoolingType.NONE else PoolingMode.SUM,
            device=device,
            # BatchedEmbeddingBag validates offsets and ids before every call (with table names in
            # the message), so fbgemm's own pass (FATAL says only "Expected idx < num_rows") would
            # only repeat it: measured 2.6 ms of a 30 ms step at 26x2048 ids.
            bounds_check_mode=BoundsCheckMode.NONE,
            table_names=list(table_names),
            **self._storage_options(config),
        )
        specs = [(r, d, location, compute) for r, d in zip(rows, dims, strict=True)]
        buffers = None
        if location == EmbeddingLocation.HOST and not on_cuda:
            buffers = _huge_page_host_buffers(SplitTableBatchedEmbeddingBagsCodegen, optim.name, rows, dims)
        if buffers is None:
            self.tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, **tbe_args)
        else:
            try:
                self.tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, preallocated_host_buffers=buffers, **tbe_args)
            except AssertionError as exc:  # fbgemm sized its storage otherwise: let it allocate its own
                _log.debug("fbgemm refused lightrec's huge-page host buffers (%s); using its own", exc)
                del buffers
                self.tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, **tbe_args)
        self._lr = spec.learning_rate

    def _location(self, locations: type[EmbeddingLocation], on_cuda: bool) -> EmbeddingLocation:
        """fbgemm's ``EmbeddingLocation`` of the tables: device memory on CUDA, host memory on CPU."""
        return locations.DEVICE if on_cuda else locations.HOST

    def _storage_options(self, config: KernelConfig) -> dict[str, object]:
        """Extra ``SplitTableBatchedEmbeddingBagsCodegen`` arguments of the storage (a cache's)."""
        return {}

    def split_embedding_weights(self) -> list[torch.Tensor]:
        return [w.detach() for w in self.tbe.split_embedding_weights()]

    def split_optimizer_states(self) -> list[dict[str, torch.Tensor]]:
        names = self._fused.state_names
        if not names:
            return [{} for _ in self.tbe.embedding_specs]
        out = []
        for states in self.tbe.split_optimizer_states():
            st = dict(zip(names, states, strict=True))
            if self._fused.uses_step:
                st["step"] = self.tbe.iter
            out.append(st)
        return out

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Allow only no-op conversions: TBE storage is laid out for one device at construction."""
        for w in self.tbe.split_embedding_weights():
            if fn(w) is not w:
                raise RuntimeError(
                    "an fbgemm-backed embedding lookup cannot change device or dtype after construction; "
                    "build it with device=... (or pass kernel_backend='torch', which can be moved)"
                )

    def count_step(self) -> None:
        """A fused backward of no samples: the TBE's ``iter`` advances as its training forward does."""
        if self._fused.uses_step:
            self.tbe.iter.add_(1)  # what checkpoints save
            # the host copy fbgemm computes with; while it is 0 fbgemm copies ``iter`` into it first
            if int(self.tbe.iter_cpu.item()) != 0:
                self.tbe.iter_cpu.add_(1)

    def lookup(
        self, lookup_batch: LookupBatch, weight_inputs: Sequence[torch.Tensor], lr: Callable[[], float]
    ) -> torch.Tensor:
        """Pooled ``[B, sum D]`` or unpooled ``[N, D]`` output; fbgemm's backward is the fused update."""
        indices, offsets = lookup_batch.indices.long(), lookup_batch.offsets.long()
        per_sample_weights, batch = lookup_batch.per_sample_weights, lookup_batch.batch_size
        current = float(lr())
        if current != self._lr:  # a scheduler moved the learning rate since the last call
            self.tbe.set_learning_rate(current)
            self._lr = current
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.float()
        if self.pooling == PoolingType.MEAN:
            lengths = offsets[1:] - offsets[:-1]
            inv = 1.0 / lengths.clamp(min=1).float()
            mean_weights = torch.repeat_interleave(inv, lengths, output_size=indices.numel())
            per_sample_weights = (
                mean_weights if per_sample_weights is None else per_sample_weights * mean_weights
            )
        if torch.is_inference_mode_enabled():
            # fbgemm's fused training ops have no inference-mode kernel (Lightning validates and
            # tests under torch.inference_mode); read the same storage with plain torch instead.
            return self._lookup_without_autograd(indices, offsets, per_sample_weights, batch)
        out: torch.Tensor = self.tbe(indices, offsets, per_sample_weights)
        return out

    def _lookup_without_autograd(
        self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None, batch: int
    ) -> torch.Tensor:
        """The forward of ``self.tbe`` in plain torch: ``[B, sum D]`` pooled, or ``[N, D]`` unpooled."""
        tables = self.tbe.split_embedding_weights()
        outs = []
        for f, t in enumerate(self._feature_table_map):
            bounds = offsets[f * batch : (f + 1) * batch + 1]
            start, end = int(bounds[0]), int(bounds[-1])
            ids = indices[start:end]
            if self.pooling == PoolingType.NONE:
                outs.append(torch.nn.functional.embedding(ids, tables[t]))
                continue
            psw = per_sample_weights[start:end] if per_sample_weights is not None else None
            outs.append(
                torch.nn.functional.embedding_bag(
                    ids, tables[t], bounds - start, mode="sum", per_sample_weights=psw, include_last_offset=True
                )
            )
        return torch.cat(outs, dim=0 if self.pooling == PoolingType.NONE else 1)
