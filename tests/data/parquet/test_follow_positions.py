"""A following loader's position while Lightning holds a batch of an earlier round: a round whose rows make no
global batch, or a new file that fails its checks, must not move the position past the batch still held.

Lightning reads one batch ahead of an unsized loader, so while the loader waits for files the last batch it
yielded is not trained. The position taken then (a checkpoint at a SIGTERM) must name that batch's round.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightrec.data.parquet import FollowingParquetLoader, FollowOptions, ParquetSchemaError
from lightrec.data.parquet.state import FollowedRounds
from tests.data.parquet.test_follow import _loader, _rows, _write


class _Stopped(BaseException):
    """What Lightning's SIGTERMException (a SystemExit) is to the loader: not an Exception."""


def _stop_at_wait(loader: FollowingParquetLoader, stop_at: int, on_wait: Callable[[int], None]) -> None:
    """Stop the loader (as a SIGTERM does) at its ``stop_at``-th empty poll; ``on_wait(n)`` runs at each."""
    waits: list[int] = []

    def wait() -> None:
        waits.append(1)
        on_wait(len(waits))

    def on_stop() -> None:
        raise _Stopped

    loader.on_wait, loader.stop_waiting, loader.on_stop = wait, lambda: len(waits) >= stop_at, on_stop


@pytest.mark.parametrize("small_files", [1, 2])
def test_a_stop_after_rounds_too_small_for_a_batch_resumes_at_the_batch_lightning_held(
    tmp_path: Path, small_files: int
) -> None:
    _write(tmp_path, "a.parquet", 0, 25)  # batches of 10: rows 0-9, 10-19; 5 rows carried
    loader = _loader(tmp_path, FollowOptions(poll_interval=0.02, idle_timeout=None))
    small = [("b.parquet", 25, 2), ("c.parquet", 27, 2)][:small_files]

    def land(n: int) -> None:  # one small file per empty poll: 5 + 2 (+ 2) rows make no batch of 10
        if n <= len(small):
            _write(tmp_path, *small[n - 1])

    _stop_at_wait(loader, len(small) + 1, land)
    stream = iter(loader)
    assert _rows([next(stream), next(stream)]) == list(range(20))  # Lightning trains 0-9 and holds 10-19
    with pytest.raises(_Stopped):
        next(stream)  # the small files' rounds made no batch; the stop comes in the wait after them
    state = loader.state_dict()
    assert state["batch"] == 1 and state["follow"]["round"] == [str(tmp_path / "a.parquet")]
    assert state["follow"]["done"] == []  # before the fix: a done, round b at batch 0 -- rows 10-19 lost
    end = 25 + 2 * small_files
    _write(tmp_path, "z.parquet", end, 40 - end)  # lands while the run is stopped
    resumed = _loader(tmp_path)
    resumed.load_state_dict(state)
    assert _rows(list(resumed)) == list(range(10, 40))  # the held batch, then every row once, in order


def test_a_position_after_a_small_round_moves_on_once_the_next_round_yields(tmp_path: Path) -> None:
    """The held batch of round a is trained when the first batch of a later round is read: the position is then
    that round's batch 0, with the rows carried through the small round."""
    _write(tmp_path, "a.parquet", 0, 25)
    loader = _loader(tmp_path, FollowOptions(poll_interval=0.02, idle_timeout=None))

    def land(n: int) -> None:
        if n == 1:
            _write(tmp_path, "b.parquet", 25, 3)  # 5 + 3 rows: no batch
        if n == 2:
            _write(tmp_path, "c.parquet", 28, 12)  # 8 + 12 rows: two batches

    _stop_at_wait(loader, 10**6, land)
    stream = iter(loader)
    assert _rows([next(stream), next(stream), next(stream)]) == list(range(30))  # rows 20-29 from the carry, b, c
    state = loader.state_dict()  # Lightning holds rows 20-29 now, and has trained 10-19
    paths = [str(tmp_path / n) for n in ("a.parquet", "b.parquet", "c.parquet")]
    assert state["batch"] == 0 and state["follow"]["round"] == paths[2:] and state["follow"]["done"] == paths[:2]
    assert [c[0] for c in state["follow"]["carry"]] == [paths[0], paths[1]]  # a's 5 rows, b's 3
    resumed = _loader(tmp_path)
    resumed.load_state_dict(state)
    assert _rows(list(resumed)) == list(range(20, 40))


def test_a_new_file_that_fails_its_check_leaves_the_position_at_the_held_batch(tmp_path: Path) -> None:
    _write(tmp_path, "a.parquet", 0, 25)
    loader = _loader(tmp_path, FollowOptions(poll_interval=0.02, idle_timeout=None))

    def land(n: int) -> None:
        if n == 1:  # a file without the features' columns: its round is refused before it yields
            pq.write_table(pa.table({"other": pa.array([1, 2], pa.int64())}), tmp_path / ".bad.tmp")
            (tmp_path / ".bad.tmp").rename(tmp_path / "b.parquet")

    _stop_at_wait(loader, 10**6, land)
    stream = iter(loader)
    assert _rows([next(stream), next(stream)]) == list(range(20))
    with pytest.raises(ParquetSchemaError, match="b.parquet"):
        next(stream)
    state = loader.state_dict()  # what Lightning's OnExceptionCheckpoint saves: rows 10-19 are not trained
    assert state["batch"] == 1 and state["follow"]["round"] == [str(tmp_path / "a.parquet")]


def test_followed_rounds_name_the_round_of_the_first_untrained_batch_and_forget_the_rounds_before() -> None:
    rounds = FollowedRounds()
    assert rounds.empty
    carry: list[list[str | int]] = [["a", 0, 20, 25]]
    rounds.begin(0, 1, 0, [], ["a"], [])
    # round a yielded 2 batches; b begins, then yields none; c begins
    rounds.begin(2, 1, 0, ["a"], ["b"], carry)
    rounds.begin(0, 1, 0, ["a", "b"], ["c"], carry + [["b", 0, 0, 3]])
    assert rounds.position(0, 1, ["a", "b"]) == (1, {"done": [], "round": ["a"], "carry": []})
    # c yielded 1: Lightning holds it and trained a's last batch
    assert rounds.position(1, 1, ["a", "b"]) == (0, {"done": ["a", "b"], "round": ["c"], "carry": carry + [["b", 0, 0, 3]]})
    assert rounds.position(3, 1, ["a", "b"])[0] == 2
    # a resumed round starts past 0 and counts its start in ``yielded``
    resumed = FollowedRounds()
    resumed.begin(7, 1, 7, [], ["r"], [])
    assert resumed.position(7, 1, [])[0] == 7  # nothing yielded: nothing trained past the resumed batch
    assert resumed.position(9, 1, [])[0] == 8
    # a long stream of rounds keeps only those an untrained batch can still be in
    for i in range(100):
        rounds.begin(2, 1, 0, ["x"] * i, [f"r{i}"], [])
    assert len(rounds._starts) <= 2
