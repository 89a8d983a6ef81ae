"""Publish a sharded model: gather the rows that changed from the ranks that hold them, write a version.

For ``DistributedModelParallel`` users (the Lightning ``DeltaPublisher`` callback calls the same)::

    from lightrec.distributed.deltas import publish_changes
    from lightrec.distributed.model_tracker import DeltaTrackerConfig

    tracker = dmp.init_torchrec_delta_tracker(DeltaTrackerConfig(consumers=["publish"]))
    publish_changes(dmp, "publish/", tracker, consumer="publish", row_format="int8")   # v1: a snapshot
    for step, batch in enumerate(batches, 1):
        train(dmp, batch)
        if step % 100 == 0:                                   # every rank calls it (a collective)
            publish_changes(dmp, "publish/", tracker, consumer="publish", global_step=step)

One publish, on every rank of the sharding group::

    1. what changed here: the tracker's rows of this rank's shards since the consumer's last read
       (a snapshot: every row; a dense-kernel table, which its dense optimizer may move anywhere:
       every row)
    2. all_gather -> per table, the union U over ranks (a data-parallel table's rows changed
       wherever any rank's batch touched them: every replica applied every update)
    3. per chunk of tables: each rank reads the rows of U it owns -- its row block (row-wise,
       table-row-wise), its column slice (column-wise, table-column-wise), the whole table
       (table-wise; data-parallel: rank 0) -- through the kernels (a tiered table's cache too),
       with, for managed tables, the raw ids its id map keeps for them; the blocks it filled go to
       every rank with the status exchange, the values (as int32 bits) to rank 0 by a gather of
       only what each rank owns; rank 0 places them: exactly one rank owns each value, so rank 0
       gets every value bit for bit
    4. rank 0 writes the version with ``DeltaWriter`` (rows converted to each table's row format
       there), with the dense weights when asked; every rank learns the outcome

A rank that dies mid-publish makes the others raise ``CollectiveError`` (naming the collective)
within the process group's timeout; rank 0 writes only after every rank's rows have arrived, and
the writer's rename is atomic, so the folder keeps complete versions only.

A publish that fails (a full disk, a dead peer, a rank that could not read its rows) has already
moved its tracker's window past the rows it read: no version holds them, and no later delta would
report them. So the next publish that reads the same tracker as the same consumer is a snapshot,
even when asked for a delta; rank 0 decides, and broadcasts the kind, so every rank agrees.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

import torch
import torch.distributed as dist
from torch import nn
from typing_extensions import Unpack

from lightrec.distributed.comm.failures import collective_guard
from lightrec.distributed.comm.sharding_env import resolve_group
from lightrec.distributed.deltas.errors import DeltaError, DeltaFormatError, DeltaWriteError
from lightrec.distributed.deltas.manifest import TableSpec
from lightrec.distributed.deltas.sharded_rows import (
    CHUNK_BYTES,
    ChunkRead,
    DeltaPublishError,
    PublishGroup,
    gather_rows,
    raise_if_any,
    read_chunks,
)
from lightrec.distributed.deltas.writer import DeltaWriter
from lightrec.distributed.dmp.placement import detached
from lightrec.distributed.model_parallel import DistributedModelParallel
from lightrec.distributed.model_tracker import ModelDeltaTracker, ModelDeltaTrackerTrec
from lightrec.distributed.model_tracker.delta_store import sorted_unique
from lightrec.distributed.model_tracker.tables import TrackedTable, find_tables, sharded_collections
from lightrec.distributed.sharding.collection import ShardedCollectionBase

__all__ = [
    "DeltaPublishError",
    "PreparedPublish",
    "PublishOptions",
    "abandon_publish",
    "finish_publish",
    "prepare_publish",
    "publish_changes",
    "publish_group",
    "sharded_dense_weights",
    "sharded_table_specs",
]


def publish_group(model: nn.Module) -> PublishGroup:
    """The process group the model's sharded collections use, as this rank sees it.

    Raises:
        DeltaFormatError: no sharded collection, or collections on different groups.
    """
    envs = [m.sharding_env for _, m in sharded_collections(model)]
    if not envs:
        raise DeltaFormatError(f"{type(model).__name__} holds no sharded embedding collection; publish an "
                               "unsharded model with publish_snapshot / publish_rows")  # fmt: skip
    if any(e.pg is not envs[0].pg for e in envs[1:]):
        raise DeltaFormatError("the model's sharded collections use different process groups; publish each "
                               "collection's model separately")  # fmt: skip
    env = envs[0]
    distributed = dist.is_available() and dist.is_initialized() and env.world_size > 1
    nccl = distributed and dist.get_backend(resolve_group(env.pg)) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    return PublishGroup(env.pg, env.rank if distributed else 0, env.world_size if distributed else 1, device)


def _by_name(tables: Mapping[str, TrackedTable]) -> dict[str, TrackedTable]:
    out: dict[str, TrackedTable] = {}
    for t in tables.values():
        if t.name in out:
            raise DeltaFormatError(f"two collections hold a table named {t.name!r} ({out[t.name].fqn}, {t.fqn}); the "
                                   "publish folder keys tables by name: rename one")  # fmt: skip
        out[t.name] = t
    return out


def sharded_table_specs(model: nn.Module, row_format: str | Mapping[str, str] = "fp32") -> list[TableSpec]:
    """The ``TableSpec`` of every table of a sharded ``model`` (the same on every rank; no collective).

    Raises:
        DeltaFormatError: no sharded collection, two tables with one name, or ``row_format``
            names a table the model does not have.
    """
    return _specs(_by_name(find_tables(model)[0]), row_format)


def _specs(tables: Mapping[str, TrackedTable], row_format: str | Mapping[str, str]) -> list[TableSpec]:
    formats = {n: row_format for n in tables} if isinstance(row_format, str) else dict(row_format)
    unknown = sorted(set(formats) - set(tables))
    if unknown:
        raise DeltaFormatError(f"row_format names tables {unknown} the model does not have; its tables: {sorted(tables)}")
    return [TableSpec(n, t.num_embeddings, t.dim, formats.get(n, "fp32"), t.managed) for n, t in tables.items()]


def sharded_dense_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every floating-point state-dict entry of ``model`` outside its sharded collections' tables (the
    dense layers, and what a collection keeps whole on every rank: ``replicated_state``, e.g. position
    weights), float32 on the CPU, by the model's own names (the names a serving artifact exported from
    it keeps); copies, so training on does not change them."""
    root = model.module if isinstance(model, DistributedModelParallel) else model
    if isinstance(root, ShardedCollectionBase):
        state = root.replicated_state()
    else:
        with detached(root, (ShardedCollectionBase,)) as collections:
            state = root.state_dict()
            for path, collection in collections:
                assert isinstance(collection, ShardedCollectionBase)  # what detached took out
                state.update(collection.replicated_state(f"{path}."))
    return {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point()}  # fmt: skip


