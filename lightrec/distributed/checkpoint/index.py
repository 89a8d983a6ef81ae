"""Where a model's embedding tables live on this rank, and stable names for every parameter.

A *stable id* names a parameter the same way under every plan and world size, so optimizer state
can follow it from one layout to another: the state-dict key of its table's weight for embedding
shards (``model.sparse_arch.embedding_bag_collection.embedding_bags.t0.weight``), the
``named_parameters`` name for everything else (dense layers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lightrec.distributed.model_parallel import DistributedModelParallel
from lightrec.distributed.planner.plan import ShardingType, ShardMetadata
from lightrec.distributed.sharding.collection import ShardedCollectionBase

__all__ = ["LocalTable", "ParamIndex", "local_tables", "optimizer_params", "root_module"]


@dataclass
class LocalTable:
    """One embedding table of the model as this rank holds it.

    Attributes:
        key: state-dict key of the table's weight.
        global_shape: ``[rows, cols]`` of the full table.
        replicated: a data-parallel table (every rank holds all of it; rank 0 saves it).
        shards: ``(metadata, parameter)`` of each local shard.
    """

    key: str
    global_shape: list[int]
    replicated: bool
    shards: list[tuple[ShardMetadata, torch.Tensor]] = field(default_factory=list)


def root_module(module: nn.Module) -> nn.Module:
    """The module whose ``state_dict`` keys the checkpoint uses: a ``DistributedModelParallel``'s inner one."""
    # DistributedModelParallel.state_dict() is its inner module's; index that one.
    return module.module if isinstance(module, DistributedModelParallel) else module


def local_tables(module: nn.Module) -> dict[str, LocalTable]:
    """``{weight key: LocalTable}`` for every table of every sharded collection in ``module``."""
    out: dict[str, LocalTable] = {}
    for path, m in root_module(module).named_modules():
        if not isinstance(m, ShardedCollectionBase):
            continue
        prefix = f"{path}." if path else ""
        for c in m._configs:
            table = m._tables[c.name]
            key = f"{prefix}{m._state_prefix}{m._attr}.{c.name}.weight"
            out[key] = LocalTable(
                key,
                [c.num_embeddings, c.embedding_dim],
                table.sharding.sharding_type == ShardingType.DATA_PARALLEL.value,
                [(meta, p) for _, meta, p in m._local_params[c.name]],
            )
        for name, shape, blocks in m.row_state_tables():  # e.g. managed-collision id maps
            out[prefix + name] = LocalTable(prefix + name, shape, False, list(blocks))
    return out


class ParamIndex:
    """Stable ids of a module's parameters (see the module docstring)."""

    def __init__(self, module: nn.Module, tables: dict[str, LocalTable]) -> None:
        self.shard_of: dict[int, tuple[str, ShardMetadata]] = {
            id(p): (t.key, meta) for t in tables.values() for meta, p in t.shards
        }
        self.name_of: dict[int, str] = {id(p): n for n, p in root_module(module).named_parameters()}

    def stable_id(self, param: torch.Tensor, what: str) -> str:
        if id(param) in self.shard_of:
            return self.shard_of[id(param)][0]
        if id(param) in self.name_of:
            return self.name_of[id(param)]
        raise ValueError(
            f"{what} steps a parameter of shape {list(param.shape)} ({param.dtype}) that is not part of the "
            "checkpointed module; pass the optimizers of this module only (or the module they step)"
        )


def optimizer_params(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[int | str, torch.Tensor]:
    """``{key used in state_dict["state"]: parameter}`` (names for keyed optimizers, ints for torch's).

    ``state_dict["param_groups"][g]["params"]`` lists the keys of group ``g`` in the order of
    ``optimizer.param_groups[g]["params"]``, for torch's optimizers and lightrec's keyed ones alike.
    """
    keys: Sequence[int | str] = [k for g in state_dict["param_groups"] for k in g["params"]]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if len(keys) != len(params):
        raise ValueError(
            f"optimizer state_dict lists {len(keys)} parameters in its param_groups but {type(optimizer).__name__} "
            f"has {len(params)}; pass each optimizer with its own state_dict(), saved with its param groups "
            "(save_param_groups(True), the default)"
        )
    return dict(zip(keys, params, strict=True))
