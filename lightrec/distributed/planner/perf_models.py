"""torchrec's ``torchrec.distributed.planner.perf_models``: how a partitioned plan is rated.

:class:`NoopPerfModel` rates a plan by its busiest rank (the largest summed shard cost of a rank),
which is the rating lightrec's planner uses on its own; give ``EmbeddingShardingPlanner`` another
:class:`~lightrec.distributed.planner.types.PerfModel` to choose among proposals by your rating.
"""

from __future__ import annotations

from lightrec.distributed.planner.types import PerfModel, ShardingOption, Topology

__all__ = ["NoopPerfModel"]


class NoopPerfModel(PerfModel):
    """The busiest rank's summed shard cost (replicated shards count on every rank)."""

    def __init__(self, topology: Topology) -> None:
        self._topology = topology

    def rate(self, plan: list[ShardingOption]) -> float:
        load = [0.0] * self._topology.world_size
        for so in plan:
            for shard in so.shards:
                cost = shard.perf.total if shard.perf is not None else 0.0
                ranks = range(self._topology.world_size) if shard.rank is None else [shard.rank]
                for r in ranks:
                    load[r] += cost
        return max(load)
