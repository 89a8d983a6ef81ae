"""The on-disk layout of a sharded checkpoint and the collective, atomic directory write.

A sharded checkpoint is a directory (named like any checkpoint, e.g. ``epoch=0-step=100.ckpt``)::

    meta.pt                     rank 0: everything replicated -- dense weights, dense optimizer
                                state, loop/callback state, hyper-parameters, "lightrec_sharded" info
    shards-rank00000.pt ...     one per rank: its embedding shards and their optimizer state,
                                its optimizer param groups and LR scheduler states

Ranks write into ``<path>.tmp-<token>`` next to the target; only when every rank's file and
``meta.pt`` are on disk does rank 0 move the directory to ``<path>`` (replacing an older one). A
failure on any rank leaves ``<path>`` as it was and raises on every rank. All ranks must see the
same filesystem (one host, or a shared mount).
"""

from __future__ import annotations

import glob
import os
import shutil
import uuid
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lightrec.distributed.checkpoint.blocks import CheckpointError
from lightrec.distributed.types import resolve_group

__all__ = ["FORMAT", "META_FILE", "is_sharded_checkpoint", "read_meta", "read_shards", "shard_file", "write_collectively"]

FORMAT = "lightrec.sharded.v1"
META_FILE = "meta.pt"


def shard_file(rank: int) -> str:
    return f"shards-rank{rank:05d}.pt"


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """True when ``path`` is a directory written by :func:`write_collectively`."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, META_FILE))


def _world(pg: dist.ProcessGroup | None) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(pg), dist.get_world_size(pg)
    return 0, 1


def _agree(error: str | None, pg: dist.ProcessGroup | None) -> None:
    """Raise the same CheckpointError on every rank if any rank failed (a collective)."""
    _, world = _world(pg)
    errors = [error]
    if world > 1:
        errors = [None] * world
        dist.all_gather_object(errors, error, group=pg)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        raise CheckpointError("; ".join(f"rank {r}: {e}" for r, e in failed))


def _attempt(fn: Callable[[], None]) -> str | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- reported on every rank by _agree
        return f"{type(e).__name__}: {e}"
    return None


def write_collectively(
    path: str | os.PathLike, meta: dict[str, Any], payload: dict[str, Any], pg: dist.ProcessGroup | None = None
) -> None:
    """Write ``payload`` (every rank) and ``meta`` (rank 0) as the checkpoint directory ``path``."""
    path = os.fspath(path)
    if "://" in path:
        raise CheckpointError(
            f"sharded checkpoints are written to a local or shared filesystem path, got {path!r}; "
            "mount the bucket or save to a local path and copy it"
        )
    rank, world = _world(pg)
    token = [uuid.uuid4().hex[:12]]
    if world > 1:
        dist.broadcast_object_list(token, src=dist.get_global_rank(resolve_group(pg), 0), group=pg)
    tmp = f"{path.rstrip(os.sep)}.tmp-{token[0]}"
    _agree(_attempt(lambda: os.makedirs(tmp)) if rank == 0 else None, pg)

    def write_own() -> None:
        with open(os.path.join(tmp, shard_file(rank)), "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())

    try:
        _agree(_attempt(write_own), pg)

        def finish() -> None:
            with open(os.path.join(tmp, META_FILE), "wb") as f:
                torch.save(meta, f)
                f.flush()
                os.fsync(f.fileno())
            old = None
            if os.path.lexists(path):
                old = f"{path.rstrip(os.sep)}.old-{token[0]}"
                os.replace(path, old)
            os.replace(tmp, path)
            if old is not None:
                shutil.rmtree(old) if os.path.isdir(old) and not os.path.islink(old) else os.remove(old)

        _agree(_attempt(finish) if rank == 0 else None, pg)
    except CheckpointError:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if world > 1:
            dist.barrier(group=pg)  # every rank raises only once the partial directory is gone
        raise


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    meta = torch.load(os.path.join(path, META_FILE), map_location="cpu", weights_only=False)
    info = meta.get("lightrec_sharded", {})
    if info.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a {FORMAT} checkpoint (meta.pt says {info.get('format')!r})")
    return meta


def read_shards(path: str | os.PathLike, world_size: int) -> list[dict[str, Any]]:
    """Every rank's payload, memory-mapped: only the bytes a caller slices are read from disk."""
    files = sorted(glob.glob(os.path.join(path, "shards-rank*.pt")))
    expected = [os.path.join(path, shard_file(r)) for r in range(world_size)]
    if files != expected:
        missing = sorted(set(expected) - set(files))
        raise CheckpointError(
            f"{path} was written by {world_size} ranks but holds {len(files)} shard files "
            f"(missing: {[os.path.basename(m) for m in missing]}); the checkpoint is incomplete"
        )
    # weights_only=False: payloads carry LR scheduler states, which may hold user objects
    return [torch.load(f, map_location="cpu", mmap=True, weights_only=False) for f in files]
