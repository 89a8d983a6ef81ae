"""Saying "this parameter is optimized inside backward" (torch.distributed.optim's convention).

``apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": 0.1})`` does two things,
as ``torch.distributed.optim._apply_optimizer_in_backward`` does:

* it marks each parameter with ``_in_backward_optimizers`` (optimizer instances),
  ``_optimizer_classes`` and ``_optimizer_kwargs``, so that a fused/sharded embedding collection
  built from the module later reads the marks (:func:`fused_spec_from_parameter`) and fuses the
  same update into its lookup kernel;
* on a plain module it really steps the optimizer right after the parameter's gradient is
  accumulated (and frees the gradient), so the marked module trains before it is converted too.

Before and after conversion agree on every row a batch looks up. A row the batch does not look up
differs where the rule moves a row with a zero gradient: the plain module's torch optimizer steps
the whole dense weight (``torch.optim.Adam`` decays the row's moments and moves it by them, L2 or
decoupled weight decay shrinks it), the fused rule leaves the row and its state as they are, as
fbgemm does (Adam's step counter still advances once per backward pass). torchrec trains the same
two ways before and after sharding. SGD and Adagrad without weight decay agree on every row.

:func:`in_backward_optimizer_filter` then yields the parameters a dense optimizer must still handle.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch

from lightrec.optim.fused_spec import FusedOptimizerSpec, optimizer_class_to_spec

__all__ = ["apply_optimizer_in_backward", "fused_spec_from_parameter", "in_backward_optimizer_filter"]

_TensorT = TypeVar("_TensorT", bound=torch.Tensor)  # a Parameter stays typed as one


def apply_optimizer_in_backward(
    optimizer_class: type[torch.optim.Optimizer],
    params: Iterable[torch.Tensor],
    optimizer_kwargs: dict[str, Any],
    register_hook: bool = True,
) -> None:
    """Mark ``params`` as optimized in backward by ``optimizer_class(**optimizer_kwargs)``.

    Args:
        optimizer_class: a ``torch.optim.Optimizer`` subclass.
        params: parameters to mark (each gets its own optimizer instance).
        optimizer_kwargs: keyword arguments of the optimizer (``{"lr": 0.5}``).
        register_hook: also step the optimizer from a post-accumulate-grad hook, so the
            unconverted module trains in backward too.
    """
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise TypeError(f"optimizer_class must be a torch.optim.Optimizer subclass, got {optimizer_class!r}")
    if not isinstance(optimizer_kwargs, dict):
        raise TypeError(f"optimizer_kwargs must be a dict, got {type(optimizer_kwargs).__name__}")
    for param in params:
        if not isinstance(param, torch.Tensor) or not param.requires_grad:
            raise ValueError("apply_optimizer_in_backward needs leaf tensors that require grad")
        optimizer = optimizer_class([param], **optimizer_kwargs)
        for attr, value in (
            ("_in_backward_optimizers", optimizer),
            ("_optimizer_classes", optimizer_class),
            ("_optimizer_kwargs", dict(optimizer_kwargs)),
        ):
            if not hasattr(param, attr):
                setattr(param, attr, [])
            getattr(param, attr).append(value)
        # One hook per parameter steps every optimizer applied to it, then frees the gradient (as
        # torch's hook does): a hook per optimizer that freed the gradient after its own step left
        # the next optimizer nothing to step with.
        if register_hook and not hasattr(param, "_optimizer_hook_handles"):
            optimizers: list[torch.optim.Optimizer] = param._in_backward_optimizers  # type: ignore[attr-defined]

            def _step(p: torch.Tensor, optimizers: list[torch.optim.Optimizer] = optimizers) -> None:
                for opt in optimizers:
                    opt.step()
                p.grad = None

            param._optimizer_hook_handles = [param.register_post_accumulate_grad_hook(_step)]  # type: ignore[attr-defined]


def fused_spec_from_parameter(param: torch.Tensor) -> FusedOptimizerSpec | None:
    """The fused optimizer a marked parameter asks for, or None if it is not marked.

    Raises ``ValueError`` if several different optimizers were applied to the same parameter.
    """
    classes = getattr(param, "_optimizer_classes", None)
    if not classes:
        return None
    kwargs = getattr(param, "_optimizer_kwargs", [{}] * len(classes))
    specs = [optimizer_class_to_spec(c, k) for c, k in zip(classes, kwargs, strict=True)]
    if any(s != specs[0] for s in specs[1:]):
        raise ValueError(f"parameter has several in-backward optimizers {classes}; fused lookups take one")
    return specs[0]


def in_backward_optimizer_filter(
    named_parameters: Iterable[tuple[str, _TensorT]], include: bool = False
) -> Iterator[tuple[str, _TensorT]]:
    """Yield ``(name, param)`` pairs NOT optimized in backward (``include=True``: only those that are)."""
    for name, param in named_parameters:
        if hasattr(param, "_in_backward_optimizers") == include:
            yield name, param
