"""Sharded state dicts: what a rank saves for a model-parallel table, and how to reshard it.

``DistributedModelParallel.state_dict()`` has exactly the keys of the unsharded model
(``sparse_arch.embedding_bag_collection.embedding_bags.t1.weight`` ...). The value of a
model-parallel table is a :class:`ShardedTableState`: the table's global shape plus *this rank's*
shards (metadata + tensors that alias the live weights); replicated (data-parallel) tables and
dense parameters are plain tensors. lightrec uses neither ``ShardedTensor`` nor ``DTensor``: the
value is a small picklable dataclass, so ``torch.save`` / ``torch.load`` (``weights_only=True``
included -- the class is registered as safe) write one file per rank.

Resharding (save on N ranks, load on M)::

    full = gather_full_state_dict(model.state_dict(), dst=0)     # collective; full tables on rank 0
    if rank == 0: torch.save(full, "ckpt.pt")
    ...                                                         # later, any world size, any plan
    model.load_state_dict(torch.load("ckpt.pt"))                # every rank copies its slices

Loading accepts, per table, a full tensor (any plan) or a ``ShardedTableState`` holding exactly
this rank's shards (same plan and world size).

torchrec code reads and writes shards through ``ShardedTensor``'s view, which
``ShardedTableState`` offers too: ``local_shards()`` (``Shard(tensor, metadata)`` per local shard,
the tensor aliasing the live rows, so ``shard.tensor.copy_(pretrained[rows, cols])`` writes into
the model), ``metadata()`` (every shard of the table, on all ranks, and its global ``size``) and
``size()``::

    for key, value in model.state_dict().items():
        if isinstance(value, ShardedTableState):      # torchrec: isinstance(value, ShardedTensor)
            for shard in value.local_shards():
                (r, c), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.copy_(pretrained[key][r : r + nr, c : c + nc])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from lightrec.distributed.planner.plan import ShardMetadata
from lightrec.distributed.sharding_env import resolve_group

__all__ = [
    "Shard",
    "ShardedTableState",
    "ShardedTensorMetadata",
    "TensorProperties",
    "gather_full_state_dict",
    "local_slice",
]


@dataclass(frozen=True)
class Shard:
    """One local shard in torchrec's (``ShardedTensor``'s) form: its rows and where they sit."""

    tensor: torch.Tensor
    metadata: ShardMetadata


@dataclass(frozen=True)
class TensorProperties:
    """The dtype of a sharded table (``ShardedTensorMetadata.tensor_properties``)."""

    dtype: torch.dtype = torch.float32
    requires_grad: bool = False


@dataclass(frozen=True)
class ShardedTensorMetadata:
    """Every shard of one table (all ranks) and its global size, as ``ShardedTensor.metadata()``."""

    shards_metadata: list[ShardMetadata]
    size: torch.Size
    tensor_properties: TensorProperties


@dataclass
class ShardedTableState:
    """This rank's part of one model-parallel table.

    Attributes:
        global_shape: ``[rows, cols]`` of the full table.
        shards: ``(metadata, tensor [shard rows, shard cols])`` of every shard this rank holds
            (empty on ranks that hold none).
        dtype: the table's dtype (lets ranks without shards build the gathered table).
        all_shards: metadata of every shard of the table, on every rank (None in files written
            before lightrec 0.2: ``metadata()`` then lists this rank's shards only).
    """

    global_shape: list[int]
    shards: list[tuple[ShardMetadata, torch.Tensor]] = field(default_factory=list)
    dtype: torch.dtype = torch.float32
    all_shards: list[ShardMetadata] | None = None

    def local_shards(self) -> list[Shard]:
        """This rank's shards (torchrec's ``ShardedTensor.local_shards()``); the tensors alias the
        live table, so in-place writes change the model."""
        return [Shard(tensor, meta) for meta, tensor in self.shards]

    def metadata(self) -> ShardedTensorMetadata:
        """Every shard of the table and its global size (torchrec's ``ShardedTensor.metadata()``)."""
        shards = list(self.all_shards) if self.all_shards is not None else [m for m, _ in self.shards]
        return ShardedTensorMetadata(shards, torch.Size(self.global_shape), TensorProperties(self.dtype))

    def size(self) -> torch.Size:
        """The full table's ``[rows, cols]``."""
        return torch.Size(self.global_shape)

    def full_tensor_local(self) -> torch.Tensor:
        """``[rows, cols]`` with this rank's shards filled in and zeros elsewhere."""
        full = torch.zeros(self.global_shape, dtype=self.dtype)
        for meta, tensor in self.shards:
            (r, c), (nr, nc) = meta.shard_offsets, meta.shard_sizes
            full[r : r + nr, c : c + nc] = tensor.detach().cpu()
        return full

    def __repr__(self) -> str:
        blocks = [(m.shard_offsets, m.shard_sizes, m.placement) for m, _ in self.shards]
        return f"ShardedTableState(global_shape={self.global_shape}, local_shards={blocks})"


torch.serialization.add_safe_globals([ShardedTableState, ShardMetadata])


def local_slice(value: Any, meta: ShardMetadata, key: str) -> torch.Tensor:
    """The block ``meta`` of a saved table value (full tensor or :class:`ShardedTableState`).

    Raises:
        ValueError: the value is neither, has the wrong shape, or does not hold this block.
    """
    (r, c), (nr, nc) = meta.shard_offsets, meta.shard_sizes
    if isinstance(value, ShardedTableState):
        for m, tensor in value.shards:
            if m.shard_offsets == meta.shard_offsets and m.shard_sizes == meta.shard_sizes:
                return tensor
        raise ValueError(
            f"state_dict[{key!r}] holds shards {[(m.shard_offsets, m.shard_sizes) for m, _ in value.shards]} "
            f"but this rank needs the block at {meta.shard_offsets} of size {meta.shard_sizes}; a sharded "
            "state_dict only loads into the same plan -- gather it with gather_full_state_dict() to reshard"
        )
    if not isinstance(value, torch.Tensor) or value.dim() != 2:
        raise ValueError(
            f"state_dict[{key!r}] must be a 2-D tensor or a ShardedTableState, got {type(value).__name__}"
        )
    if value.shape[0] < r + nr or value.shape[1] < c + nc:
        raise ValueError(
            f"state_dict[{key!r}] has shape {tuple(value.shape)}, too small for the block at {meta.shard_offsets} "
            f"of size {meta.shard_sizes}; pass the full table"
        )
    return value[r : r + nr, c : c + nc]


def gather_full_state_dict(
    state_dict: Mapping[str, Any], pg: dist.ProcessGroup | None = None, dst: int | None = None
) -> dict[str, Any]:
    """Replace every :class:`ShardedTableState` by the full table (a collective).

    Args:
        state_dict: a sharded state dict (the same keys on every rank).
        pg: process group of the ranks holding the shards (default: the world).
        dst: rank (in ``pg``) that receives the full tables, or None for every rank.

    Returns:
        Plain tensors for every key on the receiving rank(s); ``{}`` on the others. Tables are
        reduced one at a time, so no rank ever holds more than one extra full table in flight.
    """
    gathered: dict[str, Any] = {}
    receiving = dst is None or dist.get_rank(pg) == dst
    for key, value in state_dict.items():
        if isinstance(value, ShardedTableState):
            full = value.full_tensor_local()  # shards are disjoint: the sum over ranks is the table
            if dist.is_initialized() and dist.get_world_size(pg) > 1:
                if dst is None:
                    dist.all_reduce(full, group=pg)
                else:
                    dist.reduce(full, dist.get_global_rank(resolve_group(pg), dst), group=pg)
            value = full
        elif isinstance(value, torch.Tensor):
            value = value.detach().clone()
        if receiving:
            gathered[key] = value
    return gathered
