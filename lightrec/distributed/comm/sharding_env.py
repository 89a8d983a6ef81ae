"""``ShardingEnv``: who this process is in the sharded world (world size, rank, process group).

Also the two helpers every collective path shares: :func:`resolve_group` (a group, or the default
one) and :func:`as_env` (what ``DistributedModelParallel`` and the sharders accept as ``env``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

__all__ = ["ShardingEnv", "as_env", "resolve_group"]


@dataclass
class ShardingEnv:
    """Who this process is in the sharded world: ``world_size``, ``rank`` and the process group."""

    world_size: int
    rank: int
    pg: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size <= 0:
            raise ValueError(f"world_size must be a positive int, got {self.world_size!r}")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {self.rank!r}")

    @classmethod
    def from_process_group(cls, pg: dist.ProcessGroup | None) -> ShardingEnv:
        """Environment of this process inside the initialised process group ``pg`` (None: the default group)."""
        group = resolve_group(pg)
        return cls(dist.get_world_size(group), dist.get_rank(group), group)

    @classmethod
    def from_local(cls, world_size: int, rank: int) -> ShardingEnv:
        """Environment without a process group (single process, inference sharding)."""
        return cls(world_size, rank, None)


def resolve_group(pg: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``pg``, or the default process group when it is None."""
    group = pg if pg is not None else dist.group.WORLD
    if group is None:
        raise RuntimeError(
            "no process group: call torch.distributed.init_process_group('gloo') (or 'nccl') first, "
            "or pass the group explicitly"
        )
    return group


def as_env(env: ShardingEnv | dist.ProcessGroup | None) -> ShardingEnv:
    """Accept a ``ShardingEnv``, a process group, or None (the default group)."""
    if isinstance(env, ShardingEnv):
        return env
    if env is None or isinstance(env, dist.ProcessGroup):
        if not dist.is_initialized():
            raise RuntimeError(
                "sharding needs torch.distributed: call dist.init_process_group('gloo') (or 'nccl') first, "
                "even for a single process (world size 1)"
            )
        return ShardingEnv.from_process_group(env)
    raise TypeError(f"env must be a ShardingEnv or a ProcessGroup, got {type(env).__name__}")
