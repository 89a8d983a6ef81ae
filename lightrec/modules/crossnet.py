"""Cross networks (DCN, DCN-v2): explicit, bounded-degree feature crosses.

Every cross layer keeps the width ``N`` of its input and multiplies elementwise with the
original input ``x_0``, so ``L`` layers model polynomial crosses of degree up to ``L + 1``::

    CrossNet               (DCN-v2, full rank)  x_{l+1} = x_0 * (W_l x_l + b_l) + x_l
    LowRankCrossNet        (DCN-v2, low rank)   x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l
    LowRankMixtureCrossNet (DCN-v2, K experts)  x_{l+1} = sum_i g_i(x_l) E_i(x_l) + x_l,
                           E_i = x_0 * (U_li a(C_li a(V_li x_l)) + b_l), g = softmax of K gates
    VectorCrossNet         (DCN v1)             x_{l+1} = x_0 * (x_l . w_l) + b_l + x_l

Shapes: ``[B, N] -> [B, N]``. ``*`` is elementwise; ``x_l . w_l`` a per-sample scalar.

Parameters carry torchrec's names and shapes, so a torchrec state dict loads as it is::

    CrossNet               kernels.{l} [N, N]     bias.{l} [N, 1]
    LowRankCrossNet        W_kernels.{l} [N, r]   V_kernels.{l} [r, N]   bias.{l} [N, 1]
    LowRankMixtureCrossNet U_kernels.{l} [K, N, r]  V_kernels.{l} [K, r, N]  C_kernels.{l} [K, r, r]
                           bias.{l} [N, 1]        gates.{i}.weight [1, N]  (K > 1 only)
    VectorCrossNet         kernels.{l} [N, 1]     bias.{l} [N, 1]

Initialisation: kernels are Xavier-normal, biases zero (as torchrec), so a fresh cross net is
close to the identity plus a small second-order term; all draws come from torch's global RNG,
so ``torch.manual_seed`` makes them reproducible.
"""

from collections.abc import Callable

import torch
from torch import nn

from lightrec.modules import _dense_checks as _checks
from lightrec.modules._dense_checks import check_positive_int

__all__ = ["CrossNet", "LowRankCrossNet", "LowRankMixtureCrossNet", "VectorCrossNet"]

Device = torch.device | str | None



def _parameters(num_layers: int, shape: list[int], device: Device, dtype: torch.dtype | None) -> nn.ParameterList:
    return nn.ParameterList([nn.Parameter(torch.empty(shape, device=device, dtype=dtype)) for _ in range(num_layers)])


def _init(kernels: list[nn.ParameterList], biases: nn.ParameterList) -> None:
    """Xavier-normal kernels (the whole tensor, as torchrec draws them), zero biases; no-op on meta."""
    with torch.no_grad():
        for params in kernels:
            for p in params:
                if p.device.type != "meta":
                    nn.init.xavier_normal_(p)
        for b in biases:
            if b.device.type != "meta":
                b.zero_()


class _CrossNetBase(nn.Module):
    __jit_unused_properties__ = ["in_features", "num_layers", "low_rank", "num_experts"]

    def __init__(self, in_features: int, num_layers: int) -> None:
        super().__init__()
        self._in_features = check_positive_int("in_features", in_features)
        self._num_layers = check_positive_int("num_layers", num_layers)

    @property
    def in_features(self) -> int:
        return self._in_features

    @property
    def num_layers(self) -> int:
        return self._num_layers


