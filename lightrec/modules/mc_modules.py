"""torchrec's ``torchrec.modules.mc_modules`` path: managed-collision modules and their collection.

A re-export only; the code lives in :mod:`lightrec.modules.managed_collision` (its docstring maps
the files). See docs/managed-collisions.md.
"""

from lightrec.modules.managed_collision import mch_eviction as _eviction
from lightrec.modules.managed_collision import mch_module as _mch
from lightrec.modules.managed_collision.base import ManagedCollisionIdError, ManagedCollisionModule
from lightrec.modules.managed_collision.collection import (
    ManagedCollisionCollection,
    apply_mc_method_to_jt_dict,
)
from lightrec.modules.managed_collision.mch_eviction import *  # noqa: F403 - the policies and filters
from lightrec.modules.managed_collision.mch_module import *  # noqa: F403 - MCHManagedCollisionModule
from lightrec.modules.managed_collision.ops import mix64_hash

__all__ = [
    *_eviction.__all__,
    *_mch.__all__,
    "ManagedCollisionCollection",
    "ManagedCollisionIdError",
    "ManagedCollisionModule",
    "apply_mc_method_to_jt_dict",
    "mix64_hash",
]
