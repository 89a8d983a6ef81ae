"""Where this process sits in the cluster: ranks per host, its local rank, its host (torchrec's
``torchrec.distributed.comm`` helpers), and the process groups inside and across hosts.

torchelastic (``torchrun``) and the MPI launchers export the layout as environment variables;
these helpers read them the way torchrec does, in this order::

    ranks per host   LOCAL_WORLD_SIZE, MPI_LOCALNRANKS, OMPI_COMM_WORLD_LOCAL_SIZE, MV2_COMM_WORLD_LOCAL_SIZE
    local rank       LOCAL_RANK, MPI_LOCALRANKID, OMPI_COMM_WORLD_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK

Without them a host is taken to hold 8 ranks (a GPU server), or the whole world when 8 does not
divide the world size -- torchrec's rule, so a script computes the same topology under both.
With ``L`` ranks per host, rank ``r`` is local rank ``r % L`` of host (group) ``r // L``:

    world 8, L 4     host 0: ranks 0 1 2 3     host 1: ranks 4 5 6 7
    intra-host group of rank 5: [4, 5, 6, 7]   cross-host group of rank 5: [1, 5]
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

__all__ = [
    "get_group_rank",
    "get_local_rank",
    "get_local_size",
    "get_num_groups",
    "intra_and_cross_node_pg",
]

logger = logging.getLogger(__name__)

_LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")
_DEFAULT_LOCAL_SIZE = 8

# The groups of intra_and_cross_node_pg, created once per process (every rank creates every
# group, as torch.distributed.new_group requires) and reused after.
_INTRA_PG: dist.ProcessGroup | None = None
_CROSS_PG: dist.ProcessGroup | None = None


def _env_int(names: tuple[str, ...], default: int) -> int:
    """The first of ``names`` set to a non-negative int, else ``default``."""
    for name in names:
        raw = os.environ.get(name)
        if raw is None or not raw.strip():
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} must be an integer") from None
        if value >= 0:
            return value
    return default


def _world_size(world_size: int | None) -> int:
    if world_size is not None:
        if world_size <= 0:
            raise ValueError(f"world_size must be positive, got {world_size}")
        return world_size
    if not dist.is_initialized():
        raise RuntimeError(
            "no process group: pass world_size, or call torch.distributed.init_process_group first"
        )
    return dist.get_world_size()


def _rank(rank: int | None) -> int:
    if rank is not None:
        return rank
    if not dist.is_initialized():
        raise RuntimeError("no process group: pass rank, or call torch.distributed.init_process_group first")
    return dist.get_rank()


def get_local_size(world_size: int | None = None) -> int:
    """Ranks per host (``nproc_per_node``): the launcher's variable, else 8, else the world size
    when that does not divide it (see the module docstring)."""
    world_size = _world_size(world_size)
    local_size = _env_int(_LOCAL_SIZE_VARS, _DEFAULT_LOCAL_SIZE)
    if local_size <= 0 or world_size % local_size != 0:
        return world_size
    return local_size


def get_local_rank(world_size: int | None = None, rank: int | None = None) -> int:
    """This process's rank on its host: the launcher's variable, else ``rank % get_local_size()``."""
    local_size = get_local_size(world_size)
    local_rank = _env_int(_LOCAL_RANK_VARS, -1)
    if 0 <= local_rank < local_size:
        return local_rank
    return _rank(rank) % local_size


def get_group_rank(world_size: int | None = None, rank: int | None = None) -> int:
    """Index of this process's host (torchelastic's ``GROUP_RANK``): ``rank // get_local_size()``."""
    return _rank(rank) // get_local_size(world_size)


def get_num_groups(world_size: int | None = None) -> int:
    """Number of hosts: ``world_size // get_local_size()``."""
    world_size = _world_size(world_size)
    return world_size // get_local_size(world_size)


def intra_and_cross_node_pg(
    device: torch.device | None = None, backend: str | None = None
) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """The process group of this host's ranks and the one of the same local rank on every host.

    Collective: every rank of the default group must call it (each group is created on all
    ranks). The groups are created on the first call and returned again after.

    Args:
        device: ``meta`` returns ``(None, None)`` (nothing to communicate).
        backend: of the new groups (default: the default group's).
    """
    global _INTRA_PG, _CROSS_PG
    if device is not None and torch.device(device).type == "meta":
        return None, None
    world_size, rank = _world_size(None), _rank(None)
    local_size = get_local_size(world_size)
    my_host, my_local = rank // local_size, get_local_rank(world_size, rank)
    backend = backend or str(dist.get_backend())
    if _INTRA_PG is None:
        for host in range(world_size // local_size):
            group = dist.new_group(ranks=[host * local_size + r for r in range(local_size)], backend=backend)
            if host == my_host:
                _INTRA_PG = group
        dist.barrier()
    if _CROSS_PG is None:
        for local in range(local_size):
            group = dist.new_group(
                ranks=[local + h * local_size for h in range(world_size // local_size)], backend=backend
            )
            if local == my_local:
                _CROSS_PG = group
        dist.barrier()
    logger.info("rank %d: local rank %d of host %d (%d ranks per host)", rank, my_local, my_host, local_size)
    return _INTRA_PG, _CROSS_PG
