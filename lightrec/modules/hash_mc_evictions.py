"""torchrec's ``torchrec.modules.hash_mc_evictions`` path: eviction of ``HashZchManagedCollisionModule``.

A re-export only; the code lives in :mod:`lightrec.modules.managed_collision.hash_zch_eviction`.
"""

from lightrec.modules.managed_collision.hash_zch_eviction import (
    HashZchEvictionConfig,
    HashZchEvictionModule,
    HashZchEvictionPolicyName,
    get_kernel_from_policy,
    now_hours,
)

__all__ = [
    "HashZchEvictionConfig",
    "HashZchEvictionModule",
    "HashZchEvictionPolicyName",
    "get_kernel_from_policy",
    "now_hours",
]
