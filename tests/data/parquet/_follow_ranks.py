"""Rank bodies for the following loader on real gloo ranks (imports no Lightning, but for the bodies that build a
DataModule: spawned ranks start faster)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch.distributed as dist
from torch.distributed import distributed_c10d

from lightrec.data import Batch
from lightrec.data.parquet import FollowingParquetLoader, FollowOptions, ParquetSource, build_spec
from lightrec.data.parquet import source as source_module
from tests.data.parquet.helpers import event_table

POLL = FollowOptions(poll_interval=0.01, idle_timeout=0.05)


def publish(folder: Path, name: str, start: int, rows: int) -> None:
    """Write under a hidden name, then rename into place (how a writer publishes a complete file)."""
    hidden = folder / f".{name}.tmp"
    pq.write_table(event_table(rows, seed=start, start=start), hidden, row_group_size=16)
    hidden.rename(folder / name)


def live_groups() -> int:
    """Process groups this process holds (the default group included): torch's registry of them."""
    return len(distributed_c10d._world.pg_map)


def _contents(batch: Batch) -> dict[str, list]:
    kjt = batch.sparse_features
    return {
        "dense": batch.dense_features.tolist(),
        "labels": batch.labels.tolist(),
        "values": kjt.values().tolist(),
        "lengths": kjt.lengths().tolist(),
    }


def _follow_once(folder: Path, rank: int, world_size: int) -> list[dict[str, list]]:
    """Train-like: build a following loader, take a batch, a file lands (listed by rank 0), read to the idle end."""
    source = ParquetSource(str(folder))
    spec = build_spec(source.schema, str(folder), "label", ["row"], ["scalar", "multi"], num_embeddings=50)
    loader = FollowingParquetLoader(source, spec, 5, follow=POLL, rank=rank, world_size=world_size)
    stream = iter(loader)
    batches = [next(stream)]  # every rank starts from rank 0's listing, however late it listed itself
    if rank == 0:  # only rank 0 lists: the other ranks learn of the file through the watcher's broadcast
        publish(folder, "part-01.parquet", 40, 30)
    batches += list(stream)
    loader.close()
    return [_contents(b) for b in batches]


def exhaust_following_loaders(rank: int, world_size: int, root: str, repeats: int) -> dict[str, list]:
    """Build and exhaust a following loader ``repeats`` times (a folder each), counting live process groups;
    then once more under a new default group (the old one destroyed with every group made under it)."""
    runs, groups = [], []
    for k in range(repeats):
        runs.append(_follow_once(Path(root) / f"run-{k}", rank, world_size))
        groups.append(live_groups())
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"file://{root}/again", rank=rank, world_size=world_size)
    runs.append(_follow_once(Path(root) / "again-run", rank, world_size))
    groups.append(live_groups())
    return {"runs": runs, "groups": groups}


def _following_loader(folder: Path, rank: int, world_size: int) -> FollowingParquetLoader:
    source = ParquetSource(str(folder))
    spec = build_spec(source.schema, str(folder), "label", ["row"], ["scalar", "multi"], num_embeddings=50)
    return FollowingParquetLoader(source, spec, 5, follow=POLL, rank=rank, world_size=world_size)


def _rows(batches: list[Batch]) -> list[int]:
    return [int(r) for b in batches for r in b.dense_features[:, 0].tolist()]


def follow_after_listings_that_differ(rank: int, world_size: int, root: str) -> dict[str, dict[str, object]]:
    """Each rank lists the folder itself when it builds its loader; make the listings differ on purpose.

    In ``root/<late>`` (one folder per case), every rank but ``late`` builds its loader, then a file
    lands, then rank ``late`` builds its own: its first listing holds a file the others' lacks.
    (The test's barrier orders the builds; the loaders themselves get no help.) Then each rank reads
    three batches, takes the position Lightning would checkpoint, reads to the idle end, and resumes a
    new loader from the position rank 0 took: what each read, and the positions, go back by case.
    """
    out: dict[str, dict[str, object]] = {}
    for late in range(world_size):
        folder = Path(root) / f"late-{late}"
        if rank != late:
            loader = _following_loader(folder, rank, world_size)
        if rank == (late + 1) % world_size:  # one of those that listed already publishes the next file
            publish(folder, "part-01.parquet", 40, 30)
        dist.barrier()  # the test's ordering: the file is there before rank `late` lists
        if rank == late:
            loader = _following_loader(folder, rank, world_size)
        stream = iter(loader)
        first = [next(stream) for _ in range(3)]
        position = loader.state_dict()  # Lightning holds one batch read ahead: 2 trained
        batches = first + list(stream)
        loader.close()
        box = [position]
        dist.broadcast_object_list(box, src=0)  # a checkpoint is rank 0's: every rank resumes from it
        resumed = _following_loader(folder, rank, world_size)
        resumed.load_state_dict(box[0])
        again = list(resumed)
        resumed.close()
        out[f"late-{late}"] = {"rows": _rows(batches), "position": position, "resumed": _rows(again)}
    return out


