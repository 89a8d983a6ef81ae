"""torchrec's ``torchrec.modules.hash_mc_evictions`` path: eviction of ``HashZchManagedCollisionModule``.

A re-export only; the code lives in :mod:`lightrec.modules.managed_collision.hash_zch_eviction`.
"""

from lightrec.modules.managed_collision import hash_zch_eviction as _home
from lightrec.modules.managed_collision.hash_zch_eviction import *  # noqa: F403 - the home's __all__

__all__ = list(_home.__all__)