# ---- reads a failed publish lost -----------------------------------------------------------------
# A publish reads its tracker before it sends and writes the rows, and the read moves the consumer's
# window on: when anything fails after it, those rows are in no version and in no later delta. The
# (tracker, consumer) is then marked, and the next publish that reads it is a snapshot (every row);
# that snapshot's read clears the mark. Marking on any failure (even one before the read) costs at
# most one snapshot and needs no bookkeeping of how far each rank got. Weak keys: a tracker dropped by
# its owner takes its marks with it. The lock: a BackgroundPublisher's thread marks its failures.
_LOST: weakref.WeakKeyDictionary[ModelDeltaTracker, set[str]] = weakref.WeakKeyDictionary()
_LOST_LOCK = threading.Lock()


def _consumer_name(consumer: str | None) -> str:
    return consumer or ModelDeltaTracker.DEFAULT_CONSUMER


def _mark_lost(tracker: ModelDeltaTracker | None, consumer: str | None) -> None:
    """A publish reading ``tracker`` as ``consumer`` failed: its next publish is a snapshot."""
    if isinstance(tracker, ModelDeltaTrackerTrec):  # the only kind a publish reads (others are refused)
        with _LOST_LOCK:
            _LOST.setdefault(tracker, set()).add(_consumer_name(consumer))


def _lost(tracker: ModelDeltaTracker | None, consumer: str | None) -> bool:
    with _LOST_LOCK:
        return tracker is not None and _consumer_name(consumer) in _LOST.get(tracker, ())


def _first_read(tracker: ModelDeltaTracker | None, consumer: str | None) -> bool:
    """``consumer`` has never read ``tracker``: its first read holds the rows changed since the tracker was
    built, not since the folder's newest version (another process's, or a run this one resumed from), so a
    delta from it would leave every row trained in between stale."""
    return isinstance(tracker, ModelDeltaTrackerTrec) and tracker.per_consumer_batch_idx.get(_consumer_name(consumer)) == -1


