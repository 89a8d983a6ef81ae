"""Multi-layer perceptrons: the dense towers of DLRM, DCN, DeepFM and two-tower models.

``Perceptron`` is one ``Linear`` followed by an activation; ``MLP`` stacks them::

    x [*, in_size] -> Linear(in_size, s0) -> act -> Linear(s0, s1) -> act -> ... -> [*, s_last]

Every layer, the last one included, ends with the activation (torchrec's ``MLP`` does the same);
models that need a raw logit or an unconstrained embedding put a plain ``nn.Linear`` after it.

The modules are plain ``nn.Module`` trees of ``nn.Linear`` and activation modules, so they work
under ``torch.fx.symbolic_trace``, ``torch.jit.script`` and ``torch.compile``. This file does not
use ``from __future__ import annotations``: fx copies ``forward`` annotations into generated code,
and string annotations would stop ``torch.jit.script`` of a traced ``GraphModule``.
"""

import copy
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MLP", "ActivationSpec", "Perceptron", "make_activation"]

ActivationSpec = str | nn.Module | type[nn.Module] | Callable[[torch.Tensor], torch.Tensor] | None
"""What ``activation=`` accepts: a name (``"relu"``), a module instance (copied per layer), a module
class (instantiated per layer), a function such as ``torch.relu``, or ``None`` for identity."""

_NAMED_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
    "elu": nn.ELU,
    "identity": nn.Identity,
    "linear": nn.Identity,
}

# Functions users pass in torchrec style (``activation=torch.relu``) map to their module form, so the
# result stays scriptable; any other callable is wrapped in ``_FunctionActivation``.
_FUNCTION_ACTIVATIONS: dict[Callable[..., torch.Tensor], Callable[[], nn.Module]] = {
    torch.relu: nn.ReLU,
    F.relu: nn.ReLU,
    torch.sigmoid: nn.Sigmoid,
    F.sigmoid: nn.Sigmoid,
    torch.tanh: nn.Tanh,
    F.tanh: nn.Tanh,
    F.gelu: nn.GELU,
    F.silu: nn.SiLU,
}


class _FunctionActivation(nn.Module):
    """Holds an arbitrary elementwise function (works eagerly and under fx; not scriptable)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))


def make_activation(activation: ActivationSpec) -> nn.Module:
    """A fresh activation module for one layer.

    Args:
        activation: see ``ActivationSpec``; names are case-insensitive.

    Raises:
        ValueError: an unknown activation name (the message lists the known ones).
        TypeError: something that is neither a name, a module, a module class nor a callable.
    """
    if activation is None:
        return nn.Identity()
    if isinstance(activation, str):
        factory = _NAMED_ACTIVATIONS.get(activation.lower())
        if factory is None:
            raise ValueError(
                f"activation={activation!r} is not a known activation name; use one of "
                f"{sorted(_NAMED_ACTIVATIONS)}, an nn.Module, or a function such as torch.relu"
            )
        return factory()
    if isinstance(activation, nn.Module):
        # Deep-copied so that a parametrised activation (e.g. nn.PReLU) is not shared between layers.
        return copy.deepcopy(activation)
    if isinstance(activation, type) and issubclass(activation, nn.Module):
        return activation()
    if callable(activation):
        factory = _FUNCTION_ACTIVATIONS.get(activation)  # type: ignore[arg-type]
        return factory() if factory is not None else _FunctionActivation(activation)
    raise TypeError(
        f"activation must be a name, an nn.Module, an nn.Module class or a function, got "
        f"{type(activation).__name__}: {activation!r}"
    )


def _check_size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_layer_sizes(name: str, layer_sizes: Sequence[int]) -> list[int]:
    """Validate a list of layer widths (non-empty, positive ints) and return it as a list."""
    if isinstance(layer_sizes, (int, str)) or not isinstance(layer_sizes, Sequence):
        raise TypeError(f"{name} must be a list of positive ints, got {layer_sizes!r}")
    sizes = list(layer_sizes)
    if len(sizes) == 0:
        raise ValueError(f"{name} must name at least one layer width, got an empty list")
    for i, s in enumerate(sizes):
        _check_size(f"{name}[{i}]", s)
    return sizes


class Perceptron(nn.Module):
    """One fully connected layer followed by an activation.

    Args:
        in_size: input width.
        out_size: output width.
        bias: whether the linear layer has a bias.
        activation: see ``ActivationSpec`` (default ReLU).
        device: where the parameters are created (``"meta"`` allocates nothing).
        dtype: parameter dtype (default: torch's default dtype).

    Shapes:
        ``[*, in_size] -> [*, out_size]``.
    """

    def __init__(
        self,
        in_size: int,
        out_size: int,
        bias: bool = True,
        activation: ActivationSpec = "relu",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self._in_size = _check_size("in_size", in_size)
        self._out_size = _check_size("out_size", out_size)
        self.linear = nn.Linear(in_size, out_size, bias=bias, device=device, dtype=dtype)
        self.activation = make_activation(activation)

    @property
    def in_size(self) -> int:
        return self._in_size

    @property
    def out_size(self) -> int:
        return self._out_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x))


class MLP(nn.Module):
    """A stack of ``Perceptron`` layers of widths ``layer_sizes``.

    Args:
        in_size: input width.
        layer_sizes: output width of each layer, e.g. ``[512, 256, 64]``.
        bias: whether the linear layers have biases.
        activation: applied after every layer, the last included (see ``ActivationSpec``).
        device: where the parameters are created (``"meta"`` allocates nothing).
        dtype: parameter dtype (default: torch's default dtype).

    Shapes:
        ``[*, in_size] -> [*, layer_sizes[-1]]``.

    Example::

        >>> mlp = MLP(13, [512, 256, 64])
        >>> mlp(torch.randn(8, 13)).shape
        torch.Size([8, 64])
    """

    def __init__(
        self,
        in_size: int,
        layer_sizes: Sequence[int],
        bias: bool = True,
        activation: ActivationSpec = "relu",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _check_size("in_size", in_size)
        sizes = check_layer_sizes("layer_sizes", layer_sizes)
        self._in_size = in_size
        self._layer_sizes = sizes
        widths = [in_size] + sizes
        self._mlp = nn.Sequential(
            *[
                Perceptron(widths[i], widths[i + 1], bias=bias, activation=activation, device=device, dtype=dtype)
                for i in range(len(sizes))
            ]
        )

    @property
    def in_size(self) -> int:
        return self._in_size

    @property
    def out_size(self) -> int:
        return self._layer_sizes[-1]

    @property
    def layer_sizes(self) -> list[int]:
        return list(self._layer_sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[*, in_size] -> [*, layer_sizes[-1]]``."""
        return self._mlp(x)
