"""Cross networks (DCN, DCN-v2): explicit, bounded-degree feature crosses.

Every cross layer keeps the width ``N`` of its input and multiplies elementwise with the
original input ``x_0``, so ``L`` layers model polynomial crosses of degree up to ``L + 1``::

    CrossNet         (DCN-v2, full rank)   x_{l+1} = x_0 * (W_l x_l + b_l) + x_l        W_l [N, N]
    LowRankCrossNet  (DCN-v2, low rank)    x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l  V_l [r, N], U_l [N, r]
    VectorCrossNet   (DCN v1)              x_{l+1} = x_0 * (x_l . w_l) + b_l + x_l     w_l [N]

Shapes: ``[B, N] -> [B, N]``. ``*`` is elementwise; ``x_l . w_l`` a per-sample scalar.

Initialisation: matrices and vectors are Xavier-normal, biases zero, so a fresh cross net is
close to the identity plus a small second-order term; all draws come from torch's global RNG,
so ``torch.manual_seed`` makes them reproducible.
"""

import torch
from torch import nn

from lightrec.modules import _dense_checks as _checks

__all__ = ["CrossNet", "LowRankCrossNet", "VectorCrossNet"]


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class CrossNet(nn.Module):
    """Full-rank DCN-v2 cross net: ``x_{l+1} = x_0 * (W_l x_l + b_l) + x_l``.

    Args:
        in_features: ``N``, the width of the input (and output).
        num_layers: ``L``, the number of cross layers.
        device: where the parameters are created (``"meta"`` allocates nothing).
        dtype: parameter dtype.

    Shapes:
        ``[B, N] -> [B, N]``. Parameters: ``L`` matrices ``[N, N]`` and ``L`` biases ``[N]``
        (``L * (N^2 + N)`` numbers; use ``LowRankCrossNet`` when ``N`` is large).
    """

    def __init__(
        self,
        in_features: int,
        num_layers: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self._in_features = _positive("in_features", in_features)
        self._num_layers = _positive("num_layers", num_layers)
        self.layers = nn.ModuleList(
            [nn.Linear(in_features, in_features, bias=True, device=device, dtype=dtype) for _ in range(num_layers)]
        )
        self.reset_parameters()

    @property
    def in_features(self) -> int:
        return self._in_features

    @property
    def num_layers(self) -> int:
        return self._num_layers

    def reset_parameters(self) -> None:
        """Xavier-normal weights, zero biases."""
        for layer in self.layers:
            assert isinstance(layer, nn.Linear)  # built in __init__
            if layer.weight.device.type == "meta":
                continue
            nn.init.xavier_normal_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, N] -> [B, N]``."""
        _checks.check_matrix("CrossNet input", x, self._in_features)
        x0 = x
        xl = x
        for layer in self.layers:
            xl = x0 * layer(xl) + xl
        return xl


class LowRankCrossNet(nn.Module):
    """Low-rank DCN-v2 cross net: ``x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l``.

    Args:
        in_features: ``N``, the width of the input (and output).
        num_layers: ``L``, the number of cross layers.
        low_rank: ``r``, the rank of each ``W_l = U_l V_l``; ``2 r < N`` saves parameters.
        device: where the parameters are created (``"meta"`` allocates nothing).
        dtype: parameter dtype.

    Shapes:
        ``[B, N] -> [B, N]``. Parameters per layer: ``V_l [r, N]``, ``U_l [N, r]``, ``b_l [N]``.
    """

    def __init__(
        self,
        in_features: int,
        num_layers: int,
        low_rank: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self._in_features = _positive("in_features", in_features)
        self._num_layers = _positive("num_layers", num_layers)
        self._low_rank = _positive("low_rank", low_rank)
        self.down = nn.ModuleList(
            [nn.Linear(in_features, low_rank, bias=False, device=device, dtype=dtype) for _ in range(num_layers)]
        )
        self.up = nn.ModuleList(
            [nn.Linear(low_rank, in_features, bias=True, device=device, dtype=dtype) for _ in range(num_layers)]
        )
        self.reset_parameters()

    @property
    def in_features(self) -> int:
        return self._in_features

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @property
    def low_rank(self) -> int:
        return self._low_rank

    def reset_parameters(self) -> None:
        """Xavier-normal ``U_l`` and ``V_l``, zero biases."""
        for down, up in zip(self.down, self.up, strict=True):
            assert isinstance(down, nn.Linear) and isinstance(up, nn.Linear)  # built in __init__
            if down.weight.device.type == "meta":
                continue
            nn.init.xavier_normal_(down.weight)
            nn.init.xavier_normal_(up.weight)
            nn.init.zeros_(up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, N] -> [B, N]``."""
        _checks.check_matrix("LowRankCrossNet input", x, self._in_features)
        x0 = x
        xl = x
        for down, up in zip(self.down, self.up):  # noqa: B905 - TorchScript has no zip(strict=)
            xl = x0 * up(down(xl)) + xl
        return xl


class VectorCrossNet(nn.Module):
    """DCN (v1) cross net: ``x_{l+1} = x_0 * (x_l . w_l) + b_l + x_l``.

    Args:
        in_features: ``N``, the width of the input (and output).
        num_layers: ``L``, the number of cross layers.
        device: where the parameters are created (``"meta"`` allocates nothing).
        dtype: parameter dtype.

    Shapes:
        ``[B, N] -> [B, N]``. Parameters: ``kernels [L, N]``, ``biases [L, N]``.
    """

    def __init__(
        self,
        in_features: int,
        num_layers: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self._in_features = _positive("in_features", in_features)
        self._num_layers = _positive("num_layers", num_layers)
        self.kernels = nn.Parameter(torch.empty(num_layers, in_features, device=device, dtype=dtype))
        self.biases = nn.Parameter(torch.empty(num_layers, in_features, device=device, dtype=dtype))
        self.reset_parameters()

    @property
    def in_features(self) -> int:
        return self._in_features

    @property
    def num_layers(self) -> int:
        return self._num_layers

    def reset_parameters(self) -> None:
        """Xavier-normal kernels (each as an ``[N, 1]`` matrix), zero biases."""
        if self.kernels.device.type == "meta":
            return
        with torch.no_grad():
            for layer in range(self._num_layers):
                nn.init.xavier_normal_(self.kernels[layer].view(-1, 1))
            self.biases.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, N] -> [B, N]``."""
        _checks.check_matrix("VectorCrossNet input", x, self._in_features)
        x0 = x
        xl = x
        for layer in range(self._num_layers):
            # [B, N] @ [N, 1] -> [B, 1]: one scalar per sample scales x_0.
            scale = torch.matmul(xl, self.kernels[layer].unsqueeze(1))
            xl = x0 * scale + self.biases[layer] + xl
        return xl