def _clear_lost(tracker: ModelDeltaTracker | None, consumer: str | None) -> None:
    if tracker is not None:
        with _LOST_LOCK:
            _LOST.get(tracker, set()).discard(_consumer_name(consumer))


# ---- 1-2: what changed, as the union over ranks ---------------------------------------------------
def _local_changes(tables: dict[str, TrackedTable], tracker: ModelDeltaTracker | None, consumer: str | None,
                   snapshot: bool) -> dict[str, torch.Tensor]:  # fmt: skip
    read = tracker.get_unique_ids(consumer) if tracker is not None else {}
    out = {}
    for name, t in tables.items():
        if snapshot or not t.updates_touched_rows_only:
            out[name] = torch.arange(t.num_embeddings) if t.local or snapshot else torch.zeros(0, dtype=torch.int64)
        else:
            out[name] = read.get(t.fqn, torch.zeros(0, dtype=torch.int64)).cpu()
    return out


def _union(changes: dict[str, torch.Tensor], group: PublishGroup, snapshot: bool,
           tables: dict[str, TrackedTable]) -> dict[str, torch.Tensor]:  # fmt: skip
    """Per table, the sorted union of every rank's changed rows (collective unless a snapshot)."""
    if snapshot:
        return {n: torch.arange(t.num_embeddings) for n, t in tables.items()}
    names = list(changes)
    if group.world == 1:
        return {n: sorted_unique([changes[n]]) for n in names}
    counts = torch.tensor([changes[n].numel() for n in names], dtype=torch.int64, device=group.device)
    all_counts = [torch.empty_like(counts) for _ in range(group.world)]
    with collective_guard("publish_changes: all_gather of the changed row counts", group.pg):
        dist.all_gather(all_counts, counts, group=group.pg)
    longest = max(int(c.sum()) for c in all_counts)
    flat = torch.zeros(longest, dtype=torch.int64, device=group.device)
    mine = torch.cat([changes[n] for n in names]) if names else flat[:0]
    flat[: mine.numel()] = mine.to(group.device)
    gathered = [torch.empty_like(flat) for _ in range(group.world)]
    with collective_guard("publish_changes: all_gather of the changed rows", group.pg):
        dist.all_gather(gathered, flat, group=group.pg)
    parts: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for rank_counts, rank_ids in zip(all_counts, gathered, strict=True):
        sizes = rank_counts.cpu().tolist()
        for n, piece in zip(names, torch.split(rank_ids.cpu()[: sum(sizes)], sizes), strict=True):
            parts[n].append(piece)
    return {n: sorted_unique(p) for n, p in parts.items()}


# ---- 4: the write, on rank 0 ---------------------------------------------------------------------
def publish_changes(
    model: nn.Module,
    target: DeltaWriter | str | os.PathLike[str] | None,
    tracker: ModelDeltaTracker | None = None,
    consumer: str | None = None,
    dense: bool = False,
    snapshot: bool | None = None,
    global_step: int = 0,
    row_format: str | Mapping[str, str] = "fp32",
    retention: int | None = 2,
    chunk_bytes: int = CHUNK_BYTES,
    dense_module: nn.Module | None = None,
) -> int:
    """Publish a sharded model's changed rows (or every row) as the next version. Collective.

    Args:
        model: a ``DistributedModelParallel`` or a module holding sharded collections (the same on
            every rank of their group); dense weights are named as in its state dict.
        target: on rank 0, a ``DeltaWriter`` or a folder (a writer is made with the model's
            ``sharded_table_specs(model, row_format)`` and ``retention``); ignored on the others.
        tracker: the model's delta tracker (``DistributedModelParallel.init_torchrec_delta_tracker``);
            a delta publishes what it reports since ``consumer``'s previous read (this call reads it;
            a snapshot reads it too, so the next delta starts from the snapshot). None: snapshots only.
        consumer: the tracker's consumer this publisher reads as (None: ``"default"``).
        dense: also publish the dense weights (a snapshot always does).
        snapshot: True: every row of every table and the dense weights; False: a delta; None: a
            snapshot when the folder has none yet (rank 0 decides), else a delta. After a publish
            with this tracker and consumer failed, the next one is a snapshot whatever this says
            (the failed one's rows were read from the tracker; see the module docstring).
        global_step: the training step the version holds.
        row_format: the serving artifact's rows for every table, or ``{table: format}``
            (``"fp32"``, ``"fp16"``, ``"int8"``, ``"int4"``); used when ``target`` is a folder.
        retention: snapshots kept when ``target`` is a folder (``DeltaWriter``'s).
        chunk_bytes: rows travel in chunks of about this many bytes per rank.
        dense_module: the module whose state-dict names the dense weights take (the part a
            serving artifact is exported from, e.g. a LightningModule's ``model``); default ``model``.

    Returns:
        The new version, on every rank.

    Raises:
        DeltaFormatError: a delta without a tracker, bad rows (e.g. non-finite), a bad row format.
        DeltaWriteError: rank 0's disk refused the version (raised on every rank; nothing is visible).
        DeltaPublishError: a rank failed to read its rows (raised on every rank).
        CollectiveError: a peer died or hung during the publish.

        After any of these, the next publish with ``tracker`` and ``consumer`` is a snapshot.
    """
    prepared = prepare_publish(model, target, tracker, consumer=consumer, dense=dense, snapshot=snapshot,
                               global_step=global_step, row_format=row_format, retention=retention,
                               chunk_bytes=chunk_bytes, dense_module=dense_module)  # fmt: skip
    return finish_publish(prepared, prepared.group)


