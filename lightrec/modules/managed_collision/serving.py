"""Frozen managed-collision remappers for serving: ids -> rows, nothing learnt, pure torch ops.

A trained managed-collision module is a training-time state machine (insertions, eviction rounds,
Python policies); a served model only needs its id map. :meth:`FrozenManagedCollisionCollection.from_collection`
snapshots each table's module into a small remapper whose ``forward(values) -> rows`` is a handful
of tensor ops -- no Python callables, no data-dependent control flow -- so ``torch.fx`` traces it,
TorchScript compiles it and ``torch.export`` exports it, and the artifact runs where lightrec is
not installed:

=========================  ===================================================================
module                     frozen lookup
=========================  ===================================================================
MCH (``MCHManagedCol..``)  one ``searchsorted`` in the sorted ids; unknown ids -> the default row
                           of their bucket (the last row of its segment)
hash (``HashZchMan..``)    the id's probe window ``[N, max_probe]`` gathered at once; unknown ids
                           -> their first probe position (fbgemm's read-only fallback)
=========================  ===================================================================

``input_hash_func`` must be ``None`` or ``mix64_hash`` (which is re-implemented here) to be served.
"""


from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.modules.managed_collision.hash_zch_probe import murmur3_2x64, unsigned_mod
from lightrec.modules.managed_collision.ops import mix64, mix64_hash
from lightrec.sparse import KeyedJaggedTensor

__all__ = [
    "FrozenHashZchRemapper",
    "FrozenMCHRemapper",
    "FrozenManagedCollisionCollection",
    "check_servable_hash",
    "freeze_module",
]


class _BucketedRemapper(nn.Module):
    """What both frozen remappers share: the id space, its buckets, and the first bucket served.

    Args:
        input_hash_size: the id space (0: any non-negative id, bucketed by ``id % buckets``).
        buckets: buckets of the whole table.
        start_bucket: the first bucket this module serves.
    """

    def __init__(self, input_hash_size: int, buckets: int, start_bucket: int) -> None:
        super().__init__()
        self.input_hash_size = input_hash_size
        self.buckets = buckets
        self.start_bucket = start_bucket

    def _bucket(self, values: torch.Tensor) -> torch.Tensor:
        """The table bucket of each id ``[N]``: ``id % buckets``, or the id's block of the id space."""
        if self.buckets == 1:
            return torch.zeros_like(values)
        if self.input_hash_size == 0:
            return torch.remainder(values, self.buckets)
        block = (self.input_hash_size + self.buckets - 1) // self.buckets
        return torch.clamp(torch.div(values, block, rounding_mode="floor"), max=self.buckets - 1)

    def _fold(self, values: torch.Tensor) -> torch.Tensor:
        """Ids folded into the id space (``id mod input_hash_size``; ``2**63 - 1`` when unbounded), as
        the trained module's ``admit_ids`` folds them: an id outside the space gets the row the float
        module in eval mode gives it (in-range ids are unchanged: the unbounded space holds every id
        ``>= 0``, ``2**63 - 1`` too, so only negative ids fold there)."""
        if self.input_hash_size > 0:
            return torch.remainder(values, self.input_hash_size)
        return torch.where(values < 0, torch.remainder(values, 9223372036854775807), values)

    def _local_bucket(self, values: torch.Tensor, served: int) -> torch.Tensor:
        """The bucket of each id among the ``served`` ones of this module ``[N]`` (clamped into range)."""
        return torch.clamp(self._bucket(values) - self.start_bucket, 0, served - 1)


