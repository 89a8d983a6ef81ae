"""Gather a model-parallel model into a serving copy: full tables from the ranks that hold them.

A model sharded by ``DistributedModelParallel`` (or by ``RecStrategy``, which uses it) holds each
table as blocks spread over ranks. :func:`lightrec.inference.quantize` and
:func:`lightrec.inference.export` accept such a model (or the ``DistributedModelParallel`` itself)
and turn it into an unsharded serving copy with this module. Both are **collectives**: every rank
of the sharding group calls them with the same arguments::

    qmodel = quantize(dmp, dtype="int8", dst=0)       # the quantized copy on rank 0, None elsewhere
    if rank == 0:
        export(qmodel, "dlrm.pt")
    export(dmp, "dlrm_fp32.pt")                       # float copy gathered to rank 0, which writes it

Tables travel one at a time (``lightrec.distributed.sharding.state_dict.gather_full_state_dict`` on a
one-entry state dict) and the receiving rank quantizes each as it arrives, so it never holds more
than one full float table besides the quantized ones. Data-parallel (replicated) tables are read
locally; dense layers are copied from the local replica (DDP keeps them equal on every rank).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import cast

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.model_parallel import DistributedModelParallel
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.state_dict import gather_full_state_dict
from lightrec.modules.embedding_configs import BaseEmbeddingConfig, EmbeddingBagConfig, EmbeddingConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.quant.embedding_collection import QuantEmbeddingCollection
from lightrec.quant.embedding_modules import QuantEmbeddingBagCollection
from lightrec.quant.managed_collision import (
    QuantManagedCollisionEmbeddingBagCollection,
    QuantManagedCollisionEmbeddingCollection,
)

__all__ = [
    "has_sharded_collections",
    "quantize_sharded_collection",
    "run_on_rank",
    "sharded_collections",
    "sharding_group",
    "unshard",
    "unwrap_model_parallel",
]


def unwrap_model_parallel(model: nn.Module) -> nn.Module:
    """The sharded model inside a ``DistributedModelParallel`` (without its DDP wrapper), else ``model``."""
    return model.module if isinstance(model, DistributedModelParallel) else model


def sharded_collections(model: nn.Module) -> list[tuple[str, ShardedCollectionBase]]:
    """``(path, module)`` of every sharded embedding collection in ``model`` (module order)."""
    return [(path, m) for path, m in unwrap_model_parallel(model).named_modules() if isinstance(m, ShardedCollectionBase)]


def has_sharded_collections(model: nn.Module) -> bool:
    """True when ``model`` (or the model inside a ``DistributedModelParallel``) holds sharded tables."""
    return bool(sharded_collections(model))


def sharding_group(model: nn.Module) -> tuple[dist.ProcessGroup | None, int, int]:
    """``(process group, rank in it, its size)`` of the model's sharded collections.

    Raises:
        ValueError: the collections are sharded over different groups (gather them separately).
    """
    envs = [m._env for _, m in sharded_collections(model)]
    if not envs:
        return None, 0, 1
    first = envs[0]
    if any(e.pg is not first.pg for e in envs[1:]):
        raise ValueError("the model's sharded collections use different process groups; quantize each collection "
                         "separately (lightrec.inference.quantize(collection, dst=...))")
    return first.pg, first.rank, first.world_size


def _check_dst(dst: int | None, world_size: int) -> None:
    if dst is not None and (isinstance(dst, bool) or not isinstance(dst, int) or not 0 <= dst < world_size):
        raise ValueError(f"dst must be None (every rank) or a rank in [0, {world_size}), got {dst!r}")


def _gathered_tables(collection: ShardedCollectionBase, dst: int | None) -> Iterator[tuple[BaseEmbeddingConfig, torch.Tensor | None]]:
    """Yield ``(config, full float table [rows, D] or None on ranks that do not receive it)``, one
    table at a time (a collective per model-parallel table, in config order on every rank)."""
    env = collection._env
    state = collection.state_dict()
    for config in collection._configs:
        key = f"{collection._state_prefix}{collection._attr}.{config.name}.weight"
        full = gather_full_state_dict({key: state[key]}, env.pg, dst)
        yield config, (full[key] if key in full else None)


def quantize_sharded_collection(
    collection: ShardedCollectionBase,
    dtype: object,
    per_table: dict[str, object] | None = None,
    row_alignment: int = 16,
    kernel_backend: str = "auto",
    dst: int | None = None,
) -> nn.Module | None:
    """Quantized CPU copy of one sharded collection (collective over its group).

    ``kernel_backend`` picks the quantized collection's lookup kernel (``resolve_quant_kernel``).

    Returns:
        A ``QuantEmbeddingBagCollection`` (pooled) or ``QuantEmbeddingCollection`` on rank ``dst``
        (every rank when ``dst`` is None); None on the other ranks.
    """
    env = collection._env
    _check_dst(dst, env.world_size)
    gather_unsharded = getattr(collection, "gather_unsharded", None)
    if callable(gather_unsharded):  # a managed-collision collection: tables and id maps together
        unsharded = gather_unsharded(dst)
        if unsharded is None:
            return None
        cls = QuantManagedCollisionEmbeddingBagCollection if collection._pooled else QuantManagedCollisionEmbeddingCollection
        managed: nn.Module = cls.from_float(unsharded, dtype=dtype, per_table=per_table, row_alignment=row_alignment,
                                            kernel_backend=kernel_backend)  # fmt: skip
        return managed
    quantized: QuantEmbeddingBagCollection | QuantEmbeddingCollection | None = None
    bounds_check = collection._id_bounds.mode  # the trained collection's policy for ids past a table, as unsharded
    if dst is None or env.rank == dst:
        if collection._pooled:  # a pooled collection holds EmbeddingBagConfigs, a sequence one EmbeddingConfigs
            quantized = QuantEmbeddingBagCollection(
                cast(list[EmbeddingBagConfig], list(collection._configs)), is_weighted=collection._is_weighted,
                device="cpu", dtype=dtype, per_table=per_table, row_alignment=row_alignment, bounds_check=bounds_check,
                kernel_backend=kernel_backend)  # fmt: skip
        else:
            quantized = QuantEmbeddingCollection(
                cast(list[EmbeddingConfig], list(collection._configs)), device="cpu", dtype=dtype,
                per_table=per_table, row_alignment=row_alignment, bounds_check=bounds_check,
                kernel_backend=kernel_backend)  # fmt: skip
    for config, full in _gathered_tables(collection, dst):
        if quantized is not None and full is not None:  # (the receiving ranks get every table)
            quantized.set_float_weight(config.name, full)
    return quantized


def _unsharded_float(collection: ShardedCollectionBase, dst: int | None) -> nn.Module | None:
    gather_unsharded = getattr(collection, "gather_unsharded", None)
    if callable(gather_unsharded):  # a managed-collision collection: tables and id maps together
        unsharded: nn.Module | None = gather_unsharded(dst)
        return unsharded
    env = collection._env
    plain: nn.Module | None = None
    if dst is None or env.rank == dst:
        configs = list(collection._configs)  # EmbeddingBagConfigs when pooled, else EmbeddingConfigs
        bounds_check = collection._id_bounds.mode
        plain = (EmbeddingBagCollection(cast(list[EmbeddingBagConfig], configs), is_weighted=collection._is_weighted,
                                        device="meta", bounds_check=bounds_check)
                 if collection._pooled else
                 EmbeddingCollection(cast(list[EmbeddingConfig], configs), device="meta", bounds_check=bounds_check))
    for config, full in _gathered_tables(collection, dst):
        if plain is not None and full is not None:
            holder: nn.Module = getattr(plain, collection._attr)[config.name]
            holder.weight = nn.Parameter(full.float(), requires_grad=False)
    return plain


def _copy_with(model: nn.Module, replacements: dict[int, nn.Module]) -> nn.Module:
    """A deep copy of ``model`` in which the modules ``replacements`` names (by id) are swapped in
    as they are (never copied): sharded collections and their process groups are not copied."""
    if id(model) in replacements:
        return replacements[id(model)]
    return copy.deepcopy(model, dict(replacements))


def unshard(model: nn.Module, dst: int | None = 0) -> nn.Module | None:
    """Float copy of a sharded model with plain collections holding the full tables (collective).

    Args:
        model: a ``DistributedModelParallel`` or a model holding sharded collections.
        dst: the rank (in the sharding group) that receives the copy; None: every rank.

    Returns:
        The unsharded copy, on CPU tables, in eval mode, on the receiving rank(s); None elsewhere.
    """
    root = unwrap_model_parallel(model)
    found = sharded_collections(root)
    _, rank, world_size = sharding_group(root)
    _check_dst(dst, world_size)
    replacements = {id(m): _unsharded_float(m, dst) for _, m in found}
    if dst is not None and rank != dst:
        return None
    return _copy_with(root, replacements).eval()  # type: ignore[arg-type]


def run_on_rank(
    build: Callable[[], nn.Module | None],
    action: Callable[[nn.Module], object],
    what: str,
    group: dist.ProcessGroup | None = None,
    dst: int = 0,
    failure: type[Exception] = RuntimeError,
) -> None:
    """Collective: every rank runs ``build`` (which may gather), rank ``dst`` runs ``action`` on the
    model it returns, then every rank learns whether that worked.

    Raises:
        failure: on the other ranks when rank ``dst`` failed (rank ``dst`` raises the original
            error), naming ``what`` rank ``dst`` was doing; also on rank ``dst`` when ``build``
            gave it no model.
    """
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
    rank = dist.get_rank(group) if distributed else 0
    error: BaseException | None = None
    try:
        model = build()
        if rank == dst:
            if model is None:
                raise failure(f"rank {dst} received no model to {what}; build it with dst={dst}")
            action(model)
    except Exception as exc:  # reported to every rank below, then re-raised here
        error = exc
    if distributed:
        status = [None if error is None else f"{type(error).__name__}: {error}"]
        source = dist.get_global_rank(group or dist.group.WORLD, dst)  # type: ignore[arg-type]
        dist.broadcast_object_list(status, src=source, group=group)
        if error is None and status[0] is not None:
            raise failure(f"rank {dst} failed to {what}: {status[0]}")
    if error is not None:
        raise error

