"""Plain-PyTorch references for the batched kernels: dense gradients, optimizers written out.

Nothing here uses lightrec's kernels: pooling is one ``F.embedding_bag`` per feature on ordinary
leaf tensors, gradients come from autograd (dense ``[rows, D]``), and each optimizer is the
textbook formula applied to the rows whose ids occur in the batch (duplicates are summed by
autograd's dense gradient before the update, as fbgemm's exact optimizers do).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Layouts: (rows, dims) per table and feature_table_map.
LAYOUTS = {
    "mixed_shared": ([(20, 4), (30, 8), (25, 4)], [0, 1, 0, 2]),
    "uniform": ([(20, 8), (30, 8), (25, 8)], [0, 1, 2]),
    "uniform_shared": ([(20, 8), (30, 8)], [0, 1, 0]),
}


@dataclass
class Batch:
    indices: torch.Tensor  # [N]
    offsets: torch.Tensor  # [T*B + 1]
    weights: torch.Tensor | None  # [N]
    batch: int


def random_batch(
    gen: torch.Generator,
    rows: list[int],
    ftm: list[int],
    batch: int,
    weighted: bool,
    max_len: int = 3,
    one_per_bag: bool = False,
) -> Batch:
    """Random jagged batch; ids drawn from the first few rows so duplicates are common."""
    lengths = torch.randint(0, max_len + 1, (len(ftm) * batch,), generator=gen)
    if one_per_bag:
        lengths = torch.ones_like(lengths)
    ids = []
    for f, t in enumerate(ftm):
        n = int(lengths[f * batch : (f + 1) * batch].sum())
        ids.append(torch.randint(0, min(rows[t], 6), (n,), generator=gen))
    indices = torch.cat(ids)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)])
    weights = torch.rand(indices.numel(), generator=gen) + 0.5 if weighted else None
    return Batch(indices, offsets, weights, batch)


def pooled_reference(weights: list[torch.Tensor], ftm: list[int], b: Batch, mode: str) -> torch.Tensor:
    """``[B, sum D]``: one ``F.embedding_bag`` per feature (weighted mean = weighted sum / count)."""
    outs = []
    for f, t in enumerate(ftm):
        lo, hi = int(b.offsets[f * b.batch]), int(b.offsets[(f + 1) * b.batch])
        ids = b.indices[lo:hi]
        offs = b.offsets[f * b.batch : (f + 1) * b.batch + 1] - lo
        w = b.weights[lo:hi] if b.weights is not None else None
        if mode == "mean" and w is not None:
            out = F.embedding_bag(
                ids, weights[t], offs, mode="sum", per_sample_weights=w, include_last_offset=True
            )
            out = out / (offs[1:] - offs[:-1]).clamp(min=1).unsqueeze(1)
        else:
            out = F.embedding_bag(
                ids, weights[t], offs, mode=mode, per_sample_weights=w, include_last_offset=True
            )
        outs.append(out)
    return torch.cat(outs, dim=1)


def touched_rows(ftm: list[int], num_tables: int, b: Batch) -> list[torch.Tensor]:
    """Sorted unique ids looked up in each table by this batch."""
    per_table: list[list[torch.Tensor]] = [[] for _ in range(num_tables)]
    for f, t in enumerate(ftm):
        lo, hi = int(b.offsets[f * b.batch]), int(b.offsets[(f + 1) * b.batch])
        per_table[t].append(b.indices[lo:hi])
    return [torch.unique(torch.cat(p)) if p else torch.zeros(0, dtype=torch.long) for p in per_table]


class ReferenceOptimizer:
    """Textbook sparse-row optimizers over dense gradients (kind, lr, eps, wd, wd_mode, betas)."""

    def __init__(
        self,
        kind: str,
        weights: list[torch.Tensor],
        lr: float,
        eps: float,
        wd: float,
        wd_mode: str,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eta: float = 0.001,
        momentum: float = 0.9,
    ) -> None:
        self.kind, self.lr, self.eps, self.wd, self.wd_mode = kind, lr, eps, wd, wd_mode
        self.beta1, self.beta2, self.step_count = beta1, beta2, 0
        self.eta, self.momentum = eta, momentum
        self.state: list[dict[str, torch.Tensor]] = []
        for w in weights:
            if kind == "adagrad":
                self.state.append({"momentum1": torch.zeros_like(w)})
            elif kind == "rowwise_adagrad":
                self.state.append({"momentum1": torch.zeros(w.shape[0])})
            elif kind in ("adam", "lamb"):
                self.state.append({"momentum1": torch.zeros_like(w), "momentum2": torch.zeros_like(w)})
            elif kind in ("partial_rowwise_adam", "partial_rowwise_lamb"):
                self.state.append({"momentum1": torch.zeros_like(w), "momentum2": torch.zeros(w.shape[0])})
            elif kind == "lars_sgd":
                self.state.append({"momentum1": torch.zeros_like(w)})
            else:
                self.state.append({})

    @torch.no_grad()
    def step(self, weights: list[torch.Tensor], rows: list[torch.Tensor]) -> None:
        self.step_count += 1
        lr, eps, wd = self.lr, self.eps, self.wd
        for w_full, r, st in zip(weights, rows, self.state, strict=True):
            if r.numel() == 0:
                continue
            w = w_full[r].clone()
            g = w_full.grad[r].clone()
            if self.kind in ROW_RULES:
                for i, row in enumerate(r.tolist()):
                    w_full[row] = ROW_RULES[self.kind](self, w[i], g[i], st, row)
                w_full.grad = None
                continue
            if self.wd_mode == "l2":
                g = g + wd * w
            if self.kind == "sgd":
                upd = lr * g
            elif self.kind == "adagrad":
                st["momentum1"][r] += g * g
                upd = lr * g / (st["momentum1"][r].sqrt() + eps)
            elif self.kind == "rowwise_adagrad":
                st["momentum1"][r] += (g * g).mean(dim=1)
                upd = (lr / (st["momentum1"][r].sqrt() + eps))[:, None] * g
            else:  # adam, global step count
                m = st["momentum1"][r] * self.beta1 + (1 - self.beta1) * g
                v = st["momentum2"][r] * self.beta2 + (1 - self.beta2) * g * g
                st["momentum1"][r], st["momentum2"][r] = m, v
                m_hat = m / (1 - self.beta1**self.step_count)
                v_hat = v / (1 - self.beta2**self.step_count)
                upd = lr * m_hat / (v_hat.sqrt() + eps)
            if self.wd_mode == "decoupled":
                w = w * (1 - lr * wd)
            w_full[r] = w - upd
            w_full.grad = None


def _norm(x: torch.Tensor) -> float:
    return float(x.double().square().sum().sqrt())


def _lamb_row(opt: ReferenceOptimizer, w: torch.Tensor, g: torch.Tensor, st: dict, row: int) -> torch.Tensor:
    """One row of (partial row-wise) LAMB, written out as in the LAMB paper with a per-row trust ratio."""
    t, b1, b2 = opt.step_count, opt.beta1, opt.beta2
    m = b1 * st["momentum1"][row] + (1 - b1) * g
    st["momentum1"][row] = m
    if opt.kind == "lamb":
        v = b2 * st["momentum2"][row] + (1 - b2) * g * g
    else:
        v = b2 * st["momentum2"][row] + (1 - b2) * float((g * g).mean())
    st["momentum2"][row] = v
    r = (m / (1 - b1**t)) / ((v / (1 - b2**t)) ** 0.5 + opt.eps) + opt.wd * w
    wn, rn = _norm(w), _norm(r)
    trust = wn / rn if wn > 0 and rn > 0 else 1.0
    return w - opt.lr * trust * r


def _partial_adam_row(opt: ReferenceOptimizer, w: torch.Tensor, g: torch.Tensor, st: dict, row: int) -> torch.Tensor:
    t, b1, b2 = opt.step_count, opt.beta1, opt.beta2
    m = b1 * st["momentum1"][row] + (1 - b1) * g
    v = b2 * float(st["momentum2"][row]) + (1 - b2) * float((g * g).mean())
    st["momentum1"][row], st["momentum2"][row] = m, v
    return w - opt.lr * ((m / (1 - b1**t)) / ((v / (1 - b2**t)) ** 0.5 + opt.eps) + opt.wd * w)


def _lars_row(opt: ReferenceOptimizer, w: torch.Tensor, g: torch.Tensor, st: dict, row: int) -> torch.Tensor:
    wn, gn = _norm(w), _norm(g)
    ratio = opt.eta * wn / (gn + opt.wd * wn) if wn > 0 and gn > 0 else opt.eta
    m = opt.momentum * st["momentum1"][row] + opt.lr * ratio * (g + opt.wd * w)
    st["momentum1"][row] = m
    return w - m


ROW_RULES = {
    "lamb": _lamb_row,
    "partial_rowwise_lamb": _lamb_row,
    "partial_rowwise_adam": _partial_adam_row,
    "lars_sgd": _lars_row,
}
