"""torchrec's ``torchrec.inference.state_dict_transform``: move a sharded state dict between a
training job and a serving model.

``DistributedModelParallel.state_dict()`` holds each model-parallel table as a
:class:`~lightrec.distributed.sharding.state_dict.ShardedTableState` (this rank's shards; torchrec's
``ShardedTensor``). ``state_dict_gather(src, dst)`` writes the full tables into the plain tensors
of ``dst`` on rank 0 (collective), as torchrec's does; lightrec's own
:func:`~lightrec.distributed.gather_full_state_dict` and :func:`lightrec.inference.quantize` (with
``dst=0``) do the same for a whole model.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from lightrec.distributed.comm.sharding_env import resolve_group
from lightrec.distributed.sharding.state_dict import ShardedTableState

__all__ = ["state_dict_all_gather_keys", "state_dict_gather", "state_dict_to_device"]


def state_dict_gather(src: Mapping[str, object], dst: Mapping[str, torch.Tensor]) -> None:
    """Fill every tensor of ``dst`` from the entry of the same key in ``src`` (collective).

    A :class:`ShardedTableState` is summed over the ranks of the default group into ``dst`` on
    rank 0 (its shards are disjoint blocks); a plain tensor is copied on every rank.

    Raises:
        KeyError: a key of ``dst`` is missing from ``src``.
        ValueError: an entry is neither a tensor nor a ``ShardedTableState``, or shapes differ.
    """
    for key, out in dst.items():
        if key not in src:
            raise KeyError(f"state_dict_gather: src has no entry {key!r} that dst asks for")
        value = src[key]
        if isinstance(value, ShardedTableState):
            if list(out.shape) != list(value.global_shape):
                raise ValueError(f"state_dict_gather: dst[{key!r}] is {list(out.shape)}, the table is {value.global_shape}")
            full = value.full_tensor_local().to(out.dtype)
            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.reduce(full, dst=0)
            if not dist.is_initialized() or dist.get_rank() == 0:
                out.copy_(full)
        elif isinstance(value, torch.Tensor):
            out.copy_(value)
        else:
            raise ValueError(f"state_dict_gather: src[{key!r}] is a {type(value).__name__}, not a tensor or sharded table")


def state_dict_all_gather_keys(state_dict: Mapping[str, object], pg: dist.ProcessGroup | None) -> list[str]:
    """The sorted union of every rank's keys (collective over ``pg``)."""
    group = resolve_group(pg)
    everyone: list[list[str]] = [[] for _ in range(dist.get_world_size(group))]
    dist.all_gather_object(everyone, list(state_dict), group=group)
    return sorted({k for keys in everyone for k in keys})


def state_dict_to_device(
    state_dict: Mapping[str, object], pg: dist.ProcessGroup | None, device: torch.device | str
) -> dict[str, torch.Tensor | ShardedTableState]:
    """A copy of ``state_dict`` on ``device``: tensors moved, sharded tables with their shards moved
    (collective over ``pg``: keys only some ranks hold become empty ``ShardedTableState`` s)."""
    out: dict[str, torch.Tensor | ShardedTableState] = {}
    for key in state_dict_all_gather_keys(state_dict, pg):
        value = state_dict.get(key)
        if value is None:
            out[key] = ShardedTableState([])
        elif isinstance(value, ShardedTableState):
            out[key] = ShardedTableState(
                list(value.global_shape), [(m, t.to(device)) for m, t in value.shards], value.dtype, value.all_shards
            )
        elif isinstance(value, torch.Tensor):
            out[key] = value.to(device)
        else:
            raise ValueError(f"state_dict_to_device: state_dict[{key!r}] is a {type(value).__name__}")
    return out
