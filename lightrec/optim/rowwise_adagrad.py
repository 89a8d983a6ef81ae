"""Row-wise Adagrad as a regular (dense-gradient) ``torch.optim.Optimizer``.

Recommendation tables use one adaptive learning rate per embedding row instead of one per element:
the state is ``[rows]`` instead of ``[rows, D]``, a factor ``D`` less memory, and rows that are seen
rarely keep a large step. This class exists so that ``apply_optimizer_in_backward(RowWiseAdagrad,
...)`` can name the fused row-wise Adagrad, and so that non-fused parameters can use the same rule.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from typing import Any, overload

import torch

__all__ = ["DenseRowOptimizer", "RowWiseAdagrad", "check_non_negative"]


def check_non_negative(name: str, **values: float) -> None:
    """Refuse a negative hyper-parameter of optimizer ``name``.

    Raises:
        ValueError: naming the optimizer, the argument and its value.
    """
    for arg, value in values.items():
        if value < 0.0:
            raise ValueError(f"{name}({arg}={value}) must be >= 0")


class DenseRowOptimizer(torch.optim.Optimizer, abc.ABC):
    """Base of lightrec's dense-gradient row optimizers: ``step`` runs ``closure`` and calls
    :meth:`_step_param` for every parameter with a (dense) gradient."""

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(
                        f"{type(self).__name__} takes dense gradients; use a fused collection for sparse ones"
                    )
                self._step_param(p, group)
        return loss

    @abc.abstractmethod
    def _step_param(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        """Update ``p`` in place from its dense ``p.grad`` with ``group``'s hyper-parameters."""


class RowWiseAdagrad(DenseRowOptimizer):
    """Adagrad whose accumulator is the mean squared gradient of each row.

    For a parameter ``w`` of shape ``[rows, D]`` with gradient ``g`` (1-D parameters count as one
    row per element)::

        g = g + weight_decay * w          (if weight_decay)
        sum += mean(g * g, dim=1)         # state "sum": [rows]
        w -= lr * g / (sqrt(sum) + eps)[:, None]

    Rows with an all-zero gradient keep their accumulator and (without weight decay) their weights.

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        eps: denominator guard.
        weight_decay: L2 penalty added to the gradient.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
    ) -> None:
        check_non_negative("RowWiseAdagrad", lr=lr, eps=eps, weight_decay=weight_decay)
        super().__init__(params, {"lr": lr, "eps": eps, "weight_decay": weight_decay})

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (``torch.optim.Optimizer``'s contract) with a zero ``"sum"`` per parameter.

        ``__init__`` adds its groups through here too, so a group added later (Lightning's
        ``BackboneFinetuning`` unfreezing layers) has its state before the first ``step``, like
        torch's ``Adagrad``.
        """
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            rows = p.shape[0] if p.dim() > 0 else 1
            self.state[p]["sum"] = torch.zeros(rows, dtype=p.dtype, device=p.device)

    def _step_param(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        w = p.view(p.shape[0], -1) if p.dim() > 1 else p.view(-1, 1)
        g = p.grad.view_as(w)  # type: ignore[union-attr]  # step() only calls this with a gradient
        if group["weight_decay"] != 0.0:
            g = g + group["weight_decay"] * w
        acc = self.state[p]["sum"]
        acc.add_(g.square().mean(dim=1))
        w.sub_(group["lr"] * g / (acc.sqrt() + group["eps"]).unsqueeze(1))
