"""torchrec's ``torchrec.optim.clipping``: clip gradients, then step the wrapped optimizer.

::

    optimizer = GradientClippingOptimizer(KeyedOptimizerWrapper(dict(model.named_parameters()), factory),
                                          clipping=GradientClipping.NORM, max_gradient=1.0)

``NORM`` scales every gradient by ``min(1, max_gradient / (total_norm + 1e-6))`` where
``total_norm`` is the ``norm_type``-norm of all gradients together; ``VALUE`` clamps each element
to ``[-max_gradient, max_gradient]``. With ``enable_global_grad_clip`` and ``param_to_pgs`` the
norm of parameters sharded over a process group includes every rank's part (one all-reduce).
Embedding tables trained by a fused optimizer have no ``.grad`` (their rows were updated in
backward) and are not clipped, as in torchrec.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from enum import Enum, unique

import torch
import torch.distributed as dist

from lightrec.optim.keyed import KeyedOptimizer, OptimizerWrapper

__all__ = ["GradientClipping", "GradientClippingOptimizer"]


@unique
class GradientClipping(Enum):
    NORM = "norm"
    VALUE = "value"
    NONE = "none"


def _norm_dtype(params: list[torch.Tensor]) -> torch.dtype:
    """float64 where a parameter is float64 (``torch.nn.utils.clip_grad_norm_`` computes in the
    gradients' dtype), float32 otherwise; from the parameters, not the gradients, so every rank of
    a process group reduces the same dtype even where one has no gradient."""
    return torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32


def _norm_device(params: list[torch.Tensor]) -> torch.device:
    """Where a group's norm lives: its parameters' device (CPU for no parameters), also on a rank whose
    parameters have no gradient this step, so that NCCL, which refuses CPU tensors, can reduce it."""
    return params[0].device if params else torch.device("cpu")


def _norm_power(grads: list[torch.Tensor], norm_type: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``sum |g|^p`` (or ``max |g|`` for the infinity norm) over ``grads``, as a ``dtype`` scalar on ``device``."""
    if not grads:
        return torch.zeros((), dtype=dtype, device=device)
    norms = torch.stack([g.detach().to(device, dtype).norm(norm_type) for g in grads])
    return norms.max() if norm_type == float("inf") else norms.pow(norm_type).sum()


class GradientClippingOptimizer(OptimizerWrapper):
    """Clips gradients before every step of the wrapped optimizer (see the module docstring).

    Args:
        optimizer: the ``KeyedOptimizer`` to wrap.
        clipping: ``NORM``, ``VALUE`` or ``NONE``.
        max_gradient: the largest norm (``NORM``) or absolute value (``VALUE``) allowed.
        norm_type: the p of the p-norm; ``"inf"`` for the largest absolute value.
        enable_global_grad_clip: include the other ranks' parts of sharded parameters in the norm.
        param_to_pgs: ``{parameter: [process groups it is sharded over]}`` (global clipping only).
    """

    def __init__(
        self,
        optimizer: KeyedOptimizer,
        clipping: GradientClipping = GradientClipping.NONE,
        max_gradient: float = 0.1,
        norm_type: float | str = 2.0,
        enable_global_grad_clip: bool = False,
        param_to_pgs: dict[torch.nn.Parameter, list[dist.ProcessGroup]] | None = None,
    ) -> None:
        super().__init__(optimizer)
        if not isinstance(clipping, GradientClipping):
            raise TypeError(f"clipping must be a GradientClipping member, got {clipping!r}")
        if max_gradient <= 0:
            raise ValueError(f"max_gradient must be > 0, got {max_gradient}")
        self._clipping = clipping
        self._max_gradient = float(max_gradient)
        try:
            self._norm_type = float(norm_type)
        except (TypeError, ValueError):
            self._norm_type = float("nan")
        if not self._norm_type > 0:  # 0, negative or NaN: the total would zero (or keep) every gradient
            raise ValueError(
                f"GradientClippingOptimizer(norm_type={norm_type!r}) must be > 0 (e.g. 2.0) or 'inf' for the "
                "largest absolute value"
            )
        self._replicated: list[torch.Tensor] = []
        self._sharded: dict[tuple[dist.ProcessGroup, ...], list[torch.Tensor]] = defaultdict(list)
        for group in self.param_groups:
            for p in group["params"]:
                pgs = (param_to_pgs or {}).get(p) if enable_global_grad_clip else None
                if pgs:
                    self._sharded[tuple(pgs)].append(p)
                else:
                    self._replicated.append(p)
        if clipping == GradientClipping.VALUE and self._sharded:
            raise ValueError("GradientClipping.VALUE needs no process groups: clip sharded parameters by NORM")

    def _grads(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        return [p.grad for p in params if p.grad is not None and p.grad.numel() > 0]

    def clip_grad_norm_(self) -> torch.Tensor:
        """Scale every gradient so that their total norm is at most ``max_gradient``; returns the
        norm before clipping (collective over the process groups of sharded parameters)."""
        inf = self._norm_type == float("inf")
        replicated = self._replicated
        total = _norm_power(self._grads(replicated), self._norm_type, _norm_dtype(replicated), _norm_device(replicated))
        for pgs, params in self._sharded.items():
            part = _norm_power(self._grads(params), self._norm_type, _norm_dtype(params), _norm_device(params))
            for pg in pgs:
                dist.all_reduce(part, op=dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM, group=pg)
            total = torch.maximum(total, part) if inf else total + part
        norm = total if inf else total.pow(1.0 / self._norm_type)
        grads = self._grads(self._replicated) + [g for ps in self._sharded.values() for g in self._grads(ps)]
        scale = torch.clamp(self._max_gradient / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale.to(g.device, g.dtype))
        return norm

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        if self._clipping == GradientClipping.NORM:
            self.clip_grad_norm_()
        elif self._clipping == GradientClipping.VALUE:
            torch.nn.utils.clip_grad_value_(self._replicated, clip_value=self._max_gradient)
        return super().step(closure)