class _KernelCrossNet(_CrossNetBase):
    """A cross net with one kernel ``kernels.{l}`` ``[N, C]`` and one bias ``bias.{l}`` ``[N, 1]`` per layer
    (``CrossNet``: ``C = N``; ``VectorCrossNet``: ``C = 1``)."""

    def __init__(self, in_features: int, num_layers: int, kernel_columns: int, device: Device, dtype: torch.dtype | None) -> None:
        super().__init__(in_features, num_layers)
        self.kernels = _parameters(num_layers, [in_features, kernel_columns], device, dtype)
        self.bias = _parameters(num_layers, [in_features, 1], device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-normal kernels (the whole ``[N, C]`` matrix), zero biases."""
        _init([self.kernels], self.bias)


class CrossNet(_KernelCrossNet):
    """Full-rank DCN-v2 cross net: ``x_{l+1} = x_0 * (W_l x_l + b_l) + x_l``.

    Args:
        in_features: ``N``, the width of the input (and output).
        num_layers: ``L``, the number of cross layers.
        device: where the parameters are created (``"meta"`` allocates nothing).
        dtype: parameter dtype.

    Shapes:
        ``[B, N] -> [B, N]``. Parameters: ``kernels.{l}`` ``[N, N]`` and ``bias.{l}`` ``[N, 1]``
        (``L * (N^2 + N)`` numbers; use ``LowRankCrossNet`` when ``N`` is large).
    """

    def __init__(self, in_features: int, num_layers: int, device: Device = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(in_features, num_layers, in_features, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, N] -> [B, N]``."""
        _checks.check_matrix("CrossNet input", x, self._in_features)
        xl = x  # x stays x_0
        for kernel, bias in zip(self.kernels, self.bias):  # noqa: B905 - TorchScript has no zip(strict=)
            xl = x * (xl @ kernel.t() + bias.squeeze(1)) + xl
        return xl


class _LowRankCrossNetBase(_CrossNetBase):
    """A cross net whose layers factor through rank ``r`` (``low_rank``)."""

    def __init__(self, in_features: int, num_layers: int, low_rank: int) -> None:
        super().__init__(in_features, num_layers)
        self._low_rank = check_positive_int("low_rank", low_rank)

    @property
    def low_rank(self) -> int:
        return self._low_rank


class LowRankCrossNet(_LowRankCrossNetBase):
    """Low-rank DCN-v2 cross net: ``x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l``.

    Args:
        in_features: ``N``, the width of the input (and output).
        num_layers: ``L``, the number of cross layers.
        low_rank: ``r``, the rank of each ``W_l V_l``; ``2 r < N`` saves parameters.
        device: where the parameters are created (``"meta"`` allocates nothing).
        dtype: parameter dtype.

    Shapes:
        ``[B, N] -> [B, N]``. Parameters per layer: ``V_kernels.{l}`` ``[r, N]``,
        ``W_kernels.{l}`` ``[N, r]``, ``bias.{l}`` ``[N, 1]``.
    """

    def __init__(
        self,
        in_features: int,
        num_layers: int,
        low_rank: int = 1,
        device: Device = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, num_layers, low_rank)
        self.W_kernels = _parameters(num_layers, [in_features, low_rank], device, dtype)
        self.V_kernels = _parameters(num_layers, [low_rank, in_features], device, dtype)
        self.bias = _parameters(num_layers, [in_features, 1], device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-normal ``W_l`` and ``V_l``, zero biases."""
        _init([self.W_kernels, self.V_kernels], self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, N] -> [B, N]``."""
        _checks.check_matrix("LowRankCrossNet input", x, self._in_features)
        xl = x  # x stays x_0
        for w, v, bias in zip(self.W_kernels, self.V_kernels, self.bias):  # noqa: B905 - TorchScript: no strict=
            xl = x * ((xl @ v.t()) @ w.t() + bias.squeeze(1)) + xl
        return xl


class LowRankMixtureCrossNet(_LowRankCrossNetBase):
    """DCN-v2 with a mixture of ``K`` low-rank experts per layer (torchrec's semantics).

    Expert ``i`` of layer ``l`` is ``x_0 * (U_li a(C_li a(V_li x_l)) + b_l)`` with activation ``a``;
    with ``K > 1`` the experts are mixed by ``softmax`` over gates ``g_i(x_l) = w_i . x_l``,
    with ``K == 1`` the one expert is added as it is.

    Args:
        in_features: ``N``.
        num_layers: ``L``.
        num_experts: ``K``.
        low_rank: ``r``.
        activation: ``a`` (default ``torch.relu``).
        device / dtype: of the parameters.

    Shapes:
        ``[B, N] -> [B, N]``.
    """

    def __init__(
        self,
        in_features: int,
        num_layers: int,
        num_experts: int = 1,
        low_rank: int = 1,
        activation: nn.Module | Callable[[torch.Tensor], torch.Tensor] = torch.relu,
        device: Device = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, num_layers, low_rank)
        self._num_experts = check_positive_int("num_experts", num_experts)
        self._activation = activation
        self.U_kernels = _parameters(num_layers, [num_experts, in_features, low_rank], device, dtype)
        self.V_kernels = _parameters(num_layers, [num_experts, low_rank, in_features], device, dtype)
        self.bias = _parameters(num_layers, [in_features, 1], device, dtype)
        self.gates = (
            nn.ModuleList([nn.Linear(in_features, 1, bias=False, device=device, dtype=dtype) for _ in range(num_experts)])
            if num_experts > 1
            else None
        )
        self.C_kernels = _parameters(num_layers, [num_experts, low_rank, low_rank], device, dtype)
        self.reset_parameters()

    @property
    def num_experts(self) -> int:
        return self._num_experts

    def reset_parameters(self) -> None:
        """Xavier-normal expert kernels, zero biases; gates keep ``nn.Linear``'s init."""
        _init([self.U_kernels, self.V_kernels, self.C_kernels], self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, N] -> [B, N]``."""
        _checks.check_matrix("LowRankMixtureCrossNet input", x, self._in_features)
        xl = x  # x stays x_0
        for u, v, c, bias in zip(self.U_kernels, self.V_kernels, self.C_kernels, self.bias):  # noqa: B905
            # [B, N] -> [B, K, r] -> [B, K, r] -> [B, K, N]: every expert at once
            h = self._activation(torch.einsum("krn,bn->bkr", v, xl))
            h = self._activation(torch.einsum("kst,bkt->bks", c, h))
            experts = x.unsqueeze(1) * (torch.einsum("knr,bkr->bkn", u, h) + bias.squeeze(1))
            if self.gates is None:
                xl = experts.squeeze(1) + xl
            else:
                gating = torch.softmax(torch.cat([g(xl) for g in self.gates], dim=1), dim=1)  # [B, K]
                xl = (experts * gating.unsqueeze(2)).sum(dim=1) + xl
        return xl


class VectorCrossNet(_KernelCrossNet):
    """DCN (v1) cross net: ``x_{l+1} = x_0 * (x_l . w_l) + b_l + x_l``.

    Args: ``in_features`` (``N``), ``num_layers`` (``L``), ``device``, ``dtype``, as for :class:`CrossNet`.

    Shapes:
        ``[B, N] -> [B, N]``. Parameters: ``kernels.{l}`` ``[N, 1]``, ``bias.{l}`` ``[N, 1]``.
    """

    def __init__(self, in_features: int, num_layers: int, device: Device = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(in_features, num_layers, 1, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, N] -> [B, N]``."""
        _checks.check_matrix("VectorCrossNet input", x, self._in_features)
        xl = x  # x stays x_0
        for kernel, bias in zip(self.kernels, self.bias):  # noqa: B905 - TorchScript has no zip(strict=)
            # [B, N] @ [N, 1] -> [B, 1]: one scalar per sample scales x_0.
            xl = x * (xl @ kernel) + bias.squeeze(1) + xl
        return xl
