"""``fuse_embedding_optimizer``: swap a model's embedding collections for their fused twins.

torchrec's function of the same name (``torchrec.modules.fused_embedding_modules``): every
``EmbeddingBagCollection`` / ``EmbeddingCollection`` inside ``model`` is replaced, in place, by a
``FusedEmbeddingBagCollection`` / ``FusedEmbeddingCollection`` with the same tables and weights
whose optimizer (``optimizer_type(**optimizer_kwargs)``) runs inside backward. The dense part of
the model is left alone; train it with an ordinary optimizer over the remaining parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from lightrec.kernels.fused_collection import FusedEmbeddingBagCollection, FusedEmbeddingCollection
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

__all__ = ["fuse_embedding_optimizer"]


def _fused_twin(
    module: nn.Module, optimizer_type: type, optimizer_kwargs: Mapping[str, object], device: torch.device | str | None
) -> nn.Module:
    if isinstance(module, EmbeddingBagCollection):
        fused: nn.Module = FusedEmbeddingBagCollection(
            module.embedding_bag_configs(), optimizer_type, optimizer_kwargs,
            is_weighted=module.is_weighted(), device=device,
        )  # fmt: skip
    else:
        assert isinstance(module, EmbeddingCollection)  # the caller picked only these two
        fused = FusedEmbeddingCollection(module.embedding_configs(), optimizer_type, optimizer_kwargs, device=device)
    fused.load_state_dict(module.state_dict())  # same keys: <attr>.<table>.weight
    return fused


def fuse_embedding_optimizer(
    model: nn.Module,
    optimizer_type: type,
    optimizer_kwargs: Mapping[str, object],
    device: torch.device | str | None,
    allow_empty: bool = False,
) -> nn.Module:
    """Replace every embedding collection of ``model`` by its fused twin (in place) and return ``model``.

    Args:
        model: a module holding ``EmbeddingBagCollection`` / ``EmbeddingCollection`` children (or one itself).
        optimizer_type / optimizer_kwargs: e.g. ``torch.optim.SGD, {"lr": 0.1}``.
        device: where the fused tables live.
        allow_empty: return ``model`` unchanged when it has no collection instead of raising.

    Raises:
        ValueError: ``model`` holds no embedding collection and ``allow_empty`` is False.
    """
    kinds = (EmbeddingBagCollection, EmbeddingCollection)
    if isinstance(model, kinds):
        return _fused_twin(model, optimizer_type, optimizer_kwargs, device)
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, kinds)]
    if not targets and not allow_empty:
        raise ValueError(
            f"fuse_embedding_optimizer: {type(model).__name__} holds no EmbeddingBagCollection or "
            "EmbeddingCollection; pass allow_empty=True to accept that"
        )
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _fused_twin(module, optimizer_type, optimizer_kwargs, device))
    return model
