"""The ranks that read one Parquet source agree on its files: rank 0's listing is every rank's.

Each rank lists the path itself, when its DataModule's ``source`` is first read (to size the tables,
build the spec, or plan its rows). A file that lands while the ranks start -- a writer that keeps
publishing, a folder being filled -- is then in some ranks' listings only, and the ranks would

* plan different rows: a rank with one step more waits for ever in a collective the others never
  reach (a hang until the process-group timeout);
* size tables from the data differently (``num_embeddings`` = largest id + 1 over the files each rank
  listed): the sharding plan, the checkpoints and every lookup then disagree between ranks.

:func:`agree_on_files` is the cure: rank 0 sends what it listed (each file's path and size) to every
rank; rank 0's files are taken by all, a rank that listed other files (or another version of one) reads
the footers of rank 0's, and a rank that had already sized its tables from its own listing (a model built
before ``trainer.fit``) is an error on *every* rank, naming the tables, so that no rank is left
waiting for one that failed alone. ``ParquetDataModule.setup`` calls it (Lightning's ``setup`` hook
runs on every rank once the process group is up), and so does building a loader, for code that builds
loaders without a Trainer; a DataModule used by one process alone (``Trainer(devices=1)`` beside a larger
world) agrees with no one.

The messages go over a gloo group of every rank (:func:`data_group`; also what the following loader's
rank 0 uses to tell the others what its polls found), so an NCCL training group is left alone.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable
from typing import TypeVar, cast

import torch
import torch.distributed as dist

from lightrec._compat import timeout_of
from lightrec.data.parquet.source import FileStamp

__all__ = [
    "RankDataMismatchError",
    "agree_on_files",
    "any_rank",
    "data_group",
    "distributed",
    "on_every_rank",
    "rank0_json",
    "rank0_value",
]

_T = TypeVar("_T")
_J = TypeVar("_J")  # a JSON value

# The data's gloo group and the default group it was made under, both held weakly: torch's registry
# holds them while they live, and destroy_process_group() lets them go (no destroyed group is kept
# alive here). None: no group made yet.
_DATA_GROUP: tuple[weakref.ReferenceType[dist.ProcessGroup], weakref.ReferenceType[dist.ProcessGroup]] | None = None


class RankDataMismatchError(RuntimeError):
    """The ranks could not agree on the data: a rank failed to list or read it, or sized its tables
    from files that rank 0 did not list. Raised on every rank alike."""


def distributed() -> bool:
    """True when ``torch.distributed`` runs more than one rank (the agreements below are collectives then)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def data_group() -> dist.ProcessGroup:
    """The gloo group of every rank on which the data's ranks agree (module docstring).

    Made at the first call under the current default group, then returned again: one per default group,
    however many DataModules and loaders are built; it ends with the default group. Collective at its
    first call under a default group: every rank must make that call (the ranks set up their data and
    iterate in step, so the first agreement is that call everywhere).
    """
    global _DATA_GROUP
    world = dist.group.WORLD
    if world is None:
        raise RuntimeError("the data's rank group needs torch.distributed initialized")
    if _DATA_GROUP is not None:
        made_under, group = _DATA_GROUP[0](), _DATA_GROUP[1]()
        if made_under is world and group is not None:
            return group
    # the default group's timeout (the user's, e.g. RecStrategy(timeout=...)), not torch's 30-minute default
    group = dist.new_group(backend="gloo", timeout=timeout_of(world))
    _DATA_GROUP = (weakref.ref(world), weakref.ref(group))
    return group


def rank0_value(value: _T) -> _T:
    """Rank 0's ``value`` on every rank (itself when not distributed): a collective of every rank."""
    if not distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=data_group())
    return box[0]


_SIGNAL_CHECK = 0.005  # seconds between checks of a collective in flight: Python's signal handlers run meanwhile


