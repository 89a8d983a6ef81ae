"""torchrec's ``torchrec.modules.hash_mc_modules`` path: the multi-probe zero-collision hash.

A re-export only; the code lives in :mod:`lightrec.modules.managed_collision.hash_zch_module`
(the module) and :mod:`lightrec.modules.managed_collision.hash_zch_eviction` (its eviction, also
importable from here as in torchrec).
"""

from lightrec.modules.managed_collision import (
    HashZchEvictionConfig,
    HashZchEvictionModule,
    HashZchEvictionPolicyName,
    HashZchManagedCollisionModule,
    TrainInputMapper,
    get_kernel_from_policy,
)

__all__ = [
    "HashZchEvictionConfig",
    "HashZchEvictionModule",
    "HashZchEvictionPolicyName",
    "HashZchManagedCollisionModule",
    "TrainInputMapper",
    "get_kernel_from_policy",
]
