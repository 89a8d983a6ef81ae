"""The on-disk layout of a sharded checkpoint and the collective, crash-safe directory write.

A sharded checkpoint is a directory (named like any checkpoint, e.g. ``epoch=0-step=100.ckpt``)::

    meta.pt                     rank 0: everything replicated -- dense weights, dense optimizer
                                state, loop/callback state, hyper-parameters, "lightrec_sharded" info
                                (format, world size, the save's run id)
    shards-rank00000.pt ...     one per rank: its embedding shards and their optimizer state,
                                its optimizer param groups and LR scheduler states
    manifest.json               written last: the run id and every file's size and SHA-256
                                (``integrity.py``)

Ranks write into ``<path>.tmp-<run>`` next to the target; only when every rank's file, ``meta.pt``
and the manifest are on disk does rank 0 move the directory to ``<path>`` (replacing an older one)
by the rename protocol of ``publish.py``, under which a kill at any instant leaves either a complete
checkpoint at ``<path>`` or one that :func:`checkpoint_folder` finds unambiguously. A failure on any
rank leaves ``<path>`` as it was and raises on every rank. All ranks must see the same filesystem
(one host, or a shared mount). Files are read with ``weights_only=True`` (``safe_load.py``), after
their checksums are verified.
"""

from __future__ import annotations

import glob
import os
import shutil
import uuid
import warnings
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

import torch.distributed as dist

from lightrec.distributed.checkpoint.blocks import Block, CheckpointError
from lightrec.distributed.checkpoint.integrity import (
    FileRecord,
    Manifest,
    read_manifest,
    save_hashed,
    verify_file,
    write_manifest,
)
from lightrec.distributed.checkpoint.publish import is_complete, publish, recover, resolve, temp_folder
from lightrec.distributed.checkpoint.safe_load import load_file
from lightrec.distributed.comm.failures import CollectiveError, collective_guard
from lightrec.distributed.comm.sharding_env import resolve_group

__all__ = [
    "FORMAT",
    "META_FILE",
    "RankPayload",
    "SavedGroup",
    "SavedState",
    "agree_outcomes",
    "attempt_outcome",
    "checkpoint_folder",
    "is_sharded_checkpoint",
    "read_meta",
    "read_shards",
    "shard_file",
    "write_collectively",
]

FORMAT = "lightrec.sharded.v1"
META_FILE = "meta.pt"


class SavedState(TypedDict):
    """One optimizer state of a sharded table: ``kind`` (``state_kind``) and this rank's blocks of it."""

    kind: str
    blocks: list[Block]


class _SavedGroupRequired(TypedDict):
    ids: list[str]
    hparams: dict[str, Any]  # the optimizer's own hyper-parameters (lr, betas, ...): any value


class SavedGroup(_SavedGroupRequired, total=False):
    """One optimizer param group: its parameters' stable ids, hyper-parameters and, per LR scheduler
    index, that scheduler's per-group entries (``base_lrs``, ``_last_lr``, ...)."""

    sched: dict[int, dict[str, Any]]  # scheduler state values: whatever the scheduler keeps


class RankPayload(TypedDict):
    """One rank's ``shards-rank*.pt``: table shards, sharded optimizer state, param groups, schedulers.

    ``optim[i]`` maps a table to ``{state name: SavedState}`` for optimizer ``i``; ``groups[i]`` are its
    param groups; ``scheduler_optimizer[k]`` is the optimizer scheduler ``k`` steps (-1: none given).
    """

    rank: int
    shapes: dict[str, list[int]]
    tables: dict[str, list[Block]]
    optim: list[dict[str, dict[str, SavedState]]]
    groups: list[list[SavedGroup]]
    lr_schedulers: list[dict[str, Any]]  # this rank's scheduler state dicts, as the schedulers wrote them
    scheduler_optimizer: list[int]
T = TypeVar("T")


def shard_file(rank: int) -> str:
    return f"shards-rank{rank:05d}.pt"


def checkpoint_folder(path: str | os.PathLike) -> str | None:
    """The folder holding the sharded checkpoint of ``path`` (``path`` itself, or the complete folder
    a save killed between its two renames left, see ``publish.py``); None when there is none."""
    folder = resolve(path)
    if folder is None or not os.path.isdir(folder):
        return None
    return folder if os.path.isfile(os.path.join(folder, META_FILE)) else None


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """True when ``path`` holds (or an interrupted save left) a directory written by :func:`write_collectively`."""
    return checkpoint_folder(path) is not None


def _world(pg: dist.ProcessGroup | None) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(pg), dist.get_world_size(pg)
    return 0, 1


def agree_outcomes(outcome: tuple[str | None, T], pg: dist.ProcessGroup | None) -> list[T]:
    """Every rank's value, or the same CheckpointError on every rank if any rank failed (a collective)."""
    _, world = _world(pg)
    outcomes = [outcome]
    if world > 1:
        outcomes = [outcome] * world
        with collective_guard("all_gather of a checkpoint save's outcome (a rank died while saving?)", pg):
            dist.all_gather_object(outcomes, outcome, group=pg)
    failed = [(r, e) for r, (e, _) in enumerate(outcomes) if e is not None]
    if failed:
        raise CheckpointError("; ".join(f"rank {r}: {e}" for r, e in failed))
    return [v for _, v in outcomes]


