"""Input shape checks shared by the dense blocks (interaction, cross nets, model arches).

The checks run on every forward. They are registered with ``torch.fx.wrap`` so that
``torch.fx.symbolic_trace`` records them as calls instead of tracing into them (a Python ``if``
on a traced shape would fail), which keeps the same clear error inside a traced ``GraphModule``.
They are written in the TorchScript subset (string concatenation, no f-strings) so that
``torch.jit.script`` of a module using them works too; scripted code re-raises them as
``torch.jit.Error`` whose message names ``DenseShapeError``.
"""

import torch

__all__ = ["DenseShapeError", "check_batch_size", "check_matrix", "check_positive_int", "check_stacked"]


class DenseShapeError(ValueError):
    """A dense input does not have the shape the module was built for."""


def check_matrix(name: str, x: torch.Tensor, width: int) -> None:
    """Raise ``DenseShapeError`` unless ``x`` is a floating-point ``[B, width]``.

    An integer input (dense features read as int64, a label tensor passed by mistake) used to
    fail inside the first matmul ("mat1 and mat2 must have the same dtype"), naming no argument.
    """
    if x.dim() != 2 or x.shape[1] != width:
        raise DenseShapeError(
            name + " must have shape [batch_size, " + str(width) + "], got " + str(list(x.shape))
            + "; check the in_features the module was built with"
        )
    if not x.is_floating_point():
        raise DenseShapeError(
            name + " must be a floating-point tensor (like the module's weights, e.g. float32), got dtype "
            + str(x.dtype) + "; convert it with .float() (dense features are continuous values)"
        )


def check_stacked(name: str, x: torch.Tensor, num: int, width: int) -> None:
    """Raise ``DenseShapeError`` unless ``x`` is ``[B, num, width]``."""
    if x.dim() != 3 or x.shape[1] != num or x.shape[2] != width:
        raise DenseShapeError(
            name + " must have shape [batch_size, " + str(num) + ", " + str(width) + "], got "
            + str(list(x.shape)) + "; check the number of features and the embedding dim"
        )


def check_batch_size(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    """Raise ``DenseShapeError`` unless ``a`` and ``b`` have the same leading (batch) size."""
    if a.shape[0] != b.shape[0]:
        raise DenseShapeError(
            name_a + " and " + name_b + " must have the same batch size, got " + str(a.shape[0])
            + " and " + str(b.shape[0])
        )


torch.fx.wrap("check_matrix")
torch.fx.wrap("check_stacked")
torch.fx.wrap("check_batch_size")


def check_positive_int(name: str, value: object) -> int:
    """``value`` when it is an int >= 1 (not a bool), else a ``ValueError`` naming ``name`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value
