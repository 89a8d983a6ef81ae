"""What ``DistributedModelParallel`` (``model_parallel.py``, torchrec's path) and ``RecStrategy`` do
around the sharding itself, one file per job:

====================  ========================================================================
``fingerprint.py``    before sharding, the ranks compare their tables, plan and world (one
                      all-gather of a hash); ``RankMismatchError`` names the first difference
``placement.py``      the dense part of a model moves to the rank's device with its own
                      ``.to()``; the embedding collections, placed by their plan, are never touched
``default_sharders``  ``get_default_sharders``: the sharders used when none are given (DMP,
                      ``RecStrategy``, ``lightrec plan``); torchrec's ``sharding_plan`` re-exports it
====================  ========================================================================
"""

from lightrec.distributed.dmp.fingerprint import (
    RankMismatchError,
    check_ranks_agree,
    describe,
    first_difference,
)
from lightrec.distributed.dmp.placement import detached, move_dense_to_device, outermost

__all__ = [
    "RankMismatchError",
    "check_ranks_agree",
    "describe",
    "detached",
    "first_difference",
    "move_dense_to_device",
    "outermost",
]
