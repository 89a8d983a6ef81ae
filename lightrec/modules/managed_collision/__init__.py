"""Managed collisions: raw ids of any size remapped to the rows of a fixed-size table.

One feature, one folder; torchrec's paths (``lightrec.modules.mc_modules``,
``mc_embedding_modules``, ``hash_mc_modules``, ``hash_mc_evictions``) re-export these files::

    base.py                   ManagedCollisionModule (the interface), ManagedCollisionIdError
    collection.py             ManagedCollisionCollection: one module per table over a whole KJT
    embedding_collections.py  ManagedCollision{EmbeddingBag,Embedding}Collection: remap, reset
                              evicted rows, look up
    reset.py                  fresh values of evicted rows; plain optimizers' state reset
    options.py                ManagedCollisionOptions: every table of a model from a few settings
    serving.py                the frozen remappers served (no insertion, no eviction)
    ops.py                    bucket routing and hashes (mix64_hash, an input_hash_func)

    MCH (torchrec's managed-collision hash, a row for a new id at once):
    mch_module.py             MCHManagedCollisionModule: construction, torchrec's calls, state
    mch_step.py               its training step and eviction rounds
    mch_native.py             the step's lookup-and-insert as one native CPU op
    mch_index.py              SlotIndex: the sorted id index and the queues of rows to hand out
    mch_slots.py              buckets, priorities, the round's cut
    mch_state.py              torchrec's state dicts in, slot order kept
    mch_eviction.py           the LFU / LRU / DistanceLFU / TTL policies and threshold filters

    hash ZCH (torchrec's multi-probe zero-collision hash):
    hash_zch_module.py        HashZchManagedCollisionModule, TrainInputMapper
    hash_zch_probe.py         the vectorised probing (lookup, insertion)
    hash_zch_eviction.py      its TTL / LRU eviction (HashZchEvictionModule and config)

See docs/managed-collisions.md.
"""

from lightrec.modules.managed_collision.base import ManagedCollisionIdError, ManagedCollisionModule
from lightrec.modules.managed_collision.collection import (
    ManagedCollisionCollection,
    apply_mc_method_to_jt_dict,
)
from lightrec.modules.managed_collision.embedding_collections import (
    BaseManagedCollisionEmbeddingCollection,
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from lightrec.modules.managed_collision.hash_zch_eviction import (
    HashZchEvictionConfig,
    HashZchEvictionModule,
    HashZchEvictionPolicyName,
    get_kernel_from_policy,
)
from lightrec.modules.managed_collision.hash_zch_module import HashZchManagedCollisionModule, TrainInputMapper
from lightrec.modules.managed_collision.mch_eviction import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    MCHEvictionPolicy,
    MCHEvictionPolicyMetadataInfo,
    ThresholdFilterContext,
    TTL_EvictionPolicy,
    average_threshold_filter,
    dynamic_threshold_filter,
    probabilistic_threshold_filter,
    threshold_filter_context,
)
from lightrec.modules.managed_collision.mch_module import MCHManagedCollisionModule
from lightrec.modules.managed_collision.ops import mix64_hash
from lightrec.modules.managed_collision.options import EVICTION_POLICIES, ManagedCollisionOptions
from lightrec.modules.managed_collision.serving import (
    FrozenHashZchRemapper,
    FrozenManagedCollisionCollection,
    FrozenMCHRemapper,
)

__all__ = [
    "EVICTION_POLICIES",
    "BaseManagedCollisionEmbeddingCollection",
    "DistanceLFU_EvictionPolicy",
    "FrozenHashZchRemapper",
    "FrozenMCHRemapper",
    "FrozenManagedCollisionCollection",
    "HashZchEvictionConfig",
    "HashZchEvictionModule",
    "HashZchEvictionPolicyName",
    "HashZchManagedCollisionModule",
    "LFU_EvictionPolicy",
    "LRU_EvictionPolicy",
    "MCHEvictionPolicy",
    "MCHEvictionPolicyMetadataInfo",
    "MCHManagedCollisionModule",
    "ManagedCollisionCollection",
    "ManagedCollisionEmbeddingBagCollection",
    "ManagedCollisionEmbeddingCollection",
    "ManagedCollisionIdError",
    "ManagedCollisionModule",
    "ManagedCollisionOptions",
    "TTL_EvictionPolicy",
    "ThresholdFilterContext",
    "TrainInputMapper",
    "apply_mc_method_to_jt_dict",
    "average_threshold_filter",
    "dynamic_threshold_filter",
    "get_kernel_from_policy",
    "mix64_hash",
    "probabilistic_threshold_filter",
    "threshold_filter_context",
]
