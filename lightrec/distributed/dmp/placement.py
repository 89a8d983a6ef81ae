"""Device placement of a model whose embedding collections are placed by a sharding plan.

A sharded model has two kinds of state:

* the **dense part** -- every parameter, buffer and any other device state outside the embedding
  collections (MLPs, interaction index buffers, torchmetrics metric states, which are neither
  parameters nor buffers). It is replicated on every rank and belongs on the rank's device;
* the **embedding collections** -- unsharded ones (possibly on ``meta``) are placed by their
  sharder, sharded ones already live where the plan put them. Their storage is more than
  parameters (fused optimizer state, id-bound and column-index tensors, kernel caches), so a
  generic ``module.to(device)`` would move some of it and not the rest.

:func:`move_dense_to_device` moves the first kind with the module's own ``.to()`` -- so every
module kind's ``_apply`` runs (torchmetrics ``Metric`` moves its states there, a
``LightningModule`` updates its ``device``) -- while the collections are taken out of the module
tree for the duration of the call, and so are never touched::

    root                      root.to(device) sees        afterwards
    ├─ dense_arch (MLP)       ├─ dense_arch  -> device     ├─ dense_arch   on device
    ├─ sparse_arch            ├─ sparse_arch               ├─ sparse_arch
    │  └─ ebc (sharded)       │  └─ None (detached)        │  └─ ebc       untouched
    └─ val_metrics (states)   └─ val_metrics -> device     └─ val_metrics  on device
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["detached", "move_dense_to_device", "outermost"]


def outermost(module: nn.Module, kinds: tuple[type[nn.Module], ...]) -> list[tuple[str, nn.Module]]:
    """``(path, submodule)`` of every submodule of one of ``kinds`` not inside another such one."""
    found: list[tuple[str, nn.Module]] = []
    for path, child in module.named_modules():
        if isinstance(child, kinds) and not any(path.startswith(p + ".") or p == "" for p, _ in found):
            found.append((path, child))
    return found


@contextlib.contextmanager
def detached(module: nn.Module, kinds: tuple[type[nn.Module], ...]) -> Iterator[list[tuple[str, nn.Module]]]:
    """Take every outermost submodule of ``kinds`` out of ``module``'s tree, and put it back after.

    Inside the block ``module.children()``/``modules()``/``_apply`` (so ``.to()``, ``.cpu()``,
    ``.float()``) do not reach them; their parent's slot holds ``None`` (as an optional submodule
    does), so the order of the remaining children is unchanged. ``module`` itself is never detached.

    Yields:
        The detached ``(path, submodule)`` pairs.
    """
    taken = [(p, m) for p, m in outermost(module, kinds) if p != ""]
    slots = []
    for path, child in taken:
        parent_path, _, name = path.rpartition(".")
        parent = module.get_submodule(parent_path)
        slots.append((parent, name, child))
    for parent, name, _ in slots:
        parent._modules[name] = None
    try:
        yield taken
    finally:
        for parent, name, child in slots:
            parent._modules[name] = child


def _own_tensors(module: nn.Module) -> list[torch.Tensor]:
    return list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))


def _materialize_meta(module: nn.Module, device: torch.device, keep: tuple[type[nn.Module], ...]) -> None:
    """``to_empty`` + ``reset_parameters`` for every module (outside ``keep``) holding ``meta`` tensors.

    The same seed on every rank gives the same values; data-parallel wrappers broadcast rank 0's anyway.
    """
    if isinstance(module, keep):
        return
    for child in module.children():
        _materialize_meta(child, device, keep)
    if any(t.is_meta for t in _own_tensors(module)):
        module.to_empty(device=device, recurse=False)
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()


def move_dense_to_device(
    module: nn.Module, device: torch.device | str, keep: tuple[type[nn.Module], ...]
) -> None:
    """Move everything of ``module`` outside the submodules of ``keep`` to ``device``.

    Dense modules still on ``meta`` are materialised empty on ``device`` and re-initialised with
    their own ``reset_parameters``. Parameters keep their identity (an optimizer built before the
    move stays valid). Submodules of ``keep`` kinds -- embedding collections, sharded or on
    ``meta`` -- are neither moved nor materialised (see the module docstring).

    Args:
        module: the model (a ``LightningModule`` or any ``nn.Module``).
        device: where the dense part goes.
        keep: module kinds left where they are.
    """
    device = torch.device(device)
    if isinstance(module, keep):
        return
    _materialize_meta(module, device, keep)
    with detached(module, keep):
        module.to(device)
