"""Rank bodies: ranks whose listings of one folder differ (a file landed while they started) and a
ParquetDataModule that must give them rank 0's files (spawned ranks; the DataModule imports Lightning)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

from tests.data.parquet.helpers import event_table

LARGE = 1000  # the late file's scalar ids are shifted by this: a table sized from it has >= 1000 rows


def _publish(folder: Path, name: str, start: int, rows: int, shift: int = 0) -> None:
    table = event_table(rows, seed=start, start=start)
    if shift:
        index = table.schema.get_field_index("scalar")
        table = table.set_column(index, "scalar", pc.add(table.column("scalar"), pa.scalar(shift, pa.int64())))
    hidden = folder / f".{name}.tmp"
    pq.write_table(table, hidden, row_group_size=16)
    hidden.rename(folder / name)


def _data(folder: Path, follow: bool) -> Any:
    from lightrec.data import ParquetDataModule  # imports Lightning: only in the spawned ranks

    options: dict[str, Any] = dict(follow=True, poll_interval=0.01, idle_timeout=0.2) if follow else {}
    # no num_embeddings: every table is sized from the data (the largest id + 1 over the files listed)
    return ParquetDataModule(str(folder), label="label", dense=["row"], sparse=["scalar", "multi"], batch_size=5, **options)


def _start(root: str, case: str, late: int, rank: int, world_size: int, follow: bool, size_early: bool, large: bool) -> Any:
    """Every rank but ``late`` lists the folder (one 40-row file), then the late file lands (30 rows; ``large``:
    its ids shifted by ``LARGE``), then rank ``late`` lists it: its DataModule's source holds a file the others' lacks. With
    ``size_early`` every rank also sizes its tables then, before ``setup`` (a model built before the fit)."""
    folder = Path(root) / case
    if rank == 0:
        folder.mkdir()
        _publish(folder, "part-00.parquet", 0, 40)
    dist.barrier()
    data = _data(folder, follow)
    if rank != late:
        data.table_configs(4) if size_early else data.source  # noqa: B018 - lists the folder now
    dist.barrier()
    if rank == (late + 1) % world_size:
        _publish(folder, "part-01.parquet", 40, 30, shift=LARGE if large else 0)
    dist.barrier()
    if rank == late:
        data.table_configs(4) if size_early else data.source  # noqa: B018 - lists it after the late file
    return data


def listings_that_differ(rank: int, world_size: int, root: str) -> dict[str, dict[str, object]]:
    """Per case, what each rank got: its tables' sizes after ``setup``, the rows it trained on, its steps;
    or the error ``setup`` raised (type and message)."""
    out: dict[str, dict[str, object]] = {}
    for follow in (False, True):
        for late in range(world_size):
            case = f"{'follow' if follow else 'fixed'}-late-{late}"
            # large ids only in a fixed folder: a followed one reads the late file in a poll when rank 0 lacked
            # it, and its ids must fit the tables sized at the start (documented; not what this test is about)
            data = _start(root, case, late, rank, world_size, follow, size_early=False, large=not follow)
            data.setup("fit")  # what Lightning calls on every rank, before configure_model sizes the tables
            sizes = [c.num_embeddings for c in data.table_configs(4)]
            files = [Path(f.path).name for f in data.source.files]  # the start (a following loader adds to it)
            loader = data.train_dataloader()
            rows = [int(r) for b in loader for r in b.dense_features[:, 0].tolist()]
            loader.close()
            out[case] = {"sizes": sizes, "rows": rows, "files": files}
    for late, large in [(r, True) for r in range(world_size)] + [(1, False)]:
        case = f"sized-early-late-{late}" + ("" if large else "-small-ids")
        data = _start(root, case, late, rank, world_size, follow=False, size_early=True, large=large)
        try:
            data.setup("fit")
            out[case] = {"error": None, "type": None}
        except Exception as exc:  # noqa: BLE001 - the test compares what every rank raised
            out[case] = {"error": str(exc), "type": type(exc).__name__}
    return out


def _regroup(root: str, name: str, rank: int, world_size: int) -> None:
    """A new default group (the old one destroyed): what a script sees before and after ``trainer.fit``."""
    dist.init_process_group("gloo", init_method=f"file://{root}/{name}", rank=rank, world_size=world_size)


def _raised(call: Any) -> dict[str, object]:
    try:
        call()
        return {"type": None, "error": None}
    except Exception as exc:  # noqa: BLE001 - the test compares what every rank raised
        return {"type": type(exc).__name__, "error": str(exc)}


def the_edges_of_agreeing(rank: int, world_size: int, root: str) -> dict[str, object]:
    """The cases around the agreement (a review's findings), each in its own folder:

    ``alone``: rank 0 alone reads with a trainer of one process (``Trainer(devices=1)`` after a 2-rank fit)
    while rank 1 waits at a barrier. ``before-group``: each rank calls ``setup`` before torch.distributed runs
    (a script), then again inside the fit: the second one agrees. ``retry``: a mismatch of tables sized early
    raises again on a second ``setup``. ``replaced``: a file replaced in place between two ranks' listings.
    ``val-later``: a file lands in the ``val`` folder after ``setup``, before one rank builds its loaders.
    """
    from types import SimpleNamespace

    out: dict[str, object] = {}
    alone = Path(root) / "alone"
    if rank == 0:
        alone.mkdir()
        _publish(alone, "part-00.parquet", 0, 40)
        data = _data(alone, follow=False)
        cpu = SimpleNamespace(root_device=torch.device("cpu"))  # what a Trainer of one process reports
        data.trainer = SimpleNamespace(global_rank=0, world_size=1, strategy=cpu, logger=None)
        data.setup("validate")
        out["alone"] = len(data.train_dataloader())
    dist.barrier()

    data = _start(root, "before-group", 1, rank, world_size, follow=False, size_early=False, large=True)
    dist.destroy_process_group()
    data.setup("fit")  # no torch.distributed yet: nothing to agree on, and nothing recorded as agreed
    _regroup(root, "group-again", rank, world_size)
    data.setup("fit")  # the fit's setup, under the group: rank 0's files
    out["before-group"] = {"files": [Path(f.path).name for f in data.source.files], "steps": len(data.train_dataloader())}

    data = _start(root, "retry", 1, rank, world_size, follow=False, size_early=True, large=True)
    out["retry"] = [_raised(lambda: data.setup("fit")) for _ in range(2)]

    folder = Path(root) / "replaced"
    if rank == 0:
        folder.mkdir()
        _publish(folder, "part-00.parquet", 0, 40)
    dist.barrier()
    data = _data(folder, follow=False)
    if rank == 0:
        data.source  # noqa: B018 - lists the first version
    dist.barrier()
    if rank == 1:
        _publish(folder, "part-00.parquet", 100, 70)  # replaced in place (renamed over it)
        data.source  # noqa: B018 - lists the second version
    dist.barrier()
    out["replaced"] = _raised(lambda: data.setup("fit"))

    folder = Path(root) / "val-later"
    if rank == 0:
        (folder / "val").mkdir(parents=True)
        _publish(folder, "part-00.parquet", 0, 40)
        _publish(folder / "val", "part-00.parquet", 40, 10)
    dist.barrier()
    from lightrec.data import ParquetDataModule

    data = ParquetDataModule(str(folder), label="label", dense=["row"], sparse=["scalar"], num_embeddings=50,
                             batch_size=5, val=str(folder / "val"))  # fmt: skip
    data.setup("fit")
    if rank == 0:
        sizes = [len(data.train_dataloader()), len(data.val_dataloader())]
    dist.barrier()
    if rank == 0:
        _publish(folder / "val", "part-01.parquet", 50, 10)  # lands after the ranks agreed
    dist.barrier()
    if rank == 1:
        sizes = [len(data.train_dataloader()), len(data.val_dataloader())]
    out["val-later"] = sizes

    # each node's own copy of the same files (copied at start-up): same paths and bytes, their own times
    from lightrec.data.parquet import ParquetSource
    from lightrec.data.parquet.ranks import agree_on_files

    node = Path(root) / f"node-{rank}"
    (node / "data").mkdir(parents=True)
    pq.write_table(event_table(20, seed=1, start=0), node / "data" / "part-00.parquet", row_group_size=16)
    os.utime(node / "data" / "part-00.parquet", ns=(10**18 + rank * 10**9, 10**18 + rank * 10**9))
    copies = ParquetSource("data", filesystem=pafs.SubTreeFileSystem(str(node), pafs.LocalFileSystem()))
    out["node-copies"] = _raised(lambda: agree_on_files(copies.stamps, copies.with_files))
    return out
