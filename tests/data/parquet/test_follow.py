"""Following a folder: files renamed in later are read, in rounds, in order; partial or unmarked files are
not; the stream ends after the idle timeout; a position taken mid-stream resumes exactly; on real gloo ranks,
loaders built again and again share one process group."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lightrec.data.parquet import (
    FollowingParquetLoader,
    FollowOptions,
    ParquetFileError,
    ParquetSource,
    build_spec,
)
from lightrec.data.parquet.follow import FolderWatcher
from tests.data.parquet._follow_ranks import (
    a_stop_asked_of_rank_1_alone,
    exhaust_following_loaders,
    follow_after_listings_that_differ,
    signals_run_while_waiting_for_rank_0,
)
from tests.data.parquet._follow_ranks import publish as _publish
from tests.data.parquet.helpers import event_table
from tests.multiprocess import run_ranks

POLL = FollowOptions(poll_interval=0.02, idle_timeout=0.6)


def _write(folder: Path, name: str, start: int, rows: int) -> None:
    """Write under a hidden name, then rename into place (how a writer publishes a complete file)."""
    table = event_table(rows, seed=start, start=start)
    hidden = folder / f".{Path(name).name}.tmp"
    pq.write_table(table, hidden, row_group_size=16)
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    hidden.rename(folder / name)


def _loader(
    folder: Path, options: FollowOptions = POLL, batch_size: int = 10, workers: int = 0
) -> FollowingParquetLoader:
    source = ParquetSource(str(folder))
    spec = build_spec(source.schema, str(folder), "label", ["row"], ["scalar"])
    # persistent_workers is ignored: each round's files are new, its workers are started for it
    return FollowingParquetLoader(source, spec, batch_size, follow=options, num_workers=workers, persistent_workers=True)


def _rows(batches: list) -> list[int]:
    return [int(r) for b in batches for r in b.dense_features[:, 0].tolist()]


def test_files_renamed_in_later_are_read_and_partial_files_are_not(tmp_path: Path) -> None:
    _write(tmp_path, "part-00.parquet", 0, 25)
    loader = _loader(tmp_path)
    batches = []
    later = iter(loader)
    batches += [next(later), next(later)]  # 20 of the first 25 rows; 5 wait for the next file
    # a writer in the middle of a file: a hidden partial file, and a visible one cut short
    (tmp_path / ".part-01.parquet.tmp").write_bytes(b"PAR1 half written")
    timer = threading.Timer(0.2, _write, (tmp_path, "part-01.parquet", 25, 37))
    timer.start()
    batches += list(later)  # reads part-01 when it lands, then stops 0.6 s after the last new file
    timer.join()
    assert _rows(batches) == list(range(60))  # 62 rows: the last 2 never fill a batch
    # the 2 rows left over wait for a next file: rows 35-36 of part-01 (row group 2, rows 3-4)
    assert loader.state_dict()["follow"]["carry"][0][1:] == [2, 3, 5]


@pytest.mark.parametrize("workers", [0, 1])
def test_rounds_are_read_in_arrival_order_then_path_order(tmp_path: Path, workers: int) -> None:
    _write(tmp_path, "b.parquet", 0, 20)
    loader = _loader(tmp_path, workers=workers)
    loader.part_rows = 5  # row groups handed over in parts
    later = iter(loader)
    first = [next(later), next(later)]
    _write(tmp_path, "c.parquet", 100, 10)
    _write(tmp_path, "a.parquet", 200, 10)  # an earlier name, arriving late: read in the round it lands in
    rest = list(later)
    assert _rows(first) == list(range(20))
    assert _rows(rest) == [*range(200, 210), *range(100, 110)]


def test_a_marker_file_publishes_a_folder(tmp_path: Path) -> None:
    _write(tmp_path, "day=01/part-0.parquet", 0, 10)
    (tmp_path / "day=01" / "_SUCCESS").write_text("")
    options = FollowOptions(poll_interval=0.02, idle_timeout=0.3, marker="_SUCCESS")
    loader = _loader(tmp_path, options)
    later = iter(loader)
    assert _rows([next(later)]) == list(range(10))
    _write(tmp_path, "day=02/part-0.parquet", 10, 10)  # no marker yet: not read
    threading.Timer(0.15, (tmp_path / "day=02" / "_SUCCESS").write_text, ("",)).start()
    assert _rows(list(later)) == list(range(10, 20))


def test_a_file_that_stays_unreadable_is_an_error(tmp_path: Path) -> None:
    _write(tmp_path, "a.parquet", 0, 10)
    watcher = FolderWatcher(ParquetSource(str(tmp_path)).filesystem, [str(tmp_path)], POLL)
    (tmp_path / "b.parquet").write_bytes(b"not parquet at all")
    known = {str(tmp_path / "a.parquet")}
    assert watcher.list_new(known) == [] and watcher.list_new(known) == []  # maybe still being written
    with pytest.raises(ParquetFileError, match=r"b\.parquet: not a readable Parquet file"):
        watcher.list_new(known)


def test_a_file_still_unreadable_keeps_the_stream_from_ending_idle_until_it_settles(tmp_path: Path) -> None:
    """An idle timeout shorter than the three polls a listed file gets to become readable: the stream used to end
    as idle with the file still unread (a file being written in place for longer than idle_timeout was lost to
    the run); the file is one on its way, so the wait goes on until it settles -- here, as an error."""
    _write(tmp_path, "a.parquet", 0, 20)
    loader = _loader(tmp_path, FollowOptions(poll_interval=0.05, idle_timeout=0.01))
    stream = iter(loader)
    assert _rows([next(stream), next(stream)]) == list(range(20))
    (tmp_path / "b.parquet").write_bytes(b"PAR1 and never more")
    with pytest.raises(ParquetFileError, match=r"b\.parquet: not a readable Parquet file"):
        next(stream)


def test_an_unreadable_file_removed_before_it_settled_lets_the_stream_end_idle(tmp_path: Path) -> None:
    _write(tmp_path, "a.parquet", 0, 20)
    loader = _loader(tmp_path, FollowOptions(poll_interval=0.05, idle_timeout=0.2))
    stream = iter(loader)
    assert _rows([next(stream), next(stream)]) == list(range(20))
    half = tmp_path / "b.parquet"
    half.write_bytes(b"PAR1 and never more")
    threading.Timer(0.07, half.unlink).start()  # after the first poll found it, before the third
    started = time.monotonic()
    assert list(stream) == []  # nothing on its way any more: the idle end comes
    assert time.monotonic() - started < 5


def test_a_position_taken_mid_stream_resumes_exactly(tmp_path: Path) -> None:
    _write(tmp_path, "part-00.parquet", 0, 25)
    _write(tmp_path, "part-01.parquet", 25, 30)
    loader = _loader(tmp_path)
    stream = iter(loader)
    for _ in range(3):
        next(stream)  # Lightning holds one batch read ahead: 2 batches trained
    state = loader.state_dict()
    assert state["batch"] == 2
    _write(tmp_path, "part-02.parquet", 55, 20)  # arrives while the run is stopped
    resumed = _loader(tmp_path)
    resumed.load_state_dict(state)
    assert _rows(list(resumed)) == list(range(20, 70))


def test_a_position_whose_file_cannot_be_read_yet_is_kept_for_the_next_iteration(tmp_path: Path) -> None:
    """Resuming reads the footers of the files the position names; when that fails (the file is not back yet),
    the position is kept: iterating again resumes it (it was dropped first, and the retry started from batch 0
    of the loader's own files)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _write(tmp_path / "a", "part-00.parquet", 0, 40)
    _write(tmp_path / "b", "part-00.parquet", 100, 40)
    loader = _loader(tmp_path / "a")
    stream = iter(loader)
    for _ in range(3):
        next(stream)  # 2 batches of 10 trained
    state = loader.state_dict()
    loader.close()
    resumed = _loader(tmp_path / "b")  # another listing: the position's file is read when resuming
    resumed.load_state_dict(state)
    away = tmp_path / "away.parquet"
    (tmp_path / "a" / "part-00.parquet").rename(away)
    with pytest.raises((FileNotFoundError, ParquetFileError)):
        next(iter(resumed))
    away.rename(tmp_path / "a" / "part-00.parquet")
    assert _rows(list(resumed))[:20] == list(range(20, 40))  # the position's rows, not b's from row 100


def test_a_position_saved_after_the_stream_ended_resumes_with_the_files_that_land_later(tmp_path: Path) -> None:
    _write(tmp_path, "part-00.parquet", 0, 25)
    loader = _loader(tmp_path)
    assert _rows(list(loader)) == list(range(20))  # then the idle timeout ends the stream: 5 rows carried
    state = loader.state_dict()  # the checkpoint written at the end of the fit
    assert (state["batch"], state["follow"]["round"]) == (0, [])  # batch 0 of the next (empty) round
    _write(tmp_path, "part-01.parquet", 25, 30)
    resumed = _loader(tmp_path)
    resumed.load_state_dict(state)
    assert _rows(list(resumed)) == list(range(20, 50))  # the carried rows, then the new file's


def test_follow_needs_no_shuffle() -> None:
    from lightrec.data import ParquetDataModule

    with pytest.raises(ValueError, match=r"follow=True reads files in the order they land; shuffle=True"):
        ParquetDataModule("x", follow=True, shuffle=True)


def _following(folder: Path, **splits: object) -> object:
    from lightrec.data import ParquetDataModule

    options = dict(label="label", dense=["row"], sparse=["scalar"], batch_size=10, num_embeddings=50)
    return ParquetDataModule(str(folder), follow=True, poll_interval=0.02, idle_timeout=0.3, **options, **splits)  # type: ignore[arg-type]


def _under(folder: Path, setting: object) -> object:
    """A split setting with its paths under ``folder`` (partition values as they are)."""
    if isinstance(setting, str):
        return str(folder / setting)
    return [str(folder / p) for p in setting] if isinstance(setting, list) else setting


@pytest.mark.parametrize(
    ("val", "test"),
    [({"day": "02"}, "day=09/"), ("day=02/", {"day": "09"}), ("day=02/*.parquet", ["day=09/*.parquet"])],
)
def test_following_leaves_the_val_and_test_files_out_of_training_also_those_landing_later(
    tmp_path: Path, val: object, test: object
) -> None:
    _write(tmp_path, "day=01/part-0.parquet", 0, 20)
    _write(tmp_path, "day=02/part-0.parquet", 1000, 20)  # validation data
    _write(tmp_path, "day=09/part-0.parquet", 3000, 10)  # test data
    data = _following(tmp_path, val=_under(tmp_path, val), test=_under(tmp_path, test))
    loader, validation = data.train_dataloader(), data.val_dataloader()  # type: ignore[attr-defined]
    _write(tmp_path, "day=02/part-1.parquet", 2000, 20)  # validation data landing later
    _write(tmp_path, "day=03/part-0.parquet", 20, 20)  # training data landing later
    _write(tmp_path, "day=09/part-1.parquet", 4000, 10)  # test data landing later
    assert _rows(list(loader)) == list(range(40))  # day=01, then day=03: no validation or test row
    assert _rows(list(validation)) == list(range(1000, 1020))  # the validation files there at the start


@pytest.mark.parametrize("split", ["val", "test"])
def test_following_refuses_a_fraction_split(split: str) -> None:
    from lightrec.data import ParquetDataModule

    with pytest.raises(ValueError, match=rf"follow=True cannot take {split}=0.1: a fraction of the rows .* keeps growing. "
                       rf"Select the {split} files by path or partition values instead"):
        ParquetDataModule("x", follow=True, **{split: 0.1})  # type: ignore[arg-type]


def test_held_out_refuses_a_fraction_unless_the_caller_checked_already() -> None:
    from lightrec.data.parquet.splits import HeldOut, held_out

    with pytest.raises(ValueError, match=r"follow=True cannot take test=0.1"):
        held_out({"day": "02"}, 0.1)
    assert held_out({"day": "02"}, 0.1, check=False) == HeldOut(({"day": "02"},), ())  # a fraction selects no file


def test_an_idle_source_ends_after_the_timeout(tmp_path: Path) -> None:
    _write(tmp_path, "a.parquet", 0, 20)
    loader = _loader(tmp_path, FollowOptions(poll_interval=0.05, idle_timeout=0.3))
    started = time.monotonic()
    assert len(list(loader)) == 2
    assert 0.3 <= time.monotonic() - started < 5


def test_a_stop_request_ends_the_wait_for_files_at_once_and_only_the_wait(tmp_path: Path) -> None:
    _write(tmp_path, "a.parquet", 0, 20)
    loader = _loader(tmp_path, FollowOptions(poll_interval=60, idle_timeout=None))  # would wait for ever
    requested = threading.Event()
    loader.stop_waiting = requested.is_set
    batches = iter(loader)
    assert _rows([next(batches), next(batches)]) == list(range(20))  # a request only ends a wait
    timer = threading.Timer(0.5, requested.set)
    timer.start()
    started = time.monotonic()
    try:
        assert list(batches) == []  # the wait for the next file ends: the stream ends as after idle_timeout
    finally:
        timer.cancel()
    assert 0.5 <= time.monotonic() - started < 10  # well before the 60 s poll, let alone "never"
    assert loader.position().follow is not None and loader.position().batch == 0  # nothing held ahead


def test_a_stop_that_raises_keeps_the_round_in_progress_so_the_held_batch_is_trained_on_resume(tmp_path: Path) -> None:
    _write(tmp_path, "a.parquet", 0, 25)  # batches of 10: rows 0-9, 10-19; 5 rows left over for the next round
    loader = _loader(tmp_path, FollowOptions(poll_interval=60, idle_timeout=None))
    loader.stop_waiting = lambda: True

    def on_stop() -> None:
        raise KeyboardInterrupt("stopped")  # what Lightning's SIGTERMException (a SystemExit) does: not an Exception

    loader.on_stop = on_stop
    stream = iter(loader)
    assert _rows([next(stream), next(stream)]) == list(range(20))
    with pytest.raises(KeyboardInterrupt, match="stopped"):
        next(stream)  # the wait after the round: stopped at once
    state = loader.state_dict()  # what a checkpoint at the stop holds: Lightning never trained rows 10-19
    assert state["batch"] == 1
    _write(tmp_path, "b.parquet", 25, 15)  # lands while the run is stopped
    resumed = _loader(tmp_path)
    resumed.load_state_dict(state)
    assert _rows(list(resumed)) == list(range(10, 40))  # the held batch, then the leftover rows and b's


def test_on_wait_runs_after_each_empty_poll_and_not_after_the_poll_that_finds_a_file(tmp_path: Path) -> None:
    _write(tmp_path, "a.parquet", 0, 20)
    loader = _loader(tmp_path, FollowOptions(poll_interval=0.05, idle_timeout=30))
    waits: list[float] = []
    done = threading.Event()

    def on_wait() -> None:
        waits.append(time.monotonic())
        if len(waits) == 3:
            _write(tmp_path, "b.parquet", 20, 10)  # lands: the next poll finds it
        if len(waits) == 4:  # the second wait, after b's round
            done.set()

    loader.on_wait, loader.stop_waiting = on_wait, done.is_set
    assert _rows(list(loader)) == list(range(30))
    assert len(waits) == 4  # 3 empty polls before b landed, 1 after its round (then the stop request)


def test_a_following_datamodule_stops_waiting_once_its_trainer_received_sigterm(tmp_path: Path) -> None:
    from types import SimpleNamespace

    _write(tmp_path, "a.parquet", 0, 20)
    module = _following(tmp_path)
    loader = module.train_dataloader()  # type: ignore[attr-defined]
    assert loader.stop_waiting is not None and loader.stop_waiting() is False  # no trainer yet
    module.trainer = SimpleNamespace(received_sigterm=False)  # type: ignore[attr-defined]
    assert loader.stop_waiting() is False
    module.trainer.received_sigterm = True  # type: ignore[attr-defined]
    assert loader.stop_waiting() is True


def test_a_signal_handler_runs_while_a_rank_waits_for_rank_0s_poll() -> None:
    rank0, rank1 = run_ranks(signals_run_while_waiting_for_rank_0, 2, timeout=60)
    assert rank0["value"] == rank1["value"] == [["a.parquet"], False, None]  # JSON: the tuple comes back a list
    assert rank1["returned"] > 1.0  # it did wait for rank 0 ...
    assert 0.0 <= rank1["handled"] < 1.0  # ... and its handler ran 0.5 s in, not when the wait was over


def test_a_stop_asked_of_one_rank_other_than_0_ends_every_ranks_wait(tmp_path: Path) -> None:
    """Rank 0's stop used to decide for all: a SIGTERM that reached rank 1 alone was not seen while the ranks
    waited for files (for ever, with no idle timeout). Every rank's is asked now, and they agree at each poll."""
    _publish(tmp_path, "part-00.parquet", 0, 20)
    rank0, rank1 = run_ranks(a_stop_asked_of_rank_1_alone, 2, args=(str(tmp_path),), timeout=60)
    assert sorted(rank0["rows"] + rank1["rows"]) == list(range(20))  # the rows there, then the wait: stopped
    assert rank0["seconds"] < 30 and rank1["seconds"] < 30  # not the 60 s poll interval


@pytest.mark.slow  # ~12 s: mostly two spawned ranks importing torch and lightrec
def test_following_loaders_built_again_and_again_on_real_ranks_share_one_process_group(tmp_path: Path) -> None:
    """Rank 0 lists and tells the others through a gloo group of the watcher's: made once (a collective on
    every rank), used by every following loader after, ended with the default group -- not one group per
    loader, kept to the end of the process (threads and sockets each)."""
    repeats = 4
    for k in range(repeats):
        (tmp_path / f"run-{k}").mkdir()
        _publish(tmp_path / f"run-{k}", "part-00.parquet", 0, 40)
    (tmp_path / "again-run").mkdir()
    _publish(tmp_path / "again-run", "part-00.parquet", 0, 40)
    ranks = run_ranks(exhaust_following_loaders, 2, args=(str(tmp_path), repeats))
    for rank in ranks:
        # the default group and the watchers' one; under the new default group, its own one
        assert rank["groups"] == [2] * repeats + [2]
        first = rank["runs"][0]
        assert all(run == first for run in rank["runs"])  # the same batches every time
    rows = [[int(r[0]) for b in rank["runs"][0] for r in b["dense"]] for rank in ranks]
    # a rank's share of each round: 20 of the 40 rows there at the start, 15 of the 30 that landed mid-stream
    assert rows == [[*range(0, 20), *range(40, 55)], [*range(20, 40), *range(55, 70)]]


@pytest.mark.slow  # ~6-10 s: two spawned ranks importing torch and lightrec
def test_ranks_whose_first_listings_differ_start_from_rank_0s_and_read_every_row_once(tmp_path: Path) -> None:
    """Each rank lists the folder when it builds its loader; a file landing in between is in one rank's
    listing only. Every rank must still read rank 0's first round (no barrier in the library's users), then
    the late file in the round rank 0 finds it in: every row once, the same steps on every rank, the same
    position on every rank, and a resume from rank 0's position that continues exactly."""
    for late in range(2):
        (tmp_path / f"late-{late}").mkdir()
        _publish(tmp_path / f"late-{late}", "part-00.parquet", 0, 40)
    ranks = run_ranks(follow_after_listings_that_differ, 2, args=(str(tmp_path),))
    for late, rows, resumed, first_round in [
        # rank 1 listed part-01 too, rank 0 did not: part-00 is the first round (20 rows a rank), part-01 the next
        (1, [[*range(0, 20), *range(40, 55)], [*range(20, 40), *range(55, 70)]],
         [[*range(10, 20), *range(40, 55)], [*range(30, 40), *range(55, 70)]], ["part-00.parquet"]),
        # rank 0 listed part-01, rank 1 did not: both files are the first round (35 rows a rank)
        (0, [list(range(0, 35)), list(range(35, 70))], [list(range(10, 35)), list(range(45, 70))],
         ["part-00.parquet", "part-01.parquet"]),
    ]:  # fmt: skip
        case = [rank[f"late-{late}"] for rank in ranks]
        assert sorted(case[0]["rows"] + case[1]["rows"]) == list(range(70))  # every row once, across the ranks
        assert len(case[0]["rows"]) == len(case[1]["rows"])  # the same steps on every rank
        assert [c["rows"] for c in case] == rows
        assert [c["resumed"] for c in case] == resumed
        assert case[0]["position"] == case[1]["position"]
        names = [str(tmp_path / f"late-{late}" / name) for name in first_round]
        assert case[0]["position"]["follow"] == {"done": [], "round": names, "carry": []}
        assert case[0]["position"]["batch"] == 2


def test_one_rank_makes_no_watchers_group(tmp_path: Path) -> None:
    """World size 1: the first round and every poll are this rank's own listing, no collective, no group."""
    import torch.distributed as dist

    from tests.data.parquet._follow_ranks import live_groups

    (tmp_path / "data").mkdir()
    _write(tmp_path / "data", "a.parquet", 0, 20)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        assert _rows(list(_loader(tmp_path / "data"))) == list(range(20))
        assert live_groups() == 1  # the default group only
    finally:
        dist.destroy_process_group()


def test_the_datas_rank_group_is_made_once_per_default_group_and_ends_with_it(tmp_path: Path) -> None:
    import gc

    import torch.distributed as dist

    from lightrec.data.parquet import ranks
    from tests.data.parquet._follow_ranks import live_groups

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        group = ranks.data_group()
        assert ranks.data_group() is group and live_groups() == 2  # reused: no second group
        dist.destroy_process_group()  # ends every group, the data's one too
        del group
        gc.collect()
        assert ranks._DATA_GROUP is not None and ranks._DATA_GROUP[1]() is None  # not kept alive here
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg-again", rank=0, world_size=1)
        again = ranks.data_group()  # a new default group: a new group for the data
        assert ranks.data_group() is again and live_groups() == 2
        assert dist.get_process_group_ranks(again) == [0]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_following_datamodule_checks_its_splits_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightrec.data.parquet import datamodule, splits

    calls: list[tuple[object, object]] = []

    def counted(val: object = None, test: object = None) -> None:
        calls.append((val, test))
        original(val, test)  # type: ignore[arg-type]

    original = splits.check_follow_splits
    monkeypatch.setattr(splits, "check_follow_splits", counted)
    monkeypatch.setattr(datamodule, "check_follow_splits", counted)
    _write(tmp_path, "day=01/part-0.parquet", 0, 20)
    _write(tmp_path, "day=02/part-0.parquet", 1000, 20)
    data = _following(tmp_path, val={"day": "02"})
    loader = data.train_dataloader()  # type: ignore[attr-defined]
    assert calls == [({"day": "02"}, None)]  # at construction (refused early), not again per loader
    assert _rows(list(loader)) == list(range(20))  # the validation files still stay out of training


@pytest.mark.slow  # ~6-10 s: two spawned ranks importing torch and lightrec
def test_a_loader_of_its_own_world_follows_alone_and_an_unreadable_file_stops_every_rank(tmp_path: Path) -> None:
    """A following loader of ``world_size=1`` on one rank of a larger world makes no collective (it blocked in
    the first broadcast, waiting for ranks that never build one); one of another width than the world is
    refused, naming both; a file rank 0 found that another rank cannot read stops both ranks with that error
    at once (rank 0 waited in the next poll's broadcast for the process group's timeout, 30 minutes), and so
    does one rank 0 cannot read itself; a loader built before torch.distributed starts follows with the others."""
    from tests.data.parquet._follow_ranks import follow_alone_and_fail_together

    ranks = run_ranks(follow_alone_and_fail_together, 2, args=(str(tmp_path),), timeout=40)
    assert ranks[1]["alone"] == list(range(20))
    for rank in ranks:
        assert "world_size=3 in a torch.distributed world of 2 ranks" in rank["too_wide"]
        assert "with world_size=2 (rank=dist.get_rank()), or with world_size=1" in rank["too_wide"]
    own, peer = ranks[1]["unreadable"], ranks[0]["unreadable"]
    assert own["type"] == "ParquetFileError" and "not shown by this rank's mount" in own["error"]
    assert peer["type"] == "RankDataMismatchError"
    assert peer["error"].startswith("rank 1 failed while reading the footers of the files rank 0 listed: ParquetFileError")
    assert own["seconds"] < 10 and peer["seconds"] < 10
    # rank 0's own poll cannot read the new file: it stops, and tells rank 1 in the same broadcast
    own, peer = ranks[0]["unreadable-to-rank-0"], ranks[1]["unreadable-to-rank-0"]
    assert own["type"] == "ParquetFileError" and "not shown by this rank's mount" in own["error"]
    assert peer["type"] == "RankDataMismatchError" and peer["error"].startswith("rank 0 failed while listing")
    assert "not shown by this rank's mount" in peer["error"] and peer["seconds"] < 10
    # a loader built before torch.distributed ran follows with the others once it does
    assert sorted(ranks[0]["before-group"] + ranks[1]["before-group"]) == list(range(40))
    assert len(ranks[0]["before-group"]) == len(ranks[1]["before-group"]) == 20
