"""The start of following a folder: a folder not marked yet is left for the poll that finds its marker (the
first round honours ``marker`` as the polls do), and a start with no complete file waits for the first one to
land, on every rank, instead of failing on the rank that listed too early while the others wait for it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lightrec.data.parquet import FollowingParquetLoader, FollowOptions, ParquetSource, build_spec
from tests.data.parquet._follow_ranks import finish as _finish
from tests.data.parquet._follow_ranks import half_written as _half_written
from tests.data.parquet._follow_ranks import start_from_folders_being_written
from tests.data.parquet._follow_ranks import write_in_place as _write
from tests.multiprocess import run_ranks

MARKED = FollowOptions(poll_interval=0.02, idle_timeout=0.5, marker="_SUCCESS")


def _data(folder: Path, options: FollowOptions = MARKED) -> object:
    from lightrec.data import ParquetDataModule

    return ParquetDataModule(
        str(folder), label="label", dense=["row"], sparse=["scalar"], batch_size=10, num_embeddings=50, follow=True,
        poll_interval=options.poll_interval, idle_timeout=options.idle_timeout, marker=options.marker,
    )  # fmt: skip


def _direct(folder: Path, source_marker: str | None, options: FollowOptions = MARKED) -> FollowingParquetLoader:
    source = ParquetSource(str(folder), marker=source_marker)
    spec = build_spec(source.schema, str(folder), "label", ["row"], ["scalar"], num_embeddings=50)
    return FollowingParquetLoader(source, spec, 10, follow=options)


def _rows(batches: list) -> list[int]:
    return [int(r) for b in batches for r in b.dense_features[:, 0].tolist()]


@pytest.mark.parametrize("how", ["datamodule", "source with the marker"])
def test_a_folder_being_written_at_the_start_is_read_once_its_marker_appears(tmp_path: Path, how: str) -> None:
    _finish(tmp_path / "day=01", 0, 20)
    _half_written(tmp_path / "day=02" / "part-0.parquet")  # no footer yet, no marker
    if how == "datamodule":
        loader = _data(tmp_path).train_dataloader()  # type: ignore[attr-defined]
    else:
        loader = _direct(tmp_path, "_SUCCESS")
    stream = iter(loader)
    first = [next(stream), next(stream)]
    assert loader.state_dict()["follow"]["round"] == [str(tmp_path / "day=01" / "part-0.parquet")]
    writer = threading.Timer(0.1, _finish, (tmp_path / "day=02", 20, 20))
    writer.start()
    rest = list(stream)  # day=02 in the poll that finds its marker, then the idle end
    writer.join()
    assert _rows(first) == list(range(20))
    assert _rows(rest) == list(range(20, 40))  # every row once, none of the half-written file's


def test_a_source_listed_without_the_marker_still_leaves_unmarked_folders_to_the_polls(tmp_path: Path) -> None:
    """The user built the source without ``marker``: a file of an unmarked folder was listed (its footer then
    readable) and is rewritten in place before the folder is marked -- the first round leaves it out, and the
    poll that finds the marker reads it as it is then, not as it was listed."""
    _finish(tmp_path / "day=01", 0, 20)
    _write(tmp_path / "day=02" / "part-0.parquet", 100, 10)  # an early flush of the file, not done yet
    loader = _direct(tmp_path, None)
    stream = iter(loader)
    first = [next(stream), next(stream)]
    writer = threading.Timer(0.1, _finish, (tmp_path / "day=02", 20, 30))
    writer.start()
    rest = list(stream)
    writer.join()
    assert _rows(first + rest) == list(range(50))


def test_a_position_taken_while_a_folder_was_unmarked_resumes_exactly(tmp_path: Path) -> None:
    _write(tmp_path / "day=01" / "part-0.parquet", 0, 35)
    (tmp_path / "day=01" / "_SUCCESS").write_text("")
    _write(tmp_path / "day=02" / "part-0.parquet", 35, 30)  # written, not marked yet
    data = _data(tmp_path)
    loader = data.train_dataloader()  # type: ignore[attr-defined]
    stream = iter(loader)
    for _ in range(3):
        next(stream)  # Lightning holds one batch read ahead: 2 trained
    state = loader.state_dict()
    assert state["batch"] == 2 and state["follow"]["round"] == [str(tmp_path / "day=01" / "part-0.parquet")]
    (tmp_path / "day=02" / "_SUCCESS").write_text("")  # marked while the run is stopped
    resumed = _data(tmp_path).train_dataloader()  # type: ignore[attr-defined]
    resumed.load_state_dict(state)
    # the rest of day=01 (its last 5 rows left over), then day=02 in the next round: as the uninterrupted run would
    assert _rows(list(resumed)) == list(range(20, 60))


def test_a_following_start_waits_for_the_first_file_to_land(tmp_path: Path) -> None:
    (tmp_path / "day=01").mkdir()  # an empty folder (files will land): one file is written, then marked
    writer = threading.Timer(0.2, _finish, (tmp_path / "day=01", 0, 20))
    writer.start()
    started = time.monotonic()
    data = _data(tmp_path, FollowOptions(poll_interval=0.02, idle_timeout=5.0, marker="_SUCCESS"))
    loader = data.train_dataloader()  # type: ignore[attr-defined]
    writer.join()
    assert 0.2 <= time.monotonic() - started < 4
    assert loader.state_dict()["follow"]["round"] == [str(tmp_path / "day=01" / "part-0.parquet")]
    stream = iter(loader)
    assert _rows([next(stream), next(stream)]) == list(range(20))
    loader.close()


@pytest.mark.parametrize("marker", [None, "_SUCCESS"])
def test_a_following_start_that_stays_empty_is_an_error_naming_the_path_after_the_idle_timeout(
    tmp_path: Path, marker: str | None
) -> None:
    if marker is not None:
        _write(tmp_path / "day=01" / "part-0.parquet", 0, 20)  # there, but its folder is never marked
    started = time.monotonic()
    with pytest.raises(FileNotFoundError) as error:
        data = _data(tmp_path, FollowOptions(poll_interval=0.02, idle_timeout=0.3, marker=marker))
        data.check_data()  # type: ignore[attr-defined]
    assert 0.3 <= time.monotonic() - started < 3
    message = str(error.value)
    assert repr(str(tmp_path)) in message and "idle_timeout=0.3" in message
    assert ("no folder holding them has the marker file '_SUCCESS'" in message) == (marker is not None)


@pytest.mark.parametrize("missing", ["folder", "glob base"])
def test_a_following_start_on_a_folder_that_does_not_exist_is_refused_at_once(tmp_path: Path, missing: str) -> None:
    """A mistyped path is not waited for (idle_timeout would make it a long silent wait)."""
    path = tmp_path / "typo" if missing == "folder" else tmp_path / "typo" / "day=*" / "part-*.parquet"
    from lightrec.data.parquet import following_source

    started = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"cannot follow .*typo' does not exist\. Check the path"):
        following_source(str(path), FollowOptions(poll_interval=0.02, idle_timeout=30, marker=None))
    assert time.monotonic() - started < 1


def test_a_missing_prefix_on_a_store_other_than_the_local_disk_is_waited_for(tmp_path: Path) -> None:
    """On an object store an empty prefix does not exist: following it waits for the first file (here a
    subtree filesystem stands in for one: its type is not "local")."""
    import pyarrow.fs as pafs

    from lightrec.data.parquet import following_source

    store = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    assert store.type_name != "local"
    landing = threading.Timer(0.2, lambda: _write(tmp_path / "prefix" / "part-0.parquet", 0, 10))
    landing.start()
    try:
        source = following_source("prefix", FollowOptions(poll_interval=0.02, idle_timeout=10), filesystem=store)
    finally:
        landing.join()
    assert [f.path for f in source.files] == ["prefix/part-0.parquet"]


def test_a_first_file_listed_before_its_footer_is_written_is_waited_for(tmp_path: Path) -> None:
    """A writer writing the first file in place: following it used to fail at once when the listing came before
    the footer (1 start in 12 of the test above); the start now gives it the polls a later file gets."""
    from lightrec.data.parquet import following_source

    _half_written(tmp_path / "part-0.parquet")
    finishing = threading.Timer(0.05, lambda: _write(tmp_path / "part-0.parquet", 0, 10))
    finishing.start()
    try:
        source = following_source(str(tmp_path), FollowOptions(poll_interval=0.04, idle_timeout=10))
    finally:
        finishing.join()
    assert [Path(f.path).name for f in source.files] == ["part-0.parquet"] and sum(source.files[0].row_groups) == 10


def test_a_first_file_that_stays_unreadable_is_an_error_after_three_polls(tmp_path: Path) -> None:
    from lightrec.data.parquet import ParquetFileError, following_source

    _half_written(tmp_path / "part-0.parquet")
    started = time.monotonic()
    with pytest.raises(ParquetFileError, match=r"part-0\.parquet: not a readable Parquet file"):
        following_source(str(tmp_path), FollowOptions(poll_interval=0.05, idle_timeout=None))
    assert 0.1 <= time.monotonic() - started < 5  # three polls, two sleeps between them; not idle_timeout


def test_without_follow_an_empty_folder_is_refused_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"no Parquet files at .*: give a file, a folder, a glob or a URI"):
        ParquetSource(str(tmp_path))
    assert time.monotonic() - started < 1


@pytest.mark.slow  # ~10-15 s: two spawned ranks importing torch, lightrec and Lightning (the DataModule)
def test_ranks_that_list_a_folder_before_its_first_file_or_marker_start_together_and_read_every_row_once(
    tmp_path: Path,
) -> None:
    """Each rank lists the folder when it builds its DataModule's loader; one rank lists it empty (or before a
    folder is finished and marked), the other after. No rank may fail alone while the other waits for it in the
    first collective (until the gloo timeout): both start, the first round is rank 0's, every row is read
    once, the same steps on every rank. A folder that stays empty is the same error on both ranks."""
    for k in range(2):
        (tmp_path / f"empty-{k}").mkdir()
        _finish(tmp_path / f"marker-{k}" / "day=01", 0, 40)
        _half_written(tmp_path / f"marker-{k}" / "day=02" / "part-0.parquet")
    (tmp_path / "never").mkdir()
    # a short gloo timeout; run_ranks stops at a rank's error and kills the other (a rank left waiting for one
    # that failed alone fails the test at once), and a rank that never reports fails it after timeout + 30 s
    ranks = run_ranks(start_from_folders_being_written, 2, args=(str(tmp_path),), timeout=30)
    for case in ("empty-0", "empty-1", "marker-0", "marker-1"):
        rows = [rank[case]["rows"] for rank in ranks]
        assert sorted(rows[0] + rows[1]) == list(range(70)), case  # every row once, across the ranks
        assert len(rows[0]) == len(rows[1]), case  # the same steps on every rank
        assert ranks[0][case]["position"] == ranks[1][case]["position"], case
        assert all(rank[case]["seconds"] < 10 for rank in ranks), case
    # rank 0 listed the unmarked folder: the first round is day=01 only; rank 0 listed it marked: both folders
    for late, first_round in (("marker-1", ["day=01"]), ("marker-0", ["day=01", "day=02"])):
        names = [str(tmp_path / late / day / "part-0.parquet") for day in first_round]
        assert ranks[0][late]["position"]["follow"]["round"] == names
    errors = [rank["never"] for rank in ranks]
    assert errors[0]["error"] == errors[1]["error"] and errors[0]["type"] == "FileNotFoundError"
    assert repr(str(tmp_path / "never")) in errors[0]["error"] and "idle_timeout" in errors[0]["error"]
    assert all(e["seconds"] < 10 for e in errors)


def test_the_marker_gates_the_followed_folder_not_fixed_val_paths(tmp_path: Path) -> None:
    """A fixed ``val=`` folder (what ``lightrec data convert`` writes: never marked) is read as it is; only the
    followed training folder waits for ``_SUCCESS``. A ``val`` partition inside the followed folder that is not
    marked yet at the start is named as such."""
    from lightrec.data import ParquetDataModule

    train, val = tmp_path / "train", tmp_path / "val"
    _write(train / "day=01" / "part-0.parquet", 0, 20)
    _finish(train / "day=01", 0, 20)
    _write(val / "part-0.parquet", 100, 10)  # no marker
    options = {"label": "label", "dense": ["row"], "sparse": ["scalar"], "batch_size": 10, "num_embeddings": 50,
               "follow": True, "poll_interval": 0.02, "idle_timeout": 0.3, "marker": "_SUCCESS"}  # fmt: skip
    started = time.monotonic()
    data = ParquetDataModule(str(train), val=str(val), **options)
    data.check_data()  # type: ignore[attr-defined]
    assert time.monotonic() - started < 0.3  # no wait for a marker the val folder never gets
    assert _rows(list(data.val_dataloader())) == list(range(100, 110))
    _write(train / "day=02" / "part-0.parquet", 200, 10)  # being written: not marked
    partition = ParquetDataModule(str(train), val={"day": "02"}, **options)
    with pytest.raises(ValueError, match="only folders holding the marker '_SUCCESS' count"):
        partition.val_dataloader()
