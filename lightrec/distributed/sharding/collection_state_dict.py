"""State dict of a sharded collection under the unsharded collection's keys.

A sharded collection's parameters live in its lookup kernels
(``_lookups.<i>._emb_modules.<j>.weights.<table>``); its state dict shows them as the unsharded
module's ``<attr>.<table>.weight`` (``attr``: ``embedding_bags`` or ``embeddings``)::

    key                          model-parallel table              data-parallel table
    ---------------------------  --------------------------------  -------------------
    embedding_bags.t1.weight     ShardedTableState (this rank's    its tensor
                                 shards, aliasing the kernels')

Loading takes either form per table, a full tensor for any plan (each rank copies its slices) or
the ``ShardedTableState`` of the same plan (``lightrec.distributed.state_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from lightrec.distributed.planner.plan import ShardingType
from lightrec.distributed.sharding.common import ShardedTable
from lightrec.distributed.state_dict import ShardedTableState, local_slice
from lightrec.modules.embedding_configs import BaseEmbeddingConfig


class TableStateOwner(Protocol):
    """What the hooks read of the sharded collection that registers them (``ShardedCollectionBase``;
    named by this protocol so that this file does not import the collection back)."""

    _configs: Sequence[BaseEmbeddingConfig]
    _tables: Mapping[str, ShardedTable]
    _attr: str
    _state_prefix: str
    _local_params: Mapping[str, list[tuple[str, Any, nn.Parameter]]]


__all__ = ["load_state_dict_pre_hook", "state_dict_hook"]


def state_dict_hook(
    module: TableStateOwner, state_dict: dict[str, Any], prefix: str, local_metadata: Any
) -> None:
    """Replace the kernel parameters in ``state_dict`` by one entry per table (see the module docstring)."""
    for key in [k for k in state_dict if k.startswith(prefix + "_lookups.")]:
        del state_dict[key]
    for c in module._configs:
        table = module._tables[c.name]
        key = f"{prefix}{module._state_prefix}{module._attr}.{c.name}.weight"
        local = module._local_params[c.name]
        if table.sharding.sharding_type == ShardingType.DATA_PARALLEL.value:
            state_dict[key] = local[0][2].detach()
        else:
            state_dict[key] = ShardedTableState(
                [c.num_embeddings, c.embedding_dim],
                [(meta, p.detach()) for _, meta, p in local],
                local[0][2].dtype if local else torch.float32,
                list(table.shards),
            )


def load_state_dict_pre_hook(
    module: TableStateOwner, state_dict: dict[str, Any], prefix: str, *args: Any
) -> None:
    """Turn ``<attr>.<table>.weight`` (full tensor or sharded state) into the kernel parameters."""
    for c in module._configs:
        key = f"{prefix}{module._state_prefix}{module._attr}.{c.name}.weight"
        if key not in state_dict:
            continue  # reported as missing under the kernel parameter's key
        value = state_dict.pop(key)
        if isinstance(value, ShardedTableState) and value.global_shape != [c.num_embeddings, c.embedding_dim]:
            raise ValueError(f"state_dict[{key!r}] is a [{value.global_shape}] table, expected "
                             f"[{c.num_embeddings}, {c.embedding_dim}]")  # fmt: skip
        if isinstance(value, torch.Tensor) and tuple(value.shape) != (c.num_embeddings, c.embedding_dim):
            raise ValueError(
                f"state_dict[{key!r}] has shape {tuple(value.shape)}, expected ({c.num_embeddings}, {c.embedding_dim})"
            )
        for param_key, meta, _ in module._local_params[c.name]:
            state_dict[prefix + param_key] = local_slice(value, meta, key)