@dataclass
class PreparedPublish:
    """A publish's first part, done at the step the version holds (``prepare_publish``): every rank's
    rows of the version, read; rank 0's writer and dense weights. ``finish_publish`` sends and writes
    them, in this thread or another (``BackgroundPublisher``); training may go on in between."""

    group: PublishGroup
    tables: dict[str, TrackedTable]
    union: dict[str, torch.Tensor]
    reads: list[ChunkRead]
    full: bool
    global_step: int
    writer: DeltaWriter | None  # rank 0's
    dense_weights: dict[str, torch.Tensor] | None  # rank 0's copy, when the version carries them
    error: BaseException | None  # rank 0's, from copying the dense weights: reported by finish_publish
    tracker: ModelDeltaTracker | None = None  # what the rows were read from: marked if finish_publish fails
    consumer: str | None = None


class PublishOptions(TypedDict, total=False):
    """:func:`publish_changes`' keyword arguments after ``tracker`` (defaults as there), for the
    functions that take them on (``prepare_publish``, ``BackgroundPublisher.publish``)."""

    consumer: str | None
    dense: bool
    snapshot: bool | None
    global_step: int
    row_format: str | Mapping[str, str]
    retention: int | None
    chunk_bytes: int
    dense_module: nn.Module | None


def prepare_publish(
    model: nn.Module,
    target: DeltaWriter | str | os.PathLike[str] | None,
    tracker: ModelDeltaTracker | None = None,
    **options: Unpack[PublishOptions],
) -> PreparedPublish:
    """Steps 1-3's reads of :func:`publish_changes` (arguments as there): collective over the model's
    group (the kind, the union), then each rank copies the rows it owns. Nothing is sent or written.
    A failure here makes the next publish with ``tracker`` and its consumer a snapshot."""
    try:
        return _prepare(model, target, tracker, **options)
    except BaseException:
        _mark_lost(tracker, options.get("consumer"))
        raise


def _prepare(
    model: nn.Module,
    target: DeltaWriter | str | os.PathLike[str] | None,
    tracker: ModelDeltaTracker | None,
    **options: Unpack[PublishOptions],
) -> PreparedPublish:
    consumer, snapshot = options.get("consumer"), options.get("snapshot")
    row_format, retention = options.get("row_format", "fp32"), options.get("retention", 2)
    if tracker is not None and not isinstance(tracker, ModelDeltaTrackerTrec):
        raise DeltaFormatError(f"tracker must be the model's ModelDeltaTrackerTrec, got {type(tracker).__name__}")
    group = publish_group(model)
    tables = _by_name(tracker.tables if tracker is not None else find_tables(model)[0])
    kind: list[object] = [None]
    writer: DeltaWriter | None = None
    error: BaseException | None = None
    if group.rank == 0:  # rank 0 alone decides the kind (its lost-read mark included): every rank agrees
        try:
            writer = target if isinstance(target, DeltaWriter) else DeltaWriter(
                _folder(target), _specs(tables, row_format), retention)  # fmt: skip
            if _lost(tracker, consumer) or (_first_read(tracker, consumer) and writer.latest_version is not None):
                kind[0] = True
            else:
                kind[0] = bool(snapshot) if snapshot is not None else writer.latest_snapshot is None
        except (DeltaError, OSError) as exc:
            error = exc
    raise_if_any(error, group, "open the publish folder")
    if group.world > 1:
        with collective_guard("publish_changes: broadcast of the version's kind", group.pg):
            dist.broadcast_object_list(kind, src=group.root(), group=group.pg)
    full = bool(kind[0])
    if not full and tracker is None:
        raise DeltaFormatError("a delta needs the tracker that says which rows changed: pass tracker= (or snapshot=True)")
    union = _union(_local_changes(tables, tracker, consumer, full), group, full, tables)
    if full:  # this read starts the chain afresh: what a failed publish lost is in it
        _clear_lost(tracker, consumer)
    reads = read_chunks(union, tables, group.rank, options.get("chunk_bytes", CHUNK_BYTES))
    weights, error = None, None
    if group.rank == 0 and (options.get("dense", False) or full):
        try:
            weights = sharded_dense_weights(options.get("dense_module") or model)
        except Exception as exc:  # noqa: BLE001 - every rank learns it in finish_publish
            error = exc
    return PreparedPublish(group, tables, union, reads, full, options.get("global_step", 0), writer, weights, error,
                           tracker, consumer)  # fmt: skip


