"""The torch kernel's fused update on CPU as one native pass (``lightrec/csrc/cpu_fused_update.cpp``).

The stock-op update (``sparse_update.apply_sparse_update``) sorts the ids (``torch.unique``),
gathers an ``[N, D]`` contribution tensor, sums it with ``index_add_`` into a fresh ``[U, D]``
buffer and then makes four or five more passes over ``[U, D]`` for the optimizer arithmetic. The
native pass does the same arithmetic, operation by operation, in one sweep:

1. de-duplicate the ids -- O(N), no sort -- with a small open-addressing table of the call's ids
   (``2N``-``4N`` slots of 16 bytes, kept per thread) where that is smaller than a persistent
   ``[rows]`` int32 scratch (the unique index of each row, ``-1`` elsewhere; reset row by row after
   use, so it never needs clearing), and with the scratch otherwise: the table stays in cache where
   the scratch's entries are DRAM misses (53k ids of 26 x 100k rows: 2 MiB against 10 MiB, the
   update 4.8 -> 3.5 ms on one thread);
2. for each unique row, sum its contributions straight out of the output gradient (the bag of
   each id and its per-id factor are arguments: no ``[N, D]`` gather), in input order;
3. update the row and its optimizer state once, prefetching the rows a few steps ahead (the reads
   are random); rows are split over torch's intra-op threads (``torch.set_num_threads``).

``LIGHTREC_CPU_UPDATE_NATIVE=0`` forces the stock-op update (for comparisons); without the native
library (``lightrec._native``) that is what runs, with the same results.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lightrec import _switches
from lightrec._native import native_ops, native_unavailable_reason
from lightrec.kernels.sparse_update import adam_bias_corrections
from lightrec.optim.fused_spec import EmbOptimType, FusedOptimizerSpec, WeightDecayMode

__all__ = ["DEDUPE_MODES", "NATIVE_OPTIMIZERS", "native_update_available", "native_fused_update", "new_scratch"]

_OPTIMIZER_CODE = {
    EmbOptimType.SGD: 0,
    EmbOptimType.ADAGRAD: 1,
    EmbOptimType.ROWWISE_ADAGRAD: 2,
    EmbOptimType.ADAM: 3,
}
#: The optimizers the native pass implements; the others (LAMB, LARS, partial row-wise) keep the
#: stock-op update of ``sparse_update.py``.
NATIVE_OPTIMIZERS = frozenset(_OPTIMIZER_CODE)
_DECAY_CODE = {WeightDecayMode.NONE: 0, WeightDecayMode.L2: 1, WeightDecayMode.DECOUPLED: 2}
#: How the native pass de-duplicates ids: ``"auto"`` (the table where it is no larger than the
#: scratch), or always the ``"scratch"`` or the ``"table"`` (for tests and comparisons).
DEDUPE_MODES = {"auto": 0, "scratch": 1, "table": 2}


def native_update_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the native update serves tables of ``dtype`` on ``device`` in this process."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.float64):
        return False
    if not _switches.CPU_UPDATE_NATIVE.read():
        return False
    ops = native_ops()
    return ops is not None and ops.fused_update


def new_scratch(rows: int) -> torch.Tensor:
    """The ``[rows]`` int32 de-duplication scratch of one storage tensor (all ``-1``)."""
    return torch.full((rows,), -1, dtype=torch.int32)


@torch.no_grad()
def native_fused_update(
    spec: FusedOptimizerSpec,
    lr: float,
    step: torch.Tensor,
    weight: torch.Tensor,
    states: dict[str, torch.Tensor],
    scratch: torch.Tensor,
    ids: torch.Tensor,
    grad: torch.Tensor | None,
    bag_of_id: torch.Tensor | None,
    scale: torch.Tensor | None,
    dedupe: str = "auto",
    grad_parts: Sequence[tuple[int, torch.Tensor]] | None = None,
) -> None:
    """Apply ``spec``'s update to the rows ``ids`` of ``weight`` (and ``states``) in place.

    Args:
        spec: optimizer and hyper-parameters; ``lr`` is the current learning rate.
        step: Adam's 1-based update count (a 0-d tensor).
        weight: ``[R, D]`` storage (unit column stride).
        states: ``{"momentum1": [R] | [R, D], "momentum2": [R, D]}`` as ``spec`` needs.
        scratch: ``[R]`` int32, all ``-1`` (:func:`new_scratch`; left so afterwards).
        ids: ``[N]`` storage rows, repeats allowed.
        grad: ``[A, C, D]`` bag gradients, any strides with unit last stride: bag ``k`` is
            ``grad[k // C, k % C]`` (None with ``grad_parts``).
        bag_of_id: ``[N]`` int64 bag of each id, or None when id ``i`` is bag ``i``.
        scale: ``[N]`` factor of each id's contribution (MEAN's ``1/len``, per-sample weights), or None.
        dedupe: one of :data:`DEDUPE_MODES` (the result is the same; only the speed differs).
        grad_parts: instead of ``grad`` (one id per bag, ``bag_of_id`` None): ``(first id, [n_k, D])``
            blocks of id gradients, unit column stride, back to back from id 0 -- the rows read where
            they are (a sharded lookup's own rows and its peers' shared-memory chunks), not gathered.

    The gradient of row ``r`` is ``sum_i scale[i] * grad[bag_of_id[i]]`` over the ids ``i`` equal
    to ``r``, summed in input order; each touched row is then updated once, as
    ``sparse_update.apply_sparse_update`` does.
    """
    if dedupe not in DEDUPE_MODES:
        raise ValueError(f"native_fused_update: dedupe={dedupe!r} is not one of {sorted(DEDUPE_MODES)}")
    if ids.numel() == 0:
        return
    if native_ops() is None:
        raise RuntimeError(
            f"the native CPU update is unavailable ({native_unavailable_reason()}); check native_update_available() first"
        )
    bias1 = bias2 = 1.0
    if spec.optimizer == EmbOptimType.ADAM:
        bias = adam_bias_corrections(step, spec.beta1, spec.beta2).to(weight.dtype)
        bias1, bias2 = float(bias[0]), float(bias[1])
    dtype = weight.dtype
    parts = [p if p.dtype == dtype else p.to(dtype) for _, p in grad_parts] if grad_parts else []
    if parts:
        grad = weight.new_empty(1, 0, weight.shape[1])  # unread: the parts hold the rows
    elif grad is None:
        raise ValueError("native_fused_update: pass grad, or grad_parts with one id per bag")
    torch.ops.lightrec_cpu.cpu_fused_update(
        weight,
        states.get("momentum1"),
        states.get("momentum2"),
        scratch,
        ids.to(torch.int64).contiguous(),
        grad if grad.dtype == dtype else grad.to(dtype),
        None if bag_of_id is None else bag_of_id.to(torch.int64).contiguous(),
        None if scale is None else scale.to(dtype).contiguous(),
        _OPTIMIZER_CODE[spec.optimizer],
        float(lr),
        float(spec.eps),
        float(spec.beta1),
        float(spec.beta2),
        float(spec.weight_decay),
        _DECAY_CODE[spec.weight_decay_mode],
        bias1,
        bias2,
        DEDUPE_MODES[dedupe],
        parts,
        [start for start, _ in grad_parts] if grad_parts else [],
    )
