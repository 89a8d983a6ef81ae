"""Reference dequantization + pooling written independently of lightrec's kernels (numpy).

Decodes fbgemm's row layout from raw bytes (fp16 scale and bias first, then the payload) and
accumulates every bag in order in float32 with fbgemm's fused multiply-add
``acc = fma(scale * w, q, acc + bias * w)`` (fp16 rows: ``acc = fma(w, x, acc)``), emulated with
float64 arithmetic where ``scale * q`` is exact. MEAN multiplies by ``float32(1 / len)``.
"""

from __future__ import annotations

import numpy as np
import torch


def decode(stored: torch.Tensor, kind: str, dim: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    raw = stored.numpy()
    if kind == "fp16":
        return raw[:, : 2 * dim].copy().view(np.float16).astype(np.float64), None, None
    sb = raw[:, :4].copy().view(np.float16).astype(np.float32)
    if kind == "int8":
        q = raw[:, 4 : 4 + dim].astype(np.float64)
    else:
        packed = raw[:, 4 : 4 + dim // 2]
        q = np.stack([packed & 15, packed >> 4], axis=2).reshape(-1, dim).astype(np.float64)
    return q, sb[:, 0], sb[:, 1]


def pooled(stored: torch.Tensor, kind: str, dim: int, ids: list[int], offsets: list[int],
           weights: list[float] | None, mean: bool) -> np.ndarray:
    """``[num_bags, dim]`` float32 pooled bags."""
    q, scale, bias = decode(stored, kind, dim)
    out = np.zeros((len(offsets) - 1, dim), dtype=np.float32)
    for b in range(len(offsets) - 1):
        acc = np.zeros(dim, dtype=np.float32)
        for k in range(offsets[b], offsets[b + 1]):
            i = ids[k]
            w = np.float32(weights[k]) if weights is not None else np.float32(1.0)
            if scale is None:
                acc = (np.float64(w) * q[i] + acc.astype(np.float64)).astype(np.float32)
            else:
                s = np.float32(scale[i] * w) if weights is not None else scale[i]
                c = np.float32(bias[i] * w) if weights is not None else bias[i]
                acc = (np.float64(s) * q[i] + (acc + c).astype(np.float64)).astype(np.float32)
        n = offsets[b + 1] - offsets[b]
        if mean and n:
            acc = acc * np.float32(1.0 / n)
        out[b] = acc
    return out
