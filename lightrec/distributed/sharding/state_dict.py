"""Sharded state dicts, in one home: what a rank saves for a model-parallel table, how a sharded
collection shows its tables under the unsharded module's keys, and how to reshard.

``DistributedModelParallel.state_dict()`` has exactly the keys of the unsharded model
(``sparse_arch.embedding_bag_collection.embedding_bags.t1.weight`` ...). The value of a
model-parallel table is a :class:`ShardedTableState`: the table's global shape plus *this rank's*
shards (metadata + tensors that alias the live weights); replicated (data-parallel) tables and
dense parameters are plain tensors. lightrec uses neither ``ShardedTensor`` nor ``DTensor``: the
value is a small picklable dataclass, so ``torch.save`` / ``torch.load`` (``weights_only=True``
included -- the class is registered as safe) write one file per rank.

A sharded collection's parameters live in its lookup kernels
(``_lookups.<i>._emb_modules.<j>.weights.<table>``); its hooks (:func:`state_dict_hook`,
:func:`load_state_dict_pre_hook`, registered by ``ShardedCollectionBase``) show them as the
unsharded module's ``<attr>.<table>.weight`` (``attr``: ``embedding_bags`` or ``embeddings``)::

    key                          model-parallel table              data-parallel table
    ---------------------------  --------------------------------  -------------------
    embedding_bags.t1.weight     ShardedTableState (this rank's    its tensor
                                 shards, aliasing the kernels')

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

Files written before this module moved here (from ``lightrec/distributed/state_dict.py``) name
the class ``lightrec.distributed.state_dict.ShardedTableState``; that name is registered as safe
too, so they still load with ``weights_only=True``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from lightrec.distributed.comm.sharding_env import resolve_group
from lightrec.distributed.planner.plan import ShardingType, ShardMetadata
from lightrec.distributed.sharding.common import ShardedTable
from lightrec.modules.embedding_configs import BaseEmbeddingConfig

__all__ = [
    "Shard",
    "ShardedTableState",
    "ShardedTensorMetadata",
    "TensorProperties",
    "TableStateOwner",
    "gather_full_state_dict",
    "load_state_dict_post_hook",
    "load_state_dict_pre_hook",
    "local_slice",
    "state_dict_hook",
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

    def full_tensor_local(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``[rows, cols]`` with this rank's shards filled in and zeros elsewhere.

        Args:
            dtype: of the result (default: ``self.dtype``); ``gather_full_state_dict`` passes the
                dtype the ranks agreed on, as ``self.dtype`` is only a guess on a rank holding no shard.
        """
        full = torch.zeros(self.global_shape, dtype=self.dtype if dtype is None else dtype)
        for meta, tensor in self.shards:
            (r, c), (nr, nc) = meta.shard_offsets, meta.shard_sizes
            full[r : r + nr, c : c + nc] = tensor.detach().cpu()
        return full

    def __repr__(self) -> str:
        blocks = [(m.shard_offsets, m.shard_sizes, m.placement) for m, _ in self.shards]
        return f"ShardedTableState(global_shape={self.global_shape}, local_shards={blocks})"


#: ``(type, the dotted name files written before the move store)``: ``ShardedTableState`` lived in
#: ``lightrec/distributed/state_dict.py`` and the plan types in one module, ``planner/plan.py``.
FORMER_NAMES: list[tuple[type, str]] = [
    (ShardedTableState, "lightrec.distributed.state_dict.ShardedTableState"),
    (ShardMetadata, "lightrec.distributed.planner.plan.ShardMetadata"),
]
torch.serialization.add_safe_globals([ShardedTableState, ShardMetadata, *FORMER_NAMES])


def local_slice(value: object, meta: ShardMetadata, key: str) -> torch.Tensor:
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
    state_dict: Mapping[str, object], pg: dist.ProcessGroup | None = None, dst: int | None = None
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
    collective = dist.is_initialized() and dist.get_world_size(pg) > 1
    dtypes = _agreed_dtypes(state_dict, pg) if collective else {}
    for key, value in state_dict.items():
        if isinstance(value, ShardedTableState):
            # shards are disjoint: the sum over ranks is the table
            full = value.full_tensor_local(dtypes.get(key))
            if collective:
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


