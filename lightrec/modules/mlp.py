"""Multi-layer perceptrons: the dense towers of DLRM, DCN, DeepFM and two-tower models.

``Perceptron`` is one ``Linear`` followed by an activation; ``MLP`` stacks them::

    x [*, in_size] -> Linear(in_size, s0) -> act -> Linear(s0, s1) -> act -> ... -> [*, s_last]

Every layer, the last one included, ends with the activation (torchrec's ``MLP`` does the same);
models that need a raw logit or an unconstrained embedding put a plain ``nn.Linear`` after it.

The modules are plain ``nn.Module`` trees of ``nn.Linear`` and activation modules, so they work
under ``torch.fx.symbolic_trace``, ``torch.jit.script`` and ``torch.compile``. This file does not
use ``from __future__ import annotations``: fx copies ``forward`` annotations into generated code,
and string annotations would stop ``torch.jit.script`` of a traced ``GraphModule``.

Backward GEMM layout. For ``y = x W^T + b`` autograd computes ``dX = dY W`` (``[B, in]``) and
``dW = dY^T X`` (``[out, in]``) as written. BLAS is markedly slower when the rows of a GEMM's
output are not a whole number of 64-byte lines: measured on one CPU thread (MKL, AVX-512),
B = 2048, a 415 -> 512 layer takes 14.4 ms for ``dX`` and 10.4 ms for ``dW``, against 10.2 and
9.4 ms when each is computed as the transposed product (``(W^T dY^T)^T``, ``(X^T dY)^T``, rows of
2048 and 512) and copied back to row-major; a 13 -> 512 layer's ``dW`` drops from 1.4 to 0.5 ms.
``Perceptron`` therefore runs its ``nn.Linear`` under :class:`_LayoutAwareLinear` in eager
training: the module call itself is unchanged (its hooks, its forward -- the same kernel, bit
for bit), only the gradient of ``F.linear`` picks, per product, the orientation whose output rows
are 64-byte aligned (same products and sums; the rounding may differ in the last bit).
TorchScript, ``torch.fx`` proxies, ``torch.compile`` / ``torch.export`` and no-grad calls use
plain autograd.
"""

import copy
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from lightrec.modules._dense_checks import DenseShapeError, check_positive_int
from lightrec.modules.activation import SwishLayerNorm

__all__ = ["MLP", "ActivationSpec", "Perceptron", "make_activation"]

ActivationSpec = str | nn.Module | type[nn.Module] | Callable[[torch.Tensor], torch.Tensor] | None
"""What ``activation=`` accepts: a name (``"relu"``; ``"swish_layernorm"``, torchrec's
``x * sigmoid(LayerNorm(x))`` over the layer's width, in ``Perceptron`` / ``MLP`` only), a module
instance (copied per layer), a module class (instantiated per layer), a function such as
``torch.relu``, or ``None`` for identity."""

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


_WIDTH_ACTIVATIONS = ("swish_layernorm",)


def _layer_activation(
    activation: ActivationSpec, width: int, device: torch.device | str | None, dtype: torch.dtype | None
) -> nn.Module:
    """``make_activation``, plus the activations that need the layer's ``width`` (``"swish_layernorm"``)."""
    if isinstance(activation, str) and activation.lower() == "swish_layernorm":
        return SwishLayerNorm(width, device=device, dtype=dtype)
    return make_activation(activation)


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
            if activation.lower() in _WIDTH_ACTIVATIONS:
                raise ValueError(
                    f"activation={activation!r} needs the layer width; pass it to Perceptron or MLP, "
                    "which build one per layer"
                )
            raise ValueError(
                f"activation={activation!r} is not a known activation name; use one of "
                f"{sorted([*_NAMED_ACTIVATIONS, *_WIDTH_ACTIVATIONS])}, an nn.Module, or a function such as torch.relu"
            )
        return factory()
    if isinstance(activation, nn.Module):
        # Deep-copied so that a parametrised activation (e.g. nn.PReLU) is not shared between layers.
        return copy.deepcopy(activation)
    if isinstance(activation, type) and issubclass(activation, nn.Module):
        return activation()
    if callable(activation):
        fn = cast(Callable[[torch.Tensor], torch.Tensor], activation)  # a class that is not a module is called too
        factory = _FUNCTION_ACTIVATIONS.get(fn)
        return factory() if factory is not None else _FunctionActivation(fn)
    raise TypeError(
        f"activation must be a name, an nn.Module, an nn.Module class or a function, got "
        f"{type(activation).__name__}: {activation!r}"
    )



def check_layer_sizes(name: str, layer_sizes: Sequence[int]) -> list[int]:
    """Validate a list of layer widths (non-empty, positive ints) and return it as a list."""
    if isinstance(layer_sizes, (int, str)) or not isinstance(layer_sizes, Sequence):
        raise TypeError(f"{name} must be a list of positive ints, got {layer_sizes!r}")
    sizes = list(layer_sizes)
    if len(sizes) == 0:
        raise ValueError(f"{name} must name at least one layer width, got an empty list")
    for i, s in enumerate(sizes):
        check_positive_int(f"{name}[{i}]", s)
    return sizes


