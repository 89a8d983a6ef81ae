"""Rank bodies: ranks whose listings of one folder differ (a file landed while they started) and a
ParquetDataModule that must give them rank 0's files (spawned ranks; the DataModule imports Lightning)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
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
