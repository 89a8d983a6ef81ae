"""A following loader's position names files by path: one replaced at the same path between the checkpoint and the
resume is refused with the file named, never read as if it were the file the position counted rows of (found in
review: the resumed run read the new file's rows from the old position, or failed with numpy's "Output array is the
wrong shape")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from lightrec.data.parquet import (
    FollowingParquetLoader,
    FollowOptions,
    ParquetSource,
    ResumeMismatchError,
    build_spec,
)
from tests.data.parquet.helpers import event_table

POLL = FollowOptions(poll_interval=0.02, idle_timeout=0.3)


def _write(folder: Path, name: str, start: int, rows: int, row_group_size: int = 16) -> None:
    """Publish a file whole: written under a hidden name, renamed in (over a file of that name, if any)."""
    hidden = folder / f".{name}.tmp"
    pq.write_table(event_table(rows, seed=start, start=start), hidden, row_group_size=row_group_size)
    hidden.rename(folder / name)


def _loader(folder: Path) -> FollowingParquetLoader:
    source = ParquetSource(str(folder))
    spec = build_spec(source.schema, str(folder), "label", ["row"], ["scalar"])
    return FollowingParquetLoader(source, spec, 10, follow=POLL)


def _rows(loader: FollowingParquetLoader) -> list[int]:
    return [int(r) for b in loader for r in b.dense_features[:, 0].tolist()]


def test_a_file_of_the_round_in_progress_replaced_before_the_resume_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, "part-00.parquet", 0, 45)
    loader = _loader(tmp_path)
    stream = iter(loader)
    for _ in range(3):
        next(stream)  # Lightning holds one batch read ahead: 2 trained, the position is batch 2 of part-00
    state: dict[str, Any] = dict(loader.state_dict())
    loader.close()
    _write(tmp_path, "part-00.parquet", 1000, 60)  # another file at the same path
    resumed = _loader(tmp_path)
    resumed.load_state_dict(state)
    # before: rows 1020.. of the new file, read from the old file's position (its rows 0-19 never read)
    with pytest.raises(ResumeMismatchError, match=r"part-00\.parquet.*replaced or rewritten"):
        next(iter(resumed))


@pytest.mark.parametrize(
    ("sizes_kept", "match"),
    [
        (True, r"part-00\.parquet"),
        # a checkpoint written before positions named their files' sizes: the carried rows the file lacks
        (False, r"rows 8-13 of row group 2 of .*part-00\.parquet"),
    ],
)
def test_a_carried_file_replaced_before_the_resume_is_refused(tmp_path: Path, sizes_kept: bool, match: str) -> None:
    _write(tmp_path, "part-00.parquet", 0, 45)
    loader = _loader(tmp_path)
    assert len(_rows(loader)) == 40  # the idle end: 5 rows (row group 2, rows 8-13) carried to the next round
    state: dict[str, Any] = dict(loader.state_dict())
    if not sizes_kept:
        state["fingerprint"] = ""
    _write(tmp_path, "part-00.parquet", 1000, 12, row_group_size=4)  # shorter: no rows 8-13 in its row group 2
    _write(tmp_path, "part-01.parquet", 2000, 20)
    resumed = _loader(tmp_path)
    resumed.load_state_dict(state)
    # before: ValueError "Output array is the wrong shape" from numpy, naming nothing
    with pytest.raises(ResumeMismatchError, match=match):
        next(iter(resumed))


def test_a_resume_with_the_same_files_and_new_ones_still_reads_every_row_once(tmp_path: Path) -> None:
    _write(tmp_path, "part-00.parquet", 0, 45)
    loader = _loader(tmp_path)
    stream = iter(loader)
    for _ in range(3):
        next(stream)
    state: dict[str, Any] = dict(loader.state_dict())
    loader.close()
    _write(tmp_path, "part-01.parquet", 45, 25)  # lands while the run is stopped
    resumed = _loader(tmp_path)
    resumed.load_state_dict(state)
    assert _rows(resumed) == list(range(20, 70))