def check_last_dim(name: str, x: torch.Tensor, in_size: int) -> None:
    """Raise ``DenseShapeError`` unless ``x`` is ``[*, in_size]`` (a wrong width used to fail inside
    the matmul as "mat1 and mat2 shapes cannot be multiplied", naming no argument). Written in the
    TorchScript subset and ``torch.fx.wrap``-ed, like the checks of ``_dense_checks``."""
    if x.dim() == 0 or x.shape[-1] != in_size:
        raise DenseShapeError(
            name + " must have shape [*, " + str(in_size) + "] (its last dimension is in_size), got "
            + str(list(x.shape)) + "; pass inputs of width " + str(in_size)
            + " or build the module with in_size equal to the input's last dimension"
        )


torch.fx.wrap("check_last_dim")


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
        self._in_size = check_positive_int("in_size", in_size)
        self._out_size = check_positive_int("out_size", out_size)
        # ``_linear`` and ``_activation_fn``, torchrec's attribute names, so state dicts match torchrec's
        # key for key (a parametrised activation such as ``nn.PReLU`` saves ``_activation_fn.weight``)
        self._linear = nn.Linear(in_size, out_size, bias=bias, device=device, dtype=dtype)
        self._activation_fn = _layer_activation(activation, out_size, device, dtype)
        self.register_load_state_dict_pre_hook(_accept_earlier_keys)

    __jit_unused_properties__ = ["linear", "activation"]

    @property
    def linear(self) -> nn.Linear:
        """The fully connected layer (stored as ``_linear``)."""
        return self._linear

    @property
    def activation(self) -> nn.Module:
        """The activation module (stored as ``_activation_fn``)."""
        return self._activation_fn

    @property
    def in_size(self) -> int:
        return self._in_size

    @property
    def out_size(self) -> int:
        return self._out_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_last_dim("Perceptron input", x, self._in_size)
        # Annotated locals: nn.Module calls are untyped to mypy; TorchScript accepts the annotations.
        if torch.jit.is_scripting():
            scripted: torch.Tensor = self._activation_fn(self._linear(x))
            return scripted
        out: torch.Tensor = self._activation_fn(self._eager_linear(x))
        return out

    @torch.jit.unused
    def _eager_linear(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor) and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            with _LayoutAwareLinear():
                routed: torch.Tensor = self._linear(x)
            return routed
        y: torch.Tensor = self._linear(x)
        return y


# Earlier lightrec attribute names of a Perceptron's children -> torchrec's names, saved now.
_EARLIER_NAMES = {"linear.": "_linear.", "activation.": "_activation_fn."}


def _accept_earlier_keys(module: nn.Module, state_dict: dict[str, object], prefix: str, *args: object) -> None:
    """Load checkpoints of earlier lightrec versions: a Perceptron's layer was saved as ``linear``
    (before issue 37) and a parametrised activation (``nn.PReLU``) as ``activation``; their keys
    load as ``<prefix>_linear.*`` / ``<prefix>_activation_fn.*``, torchrec's names."""
    for old, new in _EARLIER_NAMES.items():
        for key in [k for k in state_dict if k.startswith(prefix + old)]:
            state_dict[prefix + new + key[len(prefix + old) :]] = state_dict.pop(key)


# Below this many multiply-adds the transposed product's extra copy costs more than it saves.
_MIN_TRANSPOSED_MACS = 1 << 20


def _transposed_is_aligned(m: int, k: int, n: int, element_size: int) -> bool:
    """Whether ``[m, k] @ [k, n]`` should be computed as the transposed product: only that one
    writes output rows of whole 64-byte lines, and it is big enough to pay for the copy back."""
    per_line = max(1, 64 // element_size)
    return bool(n % per_line) and not m % per_line and m * k * n >= _MIN_TRANSPOSED_MACS


def _aligned_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (2-D), as ``(b^T a^T)^T`` made contiguous when :func:`_transposed_is_aligned`."""
    if _transposed_is_aligned(a.shape[0], a.shape[1], b.shape[1], a.element_size()):
        return b.t().mm(a.t()).t().contiguous()
    return a.mm(b)


class _LinearContext(Protocol):
    """What :class:`_LinearFunction`'s forward leaves on the autograd context for its backward."""

    saved_tensors: tuple[torch.Tensor, ...]  # (x, weight)
    needs_input_grad: tuple[bool, ...]
    has_bias: bool

    def save_for_backward(self, *tensors: torch.Tensor) -> None: ...


class _LinearFunction(torch.autograd.Function):
    """``F.linear`` for 2-D inputs with the layout-aware backward GEMMs."""

    @staticmethod
    def forward(ctx: _LinearContext, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(
        ctx: _LinearContext, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        x, weight = ctx.saved_tensors
        grad_x = _aligned_product(grad, weight) if ctx.needs_input_grad[0] else None
        grad_w = _aligned_product(grad.t(), x) if ctx.needs_input_grad[1] else None
        grad_b = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


class _LayoutAwareLinear(TorchFunctionMode):
    """Routes 2-D ``F.linear`` calls that need a gradient through :class:`_LinearFunction`."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Collection[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2:  # nn.Linear passes (input, weight, bias) positionally
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            grads = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
            # Not under autocast (Trainer(precision="bf16-mixed")): the function's backward would meet
            # a bf16 gradient and the fp32 weight it saved; stock F.linear's autograd handles the casts.
            if grads and x.dim() == 2 and weight.dim() == 2 and x.layout == torch.strided and not torch.is_autocast_enabled(x.device.type):
                return _LinearFunction.apply(x, weight, bias)
        return func(*args, **kwargs)


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
        check_positive_int("in_size", in_size)
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
        check_last_dim("MLP input", x, self._in_size)
        out: torch.Tensor = self._mlp(x)
        return out
