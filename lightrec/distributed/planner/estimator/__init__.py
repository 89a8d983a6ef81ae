"""torchrec's ``torchrec.distributed.planner.estimator``: per-hardware performance settings
(``HardwarePerfConfig``) and the raw data of one shard's performance estimate
(``ShardPerfContext``), in ``types.py``."""

from lightrec.distributed.planner.estimator.types import HardwarePerfConfig, ShardPerfContext

__all__ = ["HardwarePerfConfig", "ShardPerfContext"]
