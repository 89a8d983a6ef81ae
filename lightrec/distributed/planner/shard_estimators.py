"""torchrec's ``torchrec.distributed.planner.shard_estimators``: ``EmbeddingPerfEstimator`` and
``EmbeddingStorageEstimator``.

lightrec estimates every shard with one vectorised cost model (:mod:`lightrec.distributed.planner.estimators`,
docs/planner.md) while it enumerates, so these two classes only (re)write lightrec's numbers into
``ShardingOption`` s that lightrec's :class:`~lightrec.distributed.planner.enumerators.EmbeddingEnumerator`
built: ``shard.perf`` (lightrec's seconds per step, as ``fwd_compute``) and ``shard.storage``
(bytes in HBM on ``cuda``, DDR on ``cpu``). Subclass :class:`~lightrec.distributed.planner.types.ShardEstimator`
to plan with numbers of your own: the planner reads them back.
"""

from __future__ import annotations

import copy
from typing import Any

from lightrec.distributed.planner.types import ParameterConstraints, ShardEstimator, ShardingOption, Topology

__all__ = ["EmbeddingPerfEstimator", "EmbeddingStorageEstimator"]


def _lightrec_estimates(option: ShardingOption, estimator: str) -> list[Any]:
    if option._estimates is None or len(option._estimates) != len(option.shards):
        raise ValueError(
            f"{estimator} estimates the ShardingOptions lightrec's EmbeddingEnumerator builds; option "
            f"{option.fqn!r} ({option.sharding_type}) was built elsewhere"
        )
    return option._estimates


class EmbeddingPerfEstimator(ShardEstimator):
    """Writes lightrec's cost (seconds per step) into ``shard.perf``.

    Args:
        topology: the cluster (accepted for torchrec's signature; the costs were computed for the
            enumerator's topology).
        constraints: accepted for torchrec's signature.
        is_inference: accepted for torchrec's signature (the quant kernel's options are costed as inference).
    """

    def __init__(
        self, topology: Topology, constraints: dict[str, ParameterConstraints] | None = None, is_inference: bool = False
    ) -> None:
        super().__init__(topology, constraints)

    def estimate(self, sharding_options: list[ShardingOption], sharder_map: dict[str, Any] | None = None) -> None:
        for option in sharding_options:
            for shard, (_, perf) in zip(option.shards, _lightrec_estimates(option, type(self).__name__)):
                shard.perf = copy.copy(perf)


class EmbeddingStorageEstimator(ShardEstimator):
    """Writes lightrec's storage (bytes) into ``shard.storage`` (arguments as :class:`EmbeddingPerfEstimator`)."""

    def __init__(
        self,
        topology: Topology,
        constraints: dict[str, ParameterConstraints] | None = None,
        pipeline_type: Any = None,
        run_embedding_at_peak_memory: bool = False,
        is_inference: bool = False,
    ) -> None:
        super().__init__(topology, constraints)

    def estimate(self, sharding_options: list[ShardingOption], sharder_map: dict[str, Any] | None = None) -> None:
        for option in sharding_options:
            for shard, (storage, _) in zip(option.shards, _lightrec_estimates(option, type(self).__name__)):
                shard.storage = copy.copy(storage)
