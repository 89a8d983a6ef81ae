"""Hand-written numpy references for the metric tests (no sklearn): brute force, straight from the formulas."""

from __future__ import annotations

import numpy as np


def auc_pairs(preds: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> float:
    """AUC by counting every (positive, negative) pair: 1 if ordered right, 1/2 if tied (Mann-Whitney U)."""
    w = np.ones_like(labels, dtype=np.float64) if weights is None else weights.astype(np.float64)
    pos = labels.astype(np.float64) * w
    neg = (1.0 - labels.astype(np.float64)) * w
    s = preds.astype(np.float64)
    above = (s[:, None] > s[None, :]).astype(np.float64)
    tied = (s[:, None] == s[None, :]).astype(np.float64)
    u = (pos[:, None] * neg[None, :] * (above + 0.5 * tied)).sum()
    return float(u / (pos.sum() * neg.sum()))


def ne_formula(
    preds: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None, eps: float = 1e-12
) -> float:
    w = np.ones_like(labels, dtype=np.float64) if weights is None else weights.astype(np.float64)
    y = labels.astype(np.float64)
    q = np.clip(preds.astype(np.float64), eps, 1 - eps)
    logloss = -(w * (y * np.log(q) + (1 - y) * np.log(1 - q))).sum() / w.sum()
    ctr = np.clip((w * y).sum() / w.sum(), eps, 1 - eps)
    return float(logloss / -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr)))


def calibration_formula(preds, labels, weights=None) -> float:
    w = np.ones_like(labels, dtype=np.float64) if weights is None else weights.astype(np.float64)
    return float((w * preds).sum() / (w * labels).sum())


def ctr_formula(labels, weights=None) -> float:
    w = np.ones_like(labels, dtype=np.float64) if weights is None else weights.astype(np.float64)
    return float((w * labels).sum() / w.sum())


def accuracy_formula(preds, labels, weights=None, threshold: float = 0.5) -> float:
    """Hard 0/1 labels: weighted share of samples where (p > t) equals the label."""
    w = np.ones_like(labels, dtype=np.float64) if weights is None else weights.astype(np.float64)
    correct = ((preds > threshold).astype(np.float64) == labels).astype(np.float64)
    return float((w * correct).sum() / w.sum())


def recall_at_k_random_ties(scores: np.ndarray, target: np.ndarray, k: int) -> float:
    """Recall@k by ranking each row; ties averaged over every position the target could take among them."""
    hits = []
    for row, t in zip(scores, target, strict=True):
        better = int((row > row[t]).sum())
        tied = int((row == row[t]).sum())  # includes the target itself
        # The target is equally likely to sit at each of the positions better .. better + tied - 1.
        positions = np.arange(better, better + tied)
        hits.append(float((positions < k).mean()))
    return float(np.mean(hits))
