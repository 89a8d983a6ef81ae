"""Batches read from Parquet equal, value for value, batches built by hand from the same rows.

Scalar int64 and int32 ids, multi-hot lists with empty ones, weighted lists, dense nulls and NaN; for
one and several ranks, loader workers or none, batches that span row groups and files. Shuffling
keeps every row once per epoch, differs per epoch and does not depend on the number of workers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from lightrec.data.parquet import ParquetLoader, ParquetSource, build_spec, size_tables, slices_of
from lightrec.data.parquet.sharding import plan_epoch
from tests.data.parquet.helpers import (
    DENSE,
    ROWS,
    assert_batches_equal,
    expected_batch,
    sparse_option,
    write_events,
)

# Three files (one in a subfolder), row groups of odd sizes: batches cross row group and file ends.
FILES = [("a.parquet", 230, 64), ("b.parquet", 97, 40), ("c/d.parquet", 181, 50)]


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pa.Table]:
    root = tmp_path_factory.mktemp("events")
    return root, write_events(root, FILES)


def _loader(root: Path, batch_size: int, rank: int = 0, world: int = 1, **options: object) -> ParquetLoader:
    source = ParquetSource(str(root))
    spec = build_spec(source.schema, str(root), "label", DENSE, sparse_option())
    return ParquetLoader(source, size_tables(source, spec), slices_of(source.files), batch_size, rank, world, **options)


@pytest.mark.parametrize(
    ("world", "workers", "batch_size"),
    [(1, 0, 32), (2, 0, 37), (3, 0, 20), (2, 2, 37), (3, 1, 50)],
)
def test_batches_equal_hand_built_batches_of_the_same_rows(
    events: tuple[Path, pa.Table], world: int, workers: int, batch_size: int
) -> None:
    root, table = events
    steps = table.num_rows // (world * batch_size)
    for rank in range(world):
        loader = _loader(root, batch_size, rank, world, num_workers=workers, prefetch_factor=1)
        batches = list(loader)
        assert len(loader) == len(batches) == steps  # every rank the same number of steps
        first = rank * steps * batch_size  # rank r reads its contiguous part of the rows
        for k, batch in enumerate(batches):
            assert_batches_equal(batch, expected_batch(table.slice(first + k * batch_size, batch_size)))


@pytest.mark.parametrize(("world", "workers"), [(1, 0), (1, 1), (2, 2), (1, 3)])
def test_units_handed_over_in_parts_give_the_same_batches(
    events: tuple[Path, pa.Table], world: int, workers: int
) -> None:
    root, table = events
    batch_size = 8
    steps = table.num_rows // (world * batch_size)
    for rank in range(world):
        loader = _loader(root, batch_size, rank, world, num_workers=workers, prefetch_factor=1)
        loader.part_rows = 12  # parts of 16 rows: up to 4 per unit, empty ones in the short units
        assert loader._parts(loader.plan(0).units) == 4
        batches = list(loader)
        assert len(batches) == steps
        first = rank * steps * batch_size
        for k, batch in enumerate(batches):
            assert_batches_equal(batch, expected_batch(table.slice(first + k * batch_size, batch_size)))


def test_parts_cut_on_batch_boundaries_and_cover_the_unit() -> None:
    from lightrec.data.parquet.loader import part_bounds

    assert part_bounds(0, 64, 4, 8).tolist() == [0, 16, 32, 48, 64]
    assert part_bounds(5, 60, 3, 8).tolist() == [0, 19, 43, 60]  # stream rows 5 | 24 | 48 | 65
    assert part_bounds(0, 10, 4, 8).tolist() == [0, 0, 8, 8, 10]  # short unit: empty parts


def test_table_sizes_come_from_the_column_statistics(events: tuple[Path, pa.Table]) -> None:
    root, table = events
    loader = _loader(root, 16)
    configs = loader.spec.table_configs(8)
    assert [c.name for c in configs] == [f"t_{k}" for k in ROWS]
    largest = {
        "scalar": max(table.column("scalar").to_pylist()),
        "narrow": max(table.column("narrow").to_pylist()),
        "multi": max(v for row in table.column("multi").to_pylist() for v in row),
        "weighted": max(v for row in table.column("tags").to_pylist() for v in row),
    }
    assert [c.num_embeddings for c in configs] == [largest[k] + 1 for k in ROWS]


def _rows(loader: ParquetLoader, epoch: int = 0) -> list[int]:
    loader.sampler.set_epoch(epoch)
    return [int(r) for b in loader for r in b.dense_features[:, 0].tolist()]


def _row_loader(root: Path, **options: object) -> ParquetLoader:
    source = ParquetSource(str(root))
    spec = size_tables(source, build_spec(source.schema, str(root), "label", ["row"], ["scalar"]))
    return ParquetLoader(source, spec, slices_of(source.files), 25, **options)  # type: ignore[arg-type]


def test_shuffle_reads_every_row_once_differently_per_epoch_and_the_same_for_any_workers(
    events: tuple[Path, pa.Table],
) -> None:
    root, table = events
    plain = _rows(_row_loader(root))
    shuffled = _row_loader(root, shuffle=True, seed=3, shuffle_window=2)
    epoch0, epoch1 = _rows(shuffled, 0), _rows(shuffled, 1)
    usable = table.num_rows // 25 * 25
    assert plain == list(range(usable))
    assert len(set(epoch0)) == len(epoch0) == usable and len(set(epoch1)) == usable
    assert epoch0 != plain and epoch0 != epoch1
    # rows of one block are mixed together: neighbours in the epoch are not neighbours in the files
    assert np.mean(np.abs(np.diff(epoch0)) == 1) < 0.2
    with_workers = _row_loader(root, shuffle=True, seed=3, shuffle_window=2, num_workers=2)
    assert _rows(with_workers, 1) == epoch1


@pytest.mark.parametrize("workers", [1, 2])
def test_kept_workers_read_each_epochs_own_rows_and_restart_after_an_abandoned_epoch(
    events: tuple[Path, pa.Table], workers: int
) -> None:
    root, _ = events
    options = {"shuffle": True, "seed": 3, "shuffle_window": 2, "rank": 1, "world_size": 2}
    alone = _row_loader(root, **options)
    expected = [_rows(alone, e) for e in range(3)]
    kept = _row_loader(root, num_workers=workers, persistent_workers=True, prefetch_factor=1, **options)
    kept.part_rows = 20  # units in several parts
    assert _rows(kept, 0) == expected[0]
    pool = kept._kept
    assert pool is not None and _rows(kept, 1) == expected[1] and kept._kept is pool  # the same workers
    kept.sampler.set_epoch(2)
    next(iter(kept))  # abandoned after one batch: the workers are shut down ...
    assert kept._kept is None
    assert _rows(kept, 2) == expected[2] and kept._kept is not None  # ... and new ones read the next epoch
    state = {**kept.state_dict(), "epoch": 1, "batch": 3}  # a resume inside epoch 1, through the kept workers
    kept.load_state_dict(state)
    assert _rows(kept, 1) == expected[1][3 * 25 :]
    # an epoch's generator closed only after the next epoch started leaves the new epoch's workers alone
    kept.sampler.set_epoch(0)
    whole = iter(kept)
    next(whole)  # its last part has not arrived: the kept workers are busy with it
    assert _rows(kept, 2) == expected[2]  # ... so the next epoch starts new ones
    done = iter(kept)
    assert [int(r) for b in done for r in b.dense_features[:, 0].tolist()] == expected[2]
    pool = kept._kept
    again = iter(kept)  # completed, then read again while the completed generator is still open
    first = next(again)
    del whole, done  # closing the old generators now touches nothing
    rest = [int(r) for b in again for r in b.dense_features[:, 0].tolist()]
    assert kept._kept is pool and first.dense_features[:, 0].tolist() + rest == expected[2]
    kept.close()


def test_ranks_read_disjoint_rows_and_run_equal_steps(events: tuple[Path, pa.Table]) -> None:
    root, table = events
    seen = []
    for rank in range(3):
        rows = _rows(_row_loader(root, rank=rank, world_size=3, shuffle=True, seed=1))
        seen.append(rows)
    assert len({len(r) for r in seen}) == 1
    everything = [r for rows in seen for r in rows]
    assert len(set(everything)) == len(everything) == table.num_rows // 75 * 75


def test_plan_splits_blocks_on_rank_boundaries() -> None:
    from lightrec.data.parquet.sharding import Slice

    slices = [Slice(0, g, 0, 10) for g in range(5)]  # 50 rows
    plans = [plan_epoch(slices, 8, r, 2) for r in range(2)]
    assert [p.steps for p in plans] == [3, 3]  # 48 rows used, 2 left out
    assert [(u.block.slices[0].row_group, u.lo, u.hi, u.start) for u in plans[1].units] == [
        (2, 4, 10, 0), (3, 0, 10, 6), (4, 0, 8, 16),
    ]  # fmt: skip
    resumed = plans[1].units_from(1)  # batch 1 starts at row 8 of rank 1's part
    assert [(u.lo, u.hi, u.start) for u in resumed] == [(2, 10, 8), (0, 8, 16)]


def test_weights_are_ones_for_unweighted_features_and_absent_without_weights(events: tuple[Path, pa.Table]) -> None:
    root, _ = events
    batch = next(iter(_loader(root, 16)))
    kjt = batch.sparse_features
    scalar = kjt["scalar"]
    assert torch.equal(scalar.weights(), torch.ones_like(scalar.weights()))
    plain = next(iter(_row_loader(root)))
    assert plain.sparse_features.weights_or_none() is None
