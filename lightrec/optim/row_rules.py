"""Row-wise update rules of LAMB, partial row-wise LAMB / Adam and LARS-SGD (fbgemm's formulas).

One implementation serves both forms of each optimizer: the dense ``torch.optim.Optimizer`` s of
:mod:`lightrec.optim.rowwise_optimizers` (every row of a parameter) and the fused embedding
update of :mod:`lightrec.kernels.sparse_update` (the rows a batch touched). Every function takes
``[N, D]`` rows and returns the new rows; state tensors are updated in place. ``t`` is the 1-based
step count (a tensor is read on its device, no host sync). With ``g`` the gradient of a row::

    LAMB                 m1 = b1 m1 + (1-b1) g          m2 = b2 m2 + (1-b2) g^2          ([N, D] each)
                         r  = m1/(1-b1^t) / (sqrt(m2/(1-b2^t)) + eps) + wd w
                         w -= lr * trust * r,   trust = ||w|| / ||r||   (per row)
    partial row-wise     m2 = b2 m2 + (1-b2) mean(g^2)  ([N], one value per row); otherwise as LAMB
    LAMB                 with sqrt(m2/(1-b2^t)) the row's shared denominator
    partial row-wise     m1 as LAMB, m2 as partial row-wise LAMB
    Adam                 w -= lr * (m1/(1-b1^t) / (sqrt(m2/(1-b2^t)) + eps) + wd w)
    LARS-SGD             local = lr * eta * ||w|| / (||g|| + wd ||w||)       (per row)
                         m1 = momentum m1 + local (g + wd w);   w -= m1

The trust ratios use the standard guard: where a norm in them is zero the ratio is 1 (LAMB) or
``eta`` (LARS) instead of fbgemm's 0 or NaN, so a zero-initialised row can start moving.
"""

from __future__ import annotations

import torch

__all__ = ["bias_correction", "lars_rows", "moment_rows"]


def bias_correction(beta: float, step: int | torch.Tensor, like: torch.Tensor) -> torch.Tensor | float:
    """``1 - beta**step`` in ``like``'s dtype and device (float64 arithmetic for a tensor step)."""
    if isinstance(step, torch.Tensor):
        return (1.0 - beta ** step.detach().to(torch.float64)).to(device=like.device, dtype=like.dtype)
    return 1.0 - float(beta**step)


def _row_norm(x: torch.Tensor) -> torch.Tensor:
    norm: torch.Tensor = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    return norm


def moment_rows(
    w: torch.Tensor,
    g: torch.Tensor,
    m1: torch.Tensor,
    m2: torch.Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int | torch.Tensor,
    layerwise: bool,
) -> torch.Tensor:
    """LAMB (``layerwise``: the per-row trust ratio) or partial row-wise Adam on rows ``w`` ``[N, D]``.

    ``m1`` ``[N, D]`` and ``m2`` (``[N, D]``, or ``[N]`` for one second moment per row) are updated in
    place. Returns the new rows.
    """
    m1.mul_(beta1).add_(g, alpha=1.0 - beta1)
    if m2.dim() == 1:
        m2.mul_(beta2).add_(g.square().mean(dim=1), alpha=1.0 - beta2)
        denom = (m2 / bias_correction(beta2, step, m2)).sqrt().add_(eps).unsqueeze(1)
    else:
        m2.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        denom = (m2 / bias_correction(beta2, step, m2)).sqrt().add_(eps)
    r = m1 / bias_correction(beta1, step, m1) / denom
    if weight_decay:
        r = r + weight_decay * w
    if not layerwise:
        return w - lr * r
    w_norm, r_norm = _row_norm(w), _row_norm(r)
    trust = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm.clamp_min(1e-30), torch.ones_like(w_norm))
    return w - lr * trust * r


def lars_rows(
    w: torch.Tensor,
    g: torch.Tensor,
    m1: torch.Tensor,
    lr: float,
    eta: float,
    momentum: float,
    weight_decay: float,
) -> torch.Tensor:
    """LARS-SGD with momentum: ``m1`` ``[N, D]`` (in place). Returns the new rows."""
    w_norm, g_norm = _row_norm(w), _row_norm(g)
    denom = g_norm + weight_decay * w_norm
    ratio = torch.where((w_norm > 0) & (g_norm > 0), eta * w_norm / denom.clamp_min(1e-30), torch.full_like(w_norm, eta))
    m1.mul_(momentum).add_(lr * ratio * (g + weight_decay * w))
    return w - m1