def _wait_in_python(work: dist.Work) -> None:
    """Wait for ``work`` in short sleeps rather than inside the C++ wait, so that this process's Python signal
    handlers run while it waits (a blocked wait would run them only once the collective is over); raises its
    error, e.g. the group's timeout."""
    while not work.is_completed():
        time.sleep(_SIGNAL_CHECK)
    work.wait()


def rank0_json(value: _J) -> _J:
    """Rank 0's ``value`` (JSON: lists, strings, numbers, booleans, None; tuples come back as lists) on every
    rank, itself when not distributed: a collective of every rank, waited for in Python (:func:`_wait_in_python`).

    What a following loader's poll sends. Why not :func:`rank0_value`: the ranks wait in it for rank 0's
    listing, which on an object store takes long, and a SIGTERM handler that makes a collective of its own
    (Lightning's broadcasts on the default group) must run on every rank that got the signal, or the ranks
    wait for each other until the group's timeout (measured before: two ranks hung, rank 0 in its handler's
    broadcast, rank 1 in the poll's).
    """
    if not distributed():
        return value
    group = data_group()
    root = dist.get_rank() == 0
    payload = torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8) if root else None
    size = torch.tensor([0 if payload is None else payload.numel()], dtype=torch.int64)
    _wait_in_python(cast(dist.Work, dist.broadcast(size, src=0, group=group, async_op=True)))
    if payload is None:
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
    _wait_in_python(cast(dist.Work, dist.broadcast(payload, src=0, group=group, async_op=True)))
    return value if root else cast(_J, json.loads(payload.numpy().tobytes().decode()))


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any rank, itself when not distributed: a collective of every
    rank (one all-reduce on :func:`data_group`, waited for in Python, as :func:`rank0_json`)."""
    if not distributed():
        return flag
    value = torch.tensor([int(flag)], dtype=torch.int32)
    _wait_in_python(cast(dist.Work, dist.all_reduce(value, op=dist.ReduceOp.MAX, group=data_group(), async_op=True)))
    return bool(value.item())


def on_every_rank(attempt: Callable[[], _T], what: str) -> _T:
    """``attempt()`` on this rank, or an error on every rank if any rank's raised (a collective when distributed:
    only whether each rank's attempt raised travels, in one ``all_gather_object``).

    The rank whose ``attempt`` raised re-raises its own exception (type and message unchanged); the others raise
    :class:`RankDataMismatchError` naming that rank, ``what`` it was doing and its error.
    """
    if not distributed():
        return attempt()
    mine: BaseException | None = None
    value: _T | None = None
    try:
        value = attempt()
    except Exception as exc:  # noqa: BLE001 -- told to every rank below, then raised here
        mine = exc
    error = None if mine is None else f"{type(mine).__name__}: {mine}"
    errors: list[str | None] = [error] * dist.get_world_size()
    dist.all_gather_object(errors, error, group=data_group())
    if mine is not None:
        raise mine
    failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
    if failed:
        raise RankDataMismatchError(
            "; ".join(f"rank {rank} failed while {what}: {e}" for rank, e in failed) + " (every rank stops with it)"
        )
    return cast(_T, value)  # no rank failed: attempt()'s value


def agree_on_files(listed: Callable[[], list[FileStamp]], adopt: Callable[[list[FileStamp]], None]) -> bool:
    """Make rank 0's file list every rank's (module docstring): a collective of every rank when distributed.

    Every rank lists (a rank that cannot stops every rank), rank 0's stamps go to every rank (one broadcast:
    no rank receives the others' lists), and a rank whose list differs adopts rank 0's (a rank that cannot
    stops every rank).

    Args:
        listed: this rank's files, listing the source if it was not listed yet.
        adopt: called on a rank whose list differs, with rank 0's, to take it.

    Returns:
        True where this rank took rank 0's files (its own listing differed), False where it had them or
        where ``torch.distributed`` runs one rank or none (nothing to agree on).
    """
    if not distributed():
        return False
    mine = on_every_rank(listed, "listing the data")
    first = rank0_value(mine)
    differs = mine != first
    on_every_rank(lambda: adopt(first) if differs else None, "taking the files rank 0 listed")
    return differs