class FrozenMCHRemapper(_BucketedRemapper):
    """The read-only lookup of an ``MCHManagedCollisionModule`` (see the module docstring).

    Args:
        sorted_ids: ``[Z]`` the module's ids, ascending (``EMPTY_ID`` for free rows, at the end).
        sorted_rows: ``[Z]`` the row of each sorted id.
        default_rows: ``[b]`` the default row of each bucket the module serves.
        input_hash_size / buckets / start_bucket: the id space and its buckets.
        hash_ids: apply ``mix64_hash`` first (the module's ``input_hash_func``).
    """

    sorted_ids: torch.Tensor
    sorted_rows: torch.Tensor
    default_rows: torch.Tensor

    def __init__(
        self,
        sorted_ids: torch.Tensor,
        sorted_rows: torch.Tensor,
        default_rows: torch.Tensor,
        input_hash_size: int,
        buckets: int,
        start_bucket: int,
        hash_ids: bool,
    ) -> None:
        super().__init__(input_hash_size, buckets, start_bucket)
        self.register_buffer("sorted_ids", sorted_ids.detach().clone())
        self.register_buffer("sorted_rows", sorted_rows.detach().clone())
        self.register_buffer("default_rows", default_rows.detach().clone())
        self.hash_ids = hash_ids

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        values = values.long()
        if self.hash_ids:  # (a hash lands in the id space: nothing to fold)
            values = torch.remainder(mix64(values), self.input_hash_size)
        else:
            values = self._fold(values)
        pos = torch.clamp(torch.searchsorted(self.sorted_ids, values), max=self.sorted_ids.shape[0] - 1)
        hit = self.sorted_ids.index_select(0, pos) == values
        local_bucket = self._local_bucket(values, self.default_rows.shape[0])
        return torch.where(hit, self.sorted_rows.index_select(0, pos), self.default_rows.index_select(0, local_bucket))


