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

        g = -g                            (if maximize)
        g = g + weight_decay * w          (if weight_decay)
        sum += mean(g * g, dim=1)         # state "sum": [rows], starts at initial_accumulator_value
        w -= lr * g / (sqrt(sum) + eps)[:, None]

    Rows with an all-zero gradient keep their accumulator and (without weight decay) their weights.
    This is fbgemm's (and the fused collections') exact row-wise Adagrad.

    The arguments are torchrec's ``torchrec.optim.RowWiseAdagrad``'s, in its order (torchrec's
    dense class accumulates the square of the row's *mean* gradient instead, and moves the whole row
    by that mean). A torch-format state dict whose ``"sum"`` is ``[rows, 1]`` (torchrec's layout)
    loads through this optimizer's ``load_state_dict`` and is kept as ``[rows]``; a
    :class:`~lightrec.optim.KeyedOptimizer` wrapping it refuses that shape with its ``ValueError``.

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        lr_decay: torchrec's learning-rate decay; only 0 is supported (``ValueError`` otherwise),
            as in the fused collections.
        weight_decay: L2 penalty added to the gradient.
        initial_accumulator_value: starting value of every row's ``"sum"``.
        eps: denominator guard.
        maximize: ascend the objective instead of descending it.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        *,
        maximize: bool = False,
    ) -> None:
        check_non_negative(
            "RowWiseAdagrad",
            lr=lr,
            lr_decay=lr_decay,
            weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value,
            eps=eps,
        )
        defaults = {
            "lr": lr,
            "lr_decay": lr_decay,
            "weight_decay": weight_decay,
            "initial_accumulator_value": initial_accumulator_value,
            "eps": eps,
            "maximize": maximize,
        }
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (``torch.optim.Optimizer``'s contract) with a ``"sum"`` per parameter, filled
        with the group's ``initial_accumulator_value``.

        ``__init__`` adds its groups through here too, so a group added later (Lightning's
        ``BackboneFinetuning`` unfreezing layers) has its state before the first ``step``, like
        torch's ``Adagrad``.

        Raises:
            ValueError: the group's ``lr_decay`` is not 0 (not supported, see the class docstring).
        """
        lr_decay = param_group.get("lr_decay", self.defaults["lr_decay"])
        if lr_decay != 0.0:
            raise ValueError(
                f"RowWiseAdagrad(lr_decay={lr_decay}) is not supported (nor by the fused collections); "
                "use lr_decay=0.0 and a learning-rate scheduler"
            )
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            rows = p.shape[0] if p.dim() > 0 else 1
            self.state[p]["sum"] = torch.full(
                (rows,), float(group["initial_accumulator_value"]), dtype=p.dtype, device=p.device
            )

    def __setstate__(self, state: dict[str, Any]) -> None:
        # torch's load_state_dict ends here: groups saved before lightrec took torchrec's arguments
        # get their defaults, and a torchrec "sum" of [rows, 1] becomes lightrec's [rows]
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("lr_decay", 0.0)
            group.setdefault("initial_accumulator_value", 0.0)
            group.setdefault("maximize", False)
        for param_state in self.state.values():
            acc = param_state.get("sum")
            if isinstance(acc, torch.Tensor) and acc.dim() == 2 and acc.shape[1] == 1:
                param_state["sum"] = acc.view(-1)

    def _step_param(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        # [rows, D] in logical order (a copy where p is not contiguous, e.g. channels_last); p is updated below
        w = p.reshape(p.shape[0], -1) if p.dim() > 1 else p.reshape(-1, 1)
        g = p.grad.reshape(w.shape)  # type: ignore[union-attr]  # step() only calls this with a gradient
        if group["maximize"]:
            g = -g
        if group["weight_decay"] != 0.0:
            g = g + group["weight_decay"] * w
        acc = self.state[p]["sum"]
        acc.add_(g.square().mean(dim=1))
        p.sub_((group["lr"] * g / (acc.sqrt() + group["eps"]).unsqueeze(1)).view(p.shape))
