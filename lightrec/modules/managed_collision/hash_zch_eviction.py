"""Eviction of ``HashZchManagedCollisionModule`` (torchrec's names; re-exported at its ``hash_mc_evictions`` path).

Slots carry one int32 of metadata, in hours (``time.time() / 3600``, as in torchrec):

=============================  ==========================================================
policy                         metadata of a slot / when it may be taken by a new id
=============================  ==========================================================
``SINGLE_TTL_EVICTION``        expiry hour ``now + single_ttl``, refreshed at every lookup;
                               the slot is free once ``metadata < now``
``PER_FEATURE_TTL_EVICTION``   the same with the TTL of the id's feature (``per_feature_ttl``)
``LRU_EVICTION``               as single TTL; and when every probed slot is live, the new id
                               takes the probed slot whose expiry is earliest, among those no
                               id of the same batch holds (none: it falls back)
=============================  ==========================================================

``HashZchEvictionModule(feature)`` returns ``(metadata per id, threshold)`` for a step; the clock
is :func:`now_hours` (tests replace it to move time forward).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, unique

import torch
from torch import nn

from lightrec.sparse import JaggedTensor

__all__ = [
    "HashZchEvictionConfig",
    "HashZchEvictionModule",
    "HashZchEvictionPolicyName",
    "get_kernel_from_policy",
    "now_hours",
]


@unique
class HashZchEvictionPolicyName(Enum):
    """Eviction policies of the multi-probe hash (torchrec's enum)."""

    SINGLE_TTL_EVICTION = "SINGLE_TTL_EVICTION"
    PER_FEATURE_TTL_EVICTION = "PER_FEATURE_TTL_EVICTION"
    LRU_EVICTION = "LRU_EVICTION"


@dataclass
class HashZchEvictionConfig:
    """What an eviction policy needs (torchrec's fields).

    Attributes:
        features: the features of the table, in order.
        single_ttl: hours an id keeps its slot without lookups (single-TTL and LRU policies).
        per_feature_ttl: hours per feature (per-feature TTL policy), one per ``features`` entry.
    """

    features: list[str] = field(default_factory=list)
    single_ttl: int | None = None
    per_feature_ttl: list[int] | None = None


def now_hours() -> int:
    """The clock of hash eviction: whole hours since the epoch."""
    return int(time.time() / 3600)


def get_kernel_from_policy(policy_name: HashZchEvictionPolicyName | None) -> int:
    """fbgemm's kernel number: 1 for LRU, 0 otherwise (torchrec's helper)."""
    return 1 if policy_name == HashZchEvictionPolicyName.LRU_EVICTION else 0


class HashZchEvictionModule(nn.Module):
    """Per-id metadata and the expiry threshold of a step (see the module docstring).

    Args:
        policy_name: the policy.
        device: where the metadata lives.
        config: the TTLs; required by every policy.

    Raises:
        ValueError: the config does not give the TTL the policy needs.
    """

    def __init__(
        self, policy_name: HashZchEvictionPolicyName, device: torch.device | str, config: HashZchEvictionConfig | None
    ) -> None:
        super().__init__()
        if not isinstance(policy_name, HashZchEvictionPolicyName):
            raise TypeError(f"policy_name must be a HashZchEvictionPolicyName, got {policy_name!r}")
        if config is None:
            raise ValueError(f"{policy_name.value} needs eviction_config=HashZchEvictionConfig(...)")
        if policy_name == HashZchEvictionPolicyName.PER_FEATURE_TTL_EVICTION:
            if config.per_feature_ttl is None or len(config.per_feature_ttl) != len(config.features):
                raise ValueError(
                    "PER_FEATURE_TTL_EVICTION needs one per_feature_ttl entry per feature: features="
                    f"{config.features}, per_feature_ttl={config.per_feature_ttl}"
                )
        elif config.single_ttl is None or config.single_ttl <= 0:
            raise ValueError(f"{policy_name.value} needs a positive single_ttl (hours), got {config.single_ttl!r}")
        self._policy_name = policy_name
        self._config = config
        self._device = torch.device(device)

    @property
    def policy_name(self) -> HashZchEvictionPolicyName:
        return self._policy_name

    def ttl_per_value(self, values: torch.Tensor, feature_splits: list[int] | None) -> torch.Tensor:
        """``[N]`` TTL (hours) of each id (its feature's under the per-feature policy)."""
        if self._policy_name != HashZchEvictionPolicyName.PER_FEATURE_TTL_EVICTION:
            assert self._config.single_ttl is not None  # checked in __init__
            return torch.full_like(values, self._config.single_ttl, dtype=torch.int32)
        ttl = torch.tensor(self._config.per_feature_ttl, dtype=torch.int32, device=values.device)
        splits = feature_splits if feature_splits is not None else [values.numel()]
        if len(splits) != ttl.numel():
            raise ValueError(
                f"PER_FEATURE_TTL_EVICTION got ids of {len(splits)} features, configured for {self._config.features}"
            )
        return ttl.repeat_interleave(torch.tensor(splits, device=values.device), output_size=values.numel())

    def forward(self, feature: JaggedTensor) -> tuple[torch.Tensor, int]:
        """``(expiry hour per id [N] int32, threshold = now)`` for a feature's ids.

        The per-feature policy reads the id count of each feature from ``feature.weights()``
        (torchrec's convention); other policies ignore it.
        """
        splits = None
        if self._policy_name == HashZchEvictionPolicyName.PER_FEATURE_TTL_EVICTION:
            splits = [int(n) for n in feature.weights().tolist()]
        now = now_hours()
        return self.ttl_per_value(feature.values(), splits) + now, now