class FrozenHashZchRemapper(_BucketedRemapper):
    """The read-only lookup of a ``HashZchManagedCollisionModule`` (see the module docstring).

    Args:
        identities: ``[Z]`` the id in each row (-1: empty).
        bounds: ``[b + 1]`` local row offsets of the buckets served.
        row_offset: first table row of the module.
        max_probe / input_hash_size / buckets / start_bucket: the module's.
        reserved_percent: opt-in reservation (0: none).
        div_ids: the module stores ``id // buckets`` (or ``id % block``) instead of the id.
    """

    identities: torch.Tensor
    bounds: torch.Tensor
    probes: torch.Tensor

    def __init__(
        self,
        identities: torch.Tensor,
        bounds: list[int],
        row_offset: int,
        max_probe: int,
        input_hash_size: int,
        buckets: int,
        start_bucket: int,
        reserved_percent: float,
        div_ids: bool,
    ) -> None:
        super().__init__(input_hash_size, buckets, start_bucket)
        self.register_buffer("identities", identities.detach().reshape(-1).clone())
        self.register_buffer("bounds", torch.tensor(bounds, dtype=torch.int64))
        self.register_buffer("probes", torch.arange(max_probe, dtype=torch.int64))
        self.row_offset = row_offset
        self.reserved_percent = reserved_percent
        self.div_ids = div_ids

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        values = self._fold(values.long())
        local = self._local_bucket(values, self.bounds.shape[0] - 1)  # of the raw id, before div_ids
        if self.div_ids:
            if self.input_hash_size == 0:
                values = torch.div(values, self.buckets, rounding_mode="floor")
            else:
                values = torch.remainder(values, (self.input_hash_size + self.buckets - 1) // self.buckets)
        offset = self.bounds.index_select(0, local)
        size = self.bounds.index_select(0, local + 1) - offset
        reserved = torch.zeros_like(size)
        if self.reserved_percent > 0:
            reserved = torch.clamp(torch.floor(size.double() * self.reserved_percent / 100).long(), min=1)
        block = size - reserved
        hashed = murmur3_2x64(values)
        start = unsigned_mod(hashed, block)
        window = offset.unsqueeze(1) + torch.remainder(start.unsqueeze(1) + self.probes.unsqueeze(0), block.unsqueeze(1))
        match = self.identities.index_select(0, window.reshape(-1)).view(window.shape) == values.unsqueeze(1)
        found = match.any(dim=1)
        first = torch.argmax(match.to(torch.int64), dim=1, keepdim=True)
        slot = window.gather(1, first).squeeze(1)
        fallback = torch.where(
            reserved > 0, block + unsigned_mod(hashed, torch.clamp(reserved, min=1)), unsigned_mod(hashed, size)
        )
        return torch.where(found, slot, offset + fallback) + self.row_offset


def check_servable_hash(module: ManagedCollisionModule, hash_func: object) -> bool:
    """Whether ids are hashed first (``mix64_hash``); any other ``input_hash_func`` cannot be served.

    Raises:
        TypeError: an ``input_hash_func`` other than ``None`` / ``mix64_hash``.
    """
    if hash_func is not None and hash_func is not mix64_hash:
        raise TypeError(
            f"managed-collision table {module.table_name!r}: its input_hash_func {hash_func!r} is Python code a "
            "served artifact cannot run; use lightrec.modules.mc_modules.mix64_hash (served as tensor ops), or hash "
            "the ids before the model"
        )
    return hash_func is not None


def freeze_module(module: ManagedCollisionModule) -> nn.Module:
    """The frozen remapper of a trained managed-collision module (a copy of its current state).

    Raises:
        TypeError: a module without a frozen form, or an ``input_hash_func`` that cannot be served.
    """
    return module.frozen_remapper()


class _TableConfig(Protocol):
    """The part of an embedding config :meth:`FrozenManagedCollisionCollection.from_collection` reads."""

    @property
    def name(self) -> str: ...

    @property
    def feature_names(self) -> Sequence[str]: ...


@runtime_checkable
class CollisionCollectionLike(Protocol):
    """What :meth:`FrozenManagedCollisionCollection.from_collection` reads of a managed-collision collection
    (``ManagedCollisionCollection``, its quantized or its sharded twin). Never scripted: only annotates."""

    def modules_by_table(self) -> dict[str, ManagedCollisionModule]: ...

    def embedding_configs(self) -> Sequence[_TableConfig]: ...


class FrozenManagedCollisionCollection(nn.Module):
    """Frozen remappers of a collection's tables: ``KJT -> KJT`` of rows (feature order of the tables).

    Args:
        remappers: ``{table: frozen remapper}``, in table order.
        table_features: the features of each table, in the same order.
        id_spaces: ``{table: input_hash_size}`` (0: any non-negative id), for the serving metadata.
    """

    def __init__(
        self, remappers: dict[str, nn.Module], table_features: list[list[str]], id_spaces: dict[str, int]
    ) -> None:
        super().__init__()
        self._remappers = nn.ModuleDict(remappers)
        self._table_features = table_features
        self._feature_names = [f for fs in table_features for f in fs]
        self._num_features = [len(fs) for fs in table_features]
        self.id_spaces = dict(id_spaces)

    @classmethod
    def from_collection(cls, collection: "CollisionCollectionLike") -> "FrozenManagedCollisionCollection":
        """Snapshot a ``ManagedCollisionCollection`` (or its quantized/sharded unsharded twin)."""
        modules: dict[str, ManagedCollisionModule] = collection.modules_by_table()
        configs = collection.embedding_configs()
        return cls(
            {c.name: freeze_module(modules[c.name]) for c in configs},
            [list(c.feature_names) for c in configs],
            {c.name: modules[c.name].input_size() for c in configs},
        )

    def feature_names(self) -> list[str]:
        return self._feature_names

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        kjt = features.permute_to_keys(self._feature_names)
        values = kjt.values()
        offsets = kjt.offset_per_key()
        parts: list[torch.Tensor] = []
        first = 0
        t = 0
        for _, remapper in self._remappers.items():
            last = first + self._num_features[t]
            rows: torch.Tensor = remapper(values[offsets[first] : offsets[last]])
            parts.append(rows)
            first = last
            t += 1
        return KeyedJaggedTensor(
            keys=self._feature_names,
            values=torch.cat(parts),
            weights=kjt.weights_or_none(),
            lengths=kjt.lengths(),
            offsets=None,
            stride=kjt.stride(),
        )