def _agreed_dtypes(state_dict: Mapping[str, object], pg: dist.ProcessGroup | None) -> dict[str, torch.dtype]:
    """``{key: dtype}`` of every :class:`ShardedTableState` in ``state_dict``, as the ranks holding its
    shards see it (a collective; every rank gets the same answer).

    A rank holding no shard of a table only guesses its dtype (float32), so after ``model.double()``
    its reduce buffer would be float32 against the owners' float64: gloo fails on the size or the
    sum is garbage. One ``all_gather_object`` of the owners' dtypes settles it for every table.

    Raises:
        ValueError: two ranks hold shards of one table in different dtypes (names the table, the
            ranks and the dtypes).
    """
    if not any(isinstance(v, ShardedTableState) for v in state_dict.values()):
        return {}  # the same on every rank: the state dicts have the same keys
    own = {
        key: value.shards[0][1].dtype
        for key, value in state_dict.items()
        if isinstance(value, ShardedTableState) and value.shards
    }
    everyone: list[dict[str, torch.dtype] | None] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(everyone, own, group=pg)
    agreed: dict[str, tuple[int, torch.dtype]] = {}
    for rank, seen in enumerate(everyone):
        for key, dtype in (seen or {}).items():
            first = agreed.setdefault(key, (rank, dtype))
            if first[1] != dtype:
                raise ValueError(
                    f"gather_full_state_dict: table {key!r} is {first[1]} on rank {first[0]} but {dtype} on rank "
                    f"{rank}; convert the whole model to one dtype (e.g. model.double()) before gathering"
                )
    return {key: dtype for key, (_, dtype) in agreed.items()}


# ---- the sharded collections' hooks ------------------------------------------------------------
class TableStateOwner(Protocol):
    """What the hooks read of the sharded collection that registers them (``ShardedCollectionBase``;
    named by this protocol so that this file does not import the collection back)."""

    _configs: Sequence[BaseEmbeddingConfig]
    _tables: Mapping[str, ShardedTable]
    _attr: str
    _state_prefix: str
    _local_params: Mapping[str, list[tuple[str, ShardMetadata, nn.Parameter]]]
    # {kernel parameter key: table key} of the tables the load in progress did not find (full keys)
    _missing_table_keys: dict[str, str]

    def get_submodule(self, target: str) -> nn.Module: ...


def state_dict_hook(
    module: TableStateOwner, state_dict: dict[str, object], prefix: str, local_metadata: object
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
    module: TableStateOwner, state_dict: dict[str, object], prefix: str, local_metadata: Mapping[str, object],
    *args: object,
) -> None:
    """Turn ``<attr>.<table>.weight`` (full tensor or sharded state) into the kernel parameters.

    Under ``load_state_dict(..., assign=True)`` torch would put new parameters in the kernels, which
    their storage (what the lookups read and the fused optimizer updates) never sees; so each
    kernel loads its blocks here (copied, through its own load hooks), and the live parameters are
    handed to torch's assignment, which then keeps them.
    """
    module._missing_table_keys.clear()
    assign = bool(local_metadata.get("assign_to_params_buffers", False))
    by_kernel: dict[str, dict[str, torch.Tensor]] = {}
    for c in module._configs:
        key = f"{prefix}{module._state_prefix}{module._attr}.{c.name}.weight"
        if key not in state_dict:
            # torch reports the kernel parameters missing; load_state_dict_post_hook names the table
            module._missing_table_keys.update({prefix + k: key for k, _, _ in module._local_params[c.name]})
            continue
        value = state_dict.pop(key)
        if isinstance(value, ShardedTableState) and value.global_shape != [c.num_embeddings, c.embedding_dim]:
            raise ValueError(f"state_dict[{key!r}] is a {value.global_shape} table, expected "
                             f"[{c.num_embeddings}, {c.embedding_dim}]; load a state dict of a model with the "
                             "same table sizes")  # fmt: skip
        if isinstance(value, torch.Tensor) and tuple(value.shape) != (c.num_embeddings, c.embedding_dim):
            raise ValueError(
                f"state_dict[{key!r}] has shape {tuple(value.shape)}, expected ({c.num_embeddings}, {c.embedding_dim})"
            )
        for param_key, meta, param in module._local_params[c.name]:
            block = local_slice(value, meta, key)
            if assign:
                kernel, _, name = param_key.rpartition(".weights.")
                by_kernel.setdefault(kernel, {})[f"weights.{name}"] = block
                block = param  # torch's assignment keeps the live parameter, loaded below
            state_dict[prefix + param_key] = block
    for kernel, blocks in by_kernel.items():
        module.get_submodule(kernel).load_state_dict(blocks, strict=False)


class IncompatibleKeys(Protocol):
    """What torch hands a load post hook (``missing_keys`` may be changed in place)."""

    @property
    def missing_keys(self) -> list[str]: ...


def load_state_dict_post_hook(module: TableStateOwner, incompatible_keys: IncompatibleKeys) -> None:
    """Report a table the state dict lacks under its key (``<attr>.<table>.weight``, what
    ``state_dict()`` has), not under its kernel parameters' keys."""
    missing: list[str] = incompatible_keys.missing_keys
    renamed = [module._missing_table_keys.get(k, k) for k in missing]
    missing[:] = list(dict.fromkeys(renamed))
    module._missing_table_keys.clear()
