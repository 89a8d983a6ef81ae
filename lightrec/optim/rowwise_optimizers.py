"""LAMB, PartialRowWiseLAMB, PartialRowWiseAdam and LarsSGD as ``torch.optim.Optimizer`` s.

torchrec names these classes only to mark embedding tables for fbgemm's fused optimizers
(``apply_optimizer_in_backward(LAMB, ebc.parameters(), {...})``); its classes raise when stepped.
lightrec's classes are real optimizers with the same update rules as the fused kernels
(:mod:`lightrec.optim.row_rules`), so a marked table trains identically before and after it is
fused or sharded on the rows each batch looks up, and the classes can train dense parameters too.
(A row a batch does not look up has a zero gradient here and still moves by its decaying moments;
the fused rule leaves it untouched, as fbgemm does.) A parameter is seen as rows:
``[R, D]`` as is, ``[R, ...]`` flattened to ``[R, -1]``, 1-D (a bias) as one row -- the trust ratios
and row-wise moments are per row, as fbgemm treats every embedding row as its own layer.

Every optimizer counts its steps per parameter (``state["step"]``, the ``t`` of the bias
corrections); the fused kernels count backward passes of their table group, which is the same when
every step updates the table.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any

import torch

from lightrec.optim.row_rules import lars_rows, moment_rows
from lightrec.optim.rowwise_adagrad import DenseRowOptimizer, check_non_negative

__all__ = ["LAMB", "LarsSGD", "PartialRowWiseAdam", "PartialRowWiseLAMB"]


def _rows(p: torch.Tensor) -> torch.Tensor:
    """``p`` as ``[rows, D]`` in its logical (row-major) order: a view where the layout allows, a copy
    otherwise (a ``channels_last`` conv weight or gradient)."""
    return p.reshape(p.shape[0], -1) if p.dim() > 1 else p.reshape(1, -1)


def _check_betas(name: str, betas: tuple[float, float]) -> tuple[float, float]:
    b1, b2 = (float(b) for b in betas)
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise ValueError(f"{name}(betas={betas}) must be two numbers in [0, 1)")
    return b1, b2


class _RowwiseOptimizer(DenseRowOptimizer):
    """Rows view, per-parameter step count and state, then ``_update``."""

    _row_state: frozenset[str] = frozenset()  # state names holding one value per row
    _state_names: tuple[str, ...] = ()

    def _step_param(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        w, g = _rows(p), _rows(p.grad)  # type: ignore[arg-type]  # step() only calls this with a gradient
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.int64, device=p.device)
            for name in self._state_names:
                shape = (w.shape[0],) if name in self._row_state else tuple(w.shape)
                state[name] = torch.zeros(shape, dtype=p.dtype, device=p.device)
        state["step"] += 1
        p.copy_(self._update(group, w, g, state).view(p.shape))  # into p: w is a copy where p is not contiguous

    @abc.abstractmethod
    def _update(self, group: dict[str, Any], w: torch.Tensor, g: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        """The new rows ``[rows, D]`` from rows ``w``, gradient rows ``g`` and the parameter's ``state``."""


class LAMB(_RowwiseOptimizer):
    """Layer-wise adaptive moments (LAMB) with one trust ratio per row.

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        betas: decay rates of the first and second moments.
        eps: denominator guard.
        weight_decay: decay added to the update (inside the trust ratio).
    """

    _state_names = ("momentum1", "momentum2")
    _layerwise = True  # the trust ratio (False: partial row-wise Adam)

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        check_non_negative(type(self).__name__, lr=lr, eps=eps, weight_decay=weight_decay)
        defaults = {"lr": lr, "betas": _check_betas(type(self).__name__, betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def _update(self, group: dict[str, Any], w: torch.Tensor, g: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        b1, b2 = group["betas"]
        return moment_rows(w, g, state["momentum1"], state["momentum2"], group["lr"], b1, b2, group["eps"],
                           group["weight_decay"], state["step"], self._layerwise)  # fmt: skip


class PartialRowWiseLAMB(LAMB):
    """LAMB whose second moment is one value per row (the mean squared gradient of the row)."""

    _row_state = frozenset({"momentum2"})


class PartialRowWiseAdam(LAMB):
    """Adam whose second moment is one value per row; ``weight_decay`` is added to the update."""

    _row_state = frozenset({"momentum2"})
    _layerwise = False


class LarsSGD(_RowwiseOptimizer):
    """SGD with momentum and a layer-wise (here: row-wise) adaptive rate (LARS).

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        eta: trust coefficient.
        momentum: momentum of the accumulated update.
        weight_decay: decay added to the gradient and to the trust ratio's denominator.
    """

    _state_names = ("momentum1",)

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        eta: float = 1e-3,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
    ) -> None:
        check_non_negative("LarsSGD", lr=lr, eta=eta, momentum=momentum, weight_decay=weight_decay)
        super().__init__(params, {"lr": lr, "eta": eta, "momentum": momentum, "weight_decay": weight_decay})

    def _update(self, group: dict[str, Any], w: torch.Tensor, g: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        return lars_rows(w, g, state["momentum1"], group["lr"], group["eta"], group["momentum"], group["weight_decay"])