def finish_publish(prepared: PreparedPublish, group: PublishGroup) -> int:
    """Step 3's exchange and step 4 of :func:`publish_changes`: ``prepared``'s rows to rank 0 over
    ``group`` (the model's, or a publisher's own group of the same ranks), rank 0 writes the version;
    every rank returns it or raises what failed (as ``publish_changes``). Collective over ``group``.
    A failure makes the next publish with ``prepared``'s tracker and consumer a snapshot."""
    try:
        return _finish(prepared, group)
    except BaseException:
        _mark_lost(prepared.tracker, prepared.consumer)
        raise


def _finish(prepared: PreparedPublish, group: PublishGroup) -> int:
    rows = gather_rows(prepared.union, prepared.tables, prepared.reads, group)
    status: list[object] = [prepared.error]
    if group.rank == 0 and prepared.error is None:
        writer = prepared.writer
        assert writer is not None
        try:
            if prepared.full:
                status[0] = writer.write_snapshot(rows, prepared.dense_weights or {}, prepared.global_step)
            else:
                status[0] = writer.write_delta({n: r for n, r in rows.items() if r.ids.numel()},
                                               prepared.dense_weights, prepared.global_step)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - every rank learns it below; rank 0 re-raises it
            status[0] = exc
    if group.world > 1:
        shared: list[object] = [status[0] if isinstance(status[0], int) else _describe(status[0])]
        with collective_guard("publish_changes: broadcast of rank 0's write", group.pg):
            dist.broadcast_object_list(shared, src=group.root(), group=group.pg)
        if group.rank != 0:
            status[0] = shared[0]
    return _outcome(status[0])


def abandon_publish(prepared: PreparedPublish) -> None:
    """``prepared`` will never be finished (e.g. ``BackgroundPublisher.abort`` dropped it): its rows
    were read from the tracker, so the next publish with that tracker and consumer is a snapshot."""
    _mark_lost(prepared.tracker, prepared.consumer)


def _folder(target: object) -> str | os.PathLike[str]:
    if not isinstance(target, (str, os.PathLike)):
        raise DeltaFormatError(f"target must be a DeltaWriter or a folder on rank 0, got {type(target).__name__}")
    return target


def _describe(outcome: object) -> tuple[str, str, int | None]:
    if isinstance(outcome, DeltaWriteError):
        return ("DeltaWriteError", str(outcome), outcome.errno)
    if isinstance(outcome, BaseException):
        return (type(outcome).__name__, str(outcome), None)
    return ("DeltaPublishError", f"rank 0 did not write: {outcome!r}", None)


def _outcome(outcome: object) -> int:
    if isinstance(outcome, int):
        return outcome
    if isinstance(outcome, BaseException):
        raise outcome
    assert isinstance(outcome, tuple)  # _describe's (kind, message, errno), from rank 0
    kind, message, errno = outcome
    if kind == "DeltaWriteError":
        raise DeltaWriteError(f"rank 0 could not write the version: {message}", errno)
    if kind == "DeltaFormatError":
        raise DeltaFormatError(f"rank 0 refused the version: {message}")
    raise DeltaPublishError(f"rank 0 failed to write the version: {kind}: {message}")