def attempt_outcome(fn: Callable[[], T]) -> tuple[str | None, T | None]:
    """``(None, fn())``, or ``("Type: message", None)`` when ``fn`` raised: one rank's outcome for
    :func:`agree_outcomes`."""
    try:
        return None, fn()
    except Exception as e:  # noqa: BLE001 -- reported on every rank by agree_outcomes
        return f"{type(e).__name__}: {e}", None


def write_collectively(
    path: str | os.PathLike,
    meta: dict[str, Any],
    payload: RankPayload,
    pg: dist.ProcessGroup | None = None,
) -> None:
    """Write ``payload`` (every rank) and ``meta`` (rank 0) as the checkpoint directory ``path``."""
    path = os.fspath(path).rstrip(os.sep)
    if "://" in path:
        raise CheckpointError(
            f"sharded checkpoints are written to a local or shared filesystem path, got {path!r}; "
            "mount the bucket or save to a local path and copy it"
        )
    rank, world = _world(pg)
    run = [uuid.uuid4().hex]
    if world > 1:
        dist.broadcast_object_list(run, src=dist.get_global_rank(resolve_group(pg), 0), group=pg)
    run_id = run[0]
    tmp = temp_folder(path, run_id)

    def prepare() -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        recover(path)  # finish an interrupted save's rename, delete dead saves' folders
        os.makedirs(tmp)

    agree_outcomes(attempt_outcome(prepare) if rank == 0 else (None, None), pg)
    try:
        records = agree_outcomes(attempt_outcome(lambda: save_hashed(payload, os.path.join(tmp, shard_file(rank)))), pg)

        def finish() -> None:
            info = dict(meta["lightrec_sharded"], run_id=run_id)
            files: dict[str, FileRecord] = {
                shard_file(r): rec for r, rec in enumerate(records) if rec is not None
            }
            files[META_FILE] = save_hashed({**meta, "lightrec_sharded": info}, os.path.join(tmp, META_FILE))
            write_manifest(tmp, Manifest(FORMAT, run_id, world, files))
            publish(tmp, path, run_id)

        agree_outcomes(attempt_outcome(finish) if rank == 0 else (None, None), pg)
    except CollectiveError:  # a peer died mid-save: no barrier to wait at; the next save cleans up too
        if rank == 0 and not is_complete(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    except CheckpointError:
        if rank == 0 and not is_complete(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        if world > 1:
            dist.barrier(group=pg)  # every rank raises only once the partial directory is gone
        raise


def _manifest(folder: str) -> Manifest | None:
    if os.path.isfile(os.path.join(folder, "manifest.json")):
        return read_manifest(folder)
    warnings.warn(
        f"{folder} has no manifest.json (written by lightrec before checkpoints carried checksums): its files "
        "are loaded without verification",
        stacklevel=3,
    )
    return None


def _verified(folder: str, name: str, manifest: Manifest | None) -> str:
    if manifest is not None:
        record = manifest.files.get(name)
        if record is None:
            raise CheckpointError(
                f"{os.path.join(folder, name)} is not listed in {folder}/manifest.json (run {manifest.run_id}): "
                "the file does not belong to this checkpoint"
            )
        verify_file(folder, name, record)
    return os.path.join(folder, name)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """Rank 0's ``meta.pt`` of the checkpoint at ``path``, verified against the manifest."""
    folder = checkpoint_folder(path)
    if folder is None:
        raise CheckpointError(f"{os.fspath(path)} is not a lightrec sharded checkpoint (no {META_FILE})")
    manifest = _manifest(folder)
    meta = load_file(_verified(folder, META_FILE, manifest))
    info = meta.get("lightrec_sharded", {}) if isinstance(meta, dict) else {}
    if info.get("format") != FORMAT:
        raise CheckpointError(f"{folder} is not a {FORMAT} checkpoint (meta.pt says {info.get('format')!r})")
    if manifest is not None and info.get("run_id") != manifest.run_id:
        raise CheckpointError(
            f"{os.path.join(folder, META_FILE)} belongs to save {info.get('run_id')!r}, but the manifest "
            f"of {folder} to save {manifest.run_id!r}: the folder mixes two checkpoints"
        )
    if manifest is not None and info.get("world_size") != manifest.world_size:
        raise CheckpointError(
            f"{os.path.join(folder, META_FILE)} says {info.get('world_size')} ranks wrote the checkpoint, its "
            f"manifest says {manifest.world_size}: the folder mixes two checkpoints"
        )
    info["folder"] = folder
    return dict(meta)


def read_shards(path: str | os.PathLike, world_size: int) -> list[RankPayload]:
    """Every rank's payload, verified, then memory-mapped: only the bytes a caller slices are read again."""
    folder = checkpoint_folder(path) or os.fspath(path)
    files = sorted(glob.glob(os.path.join(glob.escape(folder), "shards-rank*.pt")))
    expected = [os.path.join(folder, shard_file(r)) for r in range(world_size)]
    if files != expected:
        missing = sorted(set(expected) - set(files))
        raise CheckpointError(
            f"{folder} was written by {world_size} ranks but holds {len(files)} shard files "
            f"(missing: {[os.path.basename(m) for m in missing]}); the checkpoint is incomplete"
        )
    manifest = _manifest(folder) if os.path.isfile(os.path.join(folder, "manifest.json")) else None
    return [load_file(_verified(folder, shard_file(r), manifest), mmap=True) for r in range(world_size)]
