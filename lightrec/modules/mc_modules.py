"""torchrec's ``torchrec.modules.mc_modules`` path: managed-collision modules and their collection.

A re-export only; the code lives in :mod:`lightrec.modules.managed_collision` (its docstring maps
the files). See docs/managed-collisions.md.
"""

from lightrec.modules.managed_collision import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    ManagedCollisionIdError,
    ManagedCollisionModule,
    MCHEvictionPolicy,
    MCHEvictionPolicyMetadataInfo,
    MCHManagedCollisionModule,
    TTL_EvictionPolicy,
    apply_mc_method_to_jt_dict,
    average_threshold_filter,
    dynamic_threshold_filter,
    mix64_hash,
    probabilistic_threshold_filter,
)

__all__ = [
    "DistanceLFU_EvictionPolicy",
    "LFU_EvictionPolicy",
    "LRU_EvictionPolicy",
    "MCHEvictionPolicy",
    "MCHEvictionPolicyMetadataInfo",
    "MCHManagedCollisionModule",
    "ManagedCollisionCollection",
    "ManagedCollisionIdError",
    "ManagedCollisionModule",
    "TTL_EvictionPolicy",
    "apply_mc_method_to_jt_dict",
    "average_threshold_filter",
    "dynamic_threshold_filter",
    "mix64_hash",
    "probabilistic_threshold_filter",
]
