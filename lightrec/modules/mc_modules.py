"""torchrec's ``torchrec.modules.mc_modules`` path: managed-collision modules and their collection.

The code lives in the files named below; this module re-exports it under torchrec's names::

    mc_base.py        ManagedCollisionModule (the interface), ManagedCollisionIdError
    mch_module.py     MCHManagedCollisionModule
    mc_eviction.py    MCHEvictionPolicy, LFU_/LRU_/DistanceLFU_/TTL_EvictionPolicy, threshold filters
    mc_collection.py  ManagedCollisionCollection, apply_mc_method_to_jt_dict
    mc_ops.py         the tensor operations, mix64_hash (an input_hash_func)

See docs/managed-collisions.md.
"""

from lightrec.modules.mc_base import ManagedCollisionIdError, ManagedCollisionModule
from lightrec.modules.mc_collection import ManagedCollisionCollection, apply_mc_method_to_jt_dict
from lightrec.modules.mc_eviction import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    MCHEvictionPolicy,
    MCHEvictionPolicyMetadataInfo,
    TTL_EvictionPolicy,
    average_threshold_filter,
    dynamic_threshold_filter,
    probabilistic_threshold_filter,
)
from lightrec.modules.mc_ops import mix64_hash
from lightrec.modules.mch_module import MCHManagedCollisionModule

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