# ---------------------------------------------------------------- the start: empty folders, unmarked folders
START = FollowOptions(poll_interval=0.01, idle_timeout=1.0)


def write_in_place(path: Path, start: int, rows: int) -> None:
    """Write a whole file under its own name (a writer that marks the folder when it is done)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(event_table(rows, seed=start, start=start), path, row_group_size=16)


def half_written(path: Path) -> None:
    """A file in the middle of being written: its first half, no footer yet."""
    sink = pa.BufferOutputStream()
    pq.write_table(event_table(30, seed=9, start=900), sink, row_group_size=16)
    data = sink.getvalue().to_pybytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: len(data) // 2])


def finish(folder: Path, start: int, rows: int) -> None:
    """The writer finishes the folder's file in place, then marks the folder."""
    write_in_place(folder / "part-0.parquet", start, rows)
    (folder / "_SUCCESS").write_text("")


def _following_data(folder: Path, marker: str | None = None) -> Any:
    from lightrec.data import ParquetDataModule  # imports Lightning: only in the bodies that build one

    return ParquetDataModule(
        str(folder), label="label", dense=["row"], sparse=["scalar", "multi"], num_embeddings=50, batch_size=5,
        follow=True, poll_interval=START.poll_interval, idle_timeout=START.idle_timeout, marker=marker,
    )  # fmt: skip


@contextmanager
def _after_first_listing(then: Callable[[], None]) -> Iterator[None]:
    """Call ``then`` right after this process's first listing of a source's path: the test's ordering (the
    library gets no help), e.g. a barrier that lets another rank publish a file only after it."""
    original = source_module.list_files
    calls = 0

    def listing(fs: Any, path: str) -> list[str]:
        nonlocal calls
        found = original(fs, path)
        calls += 1
        if calls == 1:
            then()
        return found

    source_module.list_files = listing
    try:
        yield
    finally:
        source_module.list_files = original


def _train(data: Any, rank: int, folder: Path, later: tuple[str, int, int] | None) -> dict[str, object]:
    """Three batches, the position Lightning would checkpoint, a file landing (published by rank 0), to the idle end."""
    loader = data.train_dataloader()
    stream = iter(loader)
    first = [next(stream) for _ in range(3)]
    position = loader.state_dict()
    if later is not None and rank == 0:
        publish(folder, *later)
    batches = first + list(stream)
    loader.close()
    return {"rows": _rows(batches), "position": position}


def start_from_folders_being_written(rank: int, world_size: int, root: str) -> dict[str, dict[str, object]]:
    """Ranks that list a folder at different moments of its first file (the test made the folders).

    ``empty-<e>``: empty; rank ``e`` lists it first, then the other rank publishes ``part-00`` (40 rows) and
    builds its loader (rank 0 publishes ``part-01``, 30 rows, mid-stream). ``marker-<late>``: ``day=01``
    marked, ``day=02`` half written; every rank but ``late`` lists the folder (its DataModule's source),
    then ``day=02`` is finished and marked, then rank ``late`` lists it. ``never``: empty for good. The
    barriers order the ranks; the library gets no help. What each read, its position after two trained
    batches, its seconds.
    """
    import lightrec.data.parquet.datamodule  # noqa: F401 - Lightning imported before the clocks start

    out: dict[str, dict[str, object]] = {}
    for empty in range(world_size):
        folder = Path(root) / f"empty-{empty}"
        started = time.monotonic()
        if rank == empty:
            with _after_first_listing(lambda: (dist.barrier(), dist.barrier())):  # listed: publish now, published
                case = _train(_following_data(folder), rank, folder, ("part-01.parquet", 40, 30))
        else:
            dist.barrier()  # rank `empty` listed the folder: empty
            if rank == (empty + 1) % world_size:
                publish(folder, "part-00.parquet", 0, 40)
            dist.barrier()
            case = _train(_following_data(folder), rank, folder, ("part-01.parquet", 40, 30))
        out[f"empty-{empty}"] = {**case, "seconds": time.monotonic() - started}
    for late in range(world_size):
        folder = Path(root) / f"marker-{late}"
        started = time.monotonic()
        data = _following_data(folder, marker="_SUCCESS")
        if rank != late:
            data.source  # noqa: B018 - lists the folder now: day=02 is not finished yet
        if rank == (late + 1) % world_size:
            finish(folder / "day=02", 40, 30)
        dist.barrier()
        out[f"marker-{late}"] = {**_train(data, rank, folder, None), "seconds": time.monotonic() - started}
    started = time.monotonic()
    try:
        _following_data(Path(root) / "never").train_dataloader()
        out["never"] = {"type": None, "error": "", "seconds": time.monotonic() - started}
    except FileNotFoundError as exc:
        out["never"] = {"type": type(exc).__name__, "error": str(exc), "seconds": time.monotonic() - started}
    return out


