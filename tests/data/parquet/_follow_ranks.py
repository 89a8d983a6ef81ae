"""Rank bodies for the following loader on real gloo ranks (imports no Lightning: spawned ranks start faster)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import torch.distributed as dist
from torch.distributed import distributed_c10d

from lightrec.data import Batch
from lightrec.data.parquet import FollowingParquetLoader, FollowOptions, ParquetSource, build_spec
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
