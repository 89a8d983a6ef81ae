"""Row-sparse optimizer updates: the arithmetic of the fused optimizers of the torch backend.

Every function here receives the rows touched by one batch *after* de-duplication (``rows`` is
unique; ``grad[i]`` is the sum of all gradient contributions to ``rows[i]``), mirroring fbgemm's
"exact" optimizers: a row seen k times in a batch gets ONE update with its summed gradient, never
k sequential updates. Untouched rows, their optimizer state and their weight decay are left alone.
See ``lightrec.optim.fused_spec`` for the formulas.
"""

from __future__ import annotations

import torch

from lightrec.optim.fused_spec import ROW_RULE_OPTIMIZERS, EmbOptimType, FusedOptimizerSpec, WeightDecayMode
from lightrec.optim.row_rules import lars_rows, moment_rows

__all__ = ["accumulate_rows", "adam_bias_corrections", "apply_sparse_update", "compute_dtype", "needs_dedup"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the fused update computes in, and the torch kernel keeps optimizer state in, for
    tables of ``dtype``: float32 for float16 / bfloat16 tables (as fbgemm and the Triton kernel do),
    else ``dtype`` itself.

    In float16 a small gradient's square underflows to 0 and ``eps=1e-8`` rounds to 0, so an
    Adagrad / Adam row would be divided by 0 (``inf`` weights after one step); a bfloat16 sum of
    squares stops growing once it is 2^8 times the new term.
    """
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def needs_dedup(spec: FusedOptimizerSpec) -> bool:
    """False only for plain SGD, where ``w[ids] -= lr * g`` with duplicates summed is already exact."""
    return not (spec.optimizer == EmbOptimType.SGD and spec.weight_decay_mode == WeightDecayMode.NONE)


def accumulate_rows(ids: torch.Tensor, contrib: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the gradient contributions of duplicate ids.

    Args:
        ids: ``[N]`` row ids (storage rows, possibly repeated).
        contrib: ``[N, D]`` gradient contribution of each occurrence.

    Returns:
        ``(rows [U], grad [U, D])`` with ``rows`` sorted and unique.
    """
    rows, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    grad = torch.zeros(rows.numel(), contrib.shape[1], dtype=contrib.dtype, device=contrib.device)
    grad.index_add_(0, inverse, contrib)
    return rows, grad


def adam_bias_corrections(step: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
    """``[1 - beta1**t, 1 - beta2**t]`` (float64, on ``step``'s device) for the step count ``t``.

    Computed on the device from the step tensor, so no host read of ``t`` is needed (a ``.item()``
    would stall a CUDA stream once per backward); cast to the weights' dtype it equals the host's
    ``1.0 - beta1**t`` in Python.
    """
    t = step.detach().to(torch.float64)
    return torch.stack([1.0 - beta1**t, 1.0 - beta2**t])


@torch.no_grad()
def apply_sparse_update(
    spec: FusedOptimizerSpec,
    lr: float,
    step: int | torch.Tensor,
    weight: torch.Tensor,
    states: dict[str, torch.Tensor],
    ids: torch.Tensor,
    contrib: torch.Tensor,
) -> None:
    """Update ``weight`` (and ``states``) in place for the rows named in ``ids``.

    float16 / bfloat16 rows are updated in float32 (:func:`compute_dtype`) and rounded once when
    written back; states are written back in their own dtype.

    Args:
        spec: optimizer kind and hyper-parameters (``lr`` overrides ``spec.learning_rate``).
        lr: current learning rate (a scheduler may have changed it).
        step: 1-based count of updates of this module so far (Adam bias correction); a tensor is
            read on its device (no host sync).
        weight: ``[R, D]`` storage rows.
        states: ``{"momentum1": [R] or [R, D], "momentum2": [R, D]}`` aligned with ``weight``.
        ids: ``[N]`` storage rows, possibly repeated.
        contrib: ``[N, D]`` gradient of each occurrence.
    """
    if not needs_dedup(spec):
        # index_add_ with alpha= takes a much slower path on CPU (measured 2.5x); scale first.
        weight.index_add_(0, ids, contrib * -lr)
        return
    compute = compute_dtype(weight.dtype)
    rows, grad = accumulate_rows(ids, contrib.to(compute))
    w = weight.index_select(0, rows).to(compute)
    # Every rule reads and replaces the touched rows of its states and of the weight: gathered
    # once here, written back once at the end.
    touched = {name: state.index_select(0, rows).to(compute) for name, state in states.items()}
    kind = spec.optimizer
    if kind in ROW_RULE_OPTIMIZERS:
        new = _row_rule(spec, lr, step, w, grad, touched)
    else:
        wd = spec.weight_decay
        if spec.weight_decay_mode == WeightDecayMode.L2:
            grad = grad + wd * w
        if kind == EmbOptimType.SGD:
            update = lr * grad
        elif kind == EmbOptimType.ADAGRAD:
            s = touched["momentum1"] + grad * grad
            touched["momentum1"] = s
            update = lr * grad / (s.sqrt() + spec.eps)
        elif kind == EmbOptimType.ROWWISE_ADAGRAD:
            m = touched["momentum1"] + grad.square().mean(dim=1)
            touched["momentum1"] = m
            update = (lr / (m.sqrt() + spec.eps)).unsqueeze(1) * grad
        elif kind == EmbOptimType.ADAM:
            m1 = touched["momentum1"].mul_(spec.beta1).add_(grad, alpha=1.0 - spec.beta1)
            m2 = touched["momentum2"].mul_(spec.beta2).addcmul_(grad, grad, value=1.0 - spec.beta2)
            if isinstance(step, torch.Tensor):
                bias = adam_bias_corrections(step, spec.beta1, spec.beta2).to(m1.device)
                bias1, bias2 = bias[0].to(m1.dtype), bias[1].to(m1.dtype)
            else:
                bias1, bias2 = 1.0 - spec.beta1**step, 1.0 - spec.beta2**step  # type: ignore[assignment]
            update = lr * (m1 / bias1) / ((m2 / bias2).sqrt() + spec.eps)
        else:  # EmbOptimType is closed; a new member must be taught here.
            raise ValueError(f"no sparse update rule for optimizer {kind}")
        if spec.weight_decay_mode == WeightDecayMode.DECOUPLED:
            w = w * (1.0 - lr * wd)
        new = w - update
    for name, values in touched.items():
        states[name].index_copy_(0, rows, values.to(states[name].dtype))
    weight.index_copy_(0, rows, new.to(weight.dtype))


def _row_rule(
    spec: FusedOptimizerSpec,
    lr: float,
    step: int | torch.Tensor,
    w: torch.Tensor,
    grad: torch.Tensor,
    touched: dict[str, torch.Tensor],
) -> torch.Tensor:
    """LAMB / LARS_SGD / partial row-wise rules: the new ``w`` rows (``touched`` states updated in place)."""
    if spec.optimizer == EmbOptimType.LARS_SGD:
        return lars_rows(w, grad, touched["momentum1"], lr, spec.eta, spec.momentum, spec.weight_decay)
    layerwise = spec.optimizer != EmbOptimType.PARTIAL_ROWWISE_ADAM
    return moment_rows(w, grad, touched["momentum1"], touched["momentum2"], lr, spec.beta1, spec.beta2, spec.eps,
                       spec.weight_decay, step, layerwise)  # fmt: skip
