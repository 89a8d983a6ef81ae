"""``ManagedCollisionOptions``: managed collisions for every table of a model, from a few settings.

What ``RecModule(managed_collisions=...)`` and the recipes' ``--model.managed_collisions`` take: a
dict (YAML-friendly) or the dataclass, turned into one ``MCHManagedCollisionModule`` per table::

    RecModule(..., managed_collisions={"eviction_policy": "lru", "eviction_interval": 10, "buckets": 6})

    options = ManagedCollisionOptions.parse(True)          # the defaults
    mcc = options.collection(table_configs, device="cpu")  # ManagedCollisionCollection
    mc_ebc = options.wrap(embedding_bag_collection, table_configs, device="cpu")

Each table's ``num_embeddings`` becomes its module's ``zch_size`` (its rows); raw ids may then be
any int64 in ``[0, input_hash_size)``. See docs/managed-collisions.md for what each setting does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lightrec.modules.embedding_configs import BaseEmbeddingConfig
from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.modules.managed_collision.collection import ManagedCollisionCollection
from lightrec.modules.managed_collision.embedding_collections import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from lightrec.modules.managed_collision.mch_eviction import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    MCHEvictionPolicy,
    TTL_EvictionPolicy,
)
from lightrec.modules.managed_collision.mch_module import MCHManagedCollisionModule
from lightrec.modules.managed_collision.ops import mix64_hash

__all__ = ["EVICTION_POLICIES", "ManagedCollisionOptions"]

EVICTION_POLICIES = ("lru", "lfu", "distance_lfu", "ttl")
"""The policy names ``ManagedCollisionOptions(eviction_policy=...)`` takes."""


@dataclass(frozen=True)
class ManagedCollisionOptions:
    """Managed-collision settings shared by every table of a model.

    Attributes:
        eviction_policy: ``"lru"``, ``"lfu"``, ``"distance_lfu"`` or ``"ttl"``.
        eviction_interval: training steps between eviction rounds.
        input_hash_size: raw ids must lie in ``[0, input_hash_size)``.
        hash_ids: spread the raw ids over the id space first (``mix64_hash``); for ids that are
            not already spread (sequential user ids) when ``buckets > 1``.
        buckets: buckets per table (the unit of row-wise sharding: a multiple of the world size); a
            table with fewer than two rows per bucket gets one bucket (it is sharded table-wise).
        immediate_eviction_fraction: share of each bucket new ids may take from low-ranked
            residents between rounds.
        admission_threshold: lookups before an id gets a row.
        ttl: iterations an unseen id keeps its row (``"ttl"`` only).
        decay_exponent: the distance exponent of ``"distance_lfu"`` (and ``"lru"``'s, which does
            not change its order).
    """

    eviction_policy: str = "lru"
    eviction_interval: int = 10
    input_hash_size: int = 2**63 - 1
    hash_ids: bool = False
    buckets: int = 1
    immediate_eviction_fraction: float = 0.25
    admission_threshold: int = 1
    ttl: int | None = None
    decay_exponent: float = 1.0

    def __post_init__(self) -> None:
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(
                f"managed_collisions: eviction_policy must be one of {list(EVICTION_POLICIES)}, got {self.eviction_policy!r}"
            )
        if self.eviction_policy == "ttl" and self.ttl is None:
            raise ValueError("managed_collisions: eviction_policy='ttl' needs ttl (iterations an unseen id keeps its row)")
        self.policy()  # the policy checks its own arguments

    @classmethod
    def parse(cls, value: ManagedCollisionOptions | Mapping[str, Any] | bool | None) -> ManagedCollisionOptions | None:
        """Options from what a user passes: None/False (off), True (defaults), a dict or the dataclass.

        Raises:
            TypeError: an unknown key or value type, naming it and the known keys.
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, ManagedCollisionOptions):
            return value
        if isinstance(value, Mapping):
            known = [f.name for f in dataclasses.fields(cls)]
            unknown = sorted(set(value) - set(known))
            if unknown:
                raise TypeError(f"managed_collisions: unknown setting(s) {unknown}; the settings are {known}")
            return cls(**dict(value))
        raise TypeError(
            f"managed_collisions must be None, a bool, a dict or ManagedCollisionOptions, got {type(value).__name__}"
        )

    def policy(self) -> MCHEvictionPolicy:
        """A fresh eviction policy of this kind."""
        if self.eviction_policy == "lru":
            return LRU_EvictionPolicy(decay_exponent=self.decay_exponent)
        if self.eviction_policy == "lfu":
            return LFU_EvictionPolicy()
        if self.eviction_policy == "distance_lfu":
            return DistanceLFU_EvictionPolicy(decay_exponent=self.decay_exponent)
        return TTL_EvictionPolicy(ttl=int(self.ttl or 0))

    def module(self, config: BaseEmbeddingConfig, device: torch.device | str | None) -> MCHManagedCollisionModule:
        """The managed-collision module of one table (``zch_size`` = its ``num_embeddings``)."""
        return MCHManagedCollisionModule(
            zch_size=config.num_embeddings, device=device, eviction_policy=self.policy(),
            eviction_interval=self.eviction_interval, input_hash_size=self.input_hash_size,
            input_hash_func=mix64_hash if self.hash_ids else None, name=config.name,
            buckets=self.buckets if config.num_embeddings >= 2 * self.buckets else 1,
            immediate_eviction_fraction=self.immediate_eviction_fraction,
            admission_threshold=self.admission_threshold,
        )  # fmt: skip

    def collection(
        self, configs: Sequence[BaseEmbeddingConfig], device: torch.device | str | None = None
    ) -> ManagedCollisionCollection:
        """A ``ManagedCollisionCollection`` with one module per table."""
        modules: dict[str, ManagedCollisionModule] = {c.name: self.module(c, device) for c in configs}
        return ManagedCollisionCollection(modules, list(configs))

    def wrap(
        self, collection: nn.Module, configs: Sequence[BaseEmbeddingConfig], device: torch.device | str | None = None
    ) -> ManagedCollisionEmbeddingBagCollection | ManagedCollisionEmbeddingCollection:
        """``collection`` (pooled or sequence tables ``configs``) behind managed collisions.

        The result returns ``(embeddings, None)``; ``lightrec.models`` take that form.
        """
        mcc = self.collection(configs, device)
        if hasattr(collection, "embedding_bag_configs"):
            return ManagedCollisionEmbeddingBagCollection(collection, mcc)
        return ManagedCollisionEmbeddingCollection(collection, mcc)

    def to_dict(self) -> dict[str, object]:
        """The settings as a plain dict (what ``parse`` takes back)."""
        return dataclasses.asdict(self)