# ---------------------------------------------------------------- loaders of their own world; unreadable files
def follow_alone_and_fail_together(rank: int, world_size: int, root: str) -> dict[str, object]:
    """``alone``: only rank 1 builds a following loader, of ``world_size=1``, and reads its folder to the idle end
    while rank 0 waits at a barrier (a loader of its own world makes no collective). ``too_wide``: a loader of
    ``world_size=3`` in this 2-rank world. ``unreadable``: both ranks follow a folder; in the poll that finds a
    new file, rank 1 cannot read its footer (a mount that does not show it): what each rank raised, how fast."""
    from lightrec.data.parquet import ParquetFileError
    from lightrec.data.parquet import follow as follow_module

    out: dict[str, object] = {}
    alone = Path(root) / "alone"
    if rank == 1:
        alone.mkdir()
        publish(alone, "part-00.parquet", 0, 20)
        source = ParquetSource(str(alone))
        spec = build_spec(source.schema, str(alone), "label", ["row"], ["scalar"], num_embeddings=50)
        loader = FollowingParquetLoader(source, spec, 5, follow=POLL, rank=0, world_size=1)
        out["alone"] = _rows(list(loader))
        loader.close()
    dist.barrier()
    try:
        next(iter(_following_loader(alone if rank == 1 else Path(root), rank, 3)))  # checked when it starts
        out["too_wide"] = None
    except ValueError as exc:
        out["too_wide"] = str(exc)
    original = follow_module.read_file_info

    def not_shown(fs: Any, path: str) -> Any:
        if path.endswith("part-01.parquet"):
            raise ParquetFileError("not shown by this rank's mount", path=path)
        return original(fs, path)

    for case, blind in (("unreadable", 1), ("unreadable-to-rank-0", 0)):
        folder = Path(root) / case
        if rank == 0:
            folder.mkdir()
            publish(folder, "part-00.parquet", 0, 20)
        dist.barrier()
        if rank == blind:  # rank 0 finds the file in a poll and cannot read it: it stops after three polls
            follow_module.read_file_info = not_shown
        loader = _following_loader(folder, rank, world_size)
        stream = iter(loader)
        next(stream)
        if rank == 1 - blind:
            publish(folder, "part-01.parquet", 20, 20)
        started = time.monotonic()
        try:
            list(stream)
            out[case] = {"type": None}
        except Exception as exc:  # noqa: BLE001 - the test compares what each rank raised
            out[case] = {"type": type(exc).__name__, "error": str(exc), "seconds": time.monotonic() - started}
        follow_module.read_file_info = original
        loader.close()
    # built before torch.distributed runs (a script hands it to trainer.fit, which starts the group)
    folder = Path(root) / "before-group"
    if rank == 0:
        folder.mkdir()
        publish(folder, "part-00.parquet", 0, 40)
    dist.barrier()
    dist.destroy_process_group()
    loader = _following_loader(folder, rank, world_size)
    dist.init_process_group("gloo", init_method=f"file://{root}/group-again", rank=rank, world_size=world_size)
    out["before-group"] = _rows(list(loader))
    loader.close()
    return out


def signals_run_while_waiting_for_rank_0(rank: int, world_size: int) -> dict[str, float]:
    """Rank 0 takes 2 s to answer (a slow listing); a signal reaching rank 1 meanwhile must have its Python
    handler run at once -- where a handler makes a collective of its own (Lightning's SIGTERM handler), a wait
    that runs it only afterwards hangs both ranks."""
    import os
    import signal
    import threading
    import time

    from lightrec.data.parquet.ranks import data_group, rank0_json

    data_group()  # made by the first agreement, long before a poll (its making is a blocking collective)
    handled: list[float] = []
    if rank == 0:
        time.sleep(2.0)
    else:
        signal.signal(signal.SIGUSR1, lambda *_: handled.append(time.monotonic()))
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGUSR1)).start()
    started = time.monotonic()
    value = rank0_json([["a.parquet"], False, None] if rank == 0 else None)
    return {"value": value, "returned": time.monotonic() - started, "handled": (handled[0] - started) if handled else -1.0}


def a_stop_asked_of_rank_1_alone(rank: int, world_size: int, root: str) -> dict[str, object]:
    """Both ranks follow a folder that gets no new file, with a poll every 60 s and no idle timeout; only rank 1
    is asked to stop (a SIGTERM that reached it alone). Every rank's wait must end, at the next poll's agreement."""
    import time

    source = ParquetSource(root)
    spec = build_spec(source.schema, root, "label", ["row"], ["scalar", "multi"], num_embeddings=50)
    never_idle = FollowOptions(poll_interval=60, idle_timeout=None)
    loader = FollowingParquetLoader(source, spec, 5, follow=never_idle, rank=rank, world_size=world_size)
    loader.stop_waiting = (lambda: True) if rank == 1 else (lambda: False)
    started = time.monotonic()
    rows = _rows(list(loader))  # the stream ends as after idle_timeout
    return {"rows": rows, "seconds": time.monotonic() - started}
