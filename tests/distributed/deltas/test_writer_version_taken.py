"""A writer whose next version number another writer took (a fit retried in the same process while the
aborted publish thread of the first one still finished its write; a second ``DeltaWriter`` on the folder)
fails that write and then carries on: the next version follows the other writer's, and it must be a
snapshot, since this writer's delta would build on rows it did not write (review of the publish folder)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightrec.distributed.deltas import DeltaFormatError, DeltaReader, DeltaWriteError, DeltaWriter
from tests.distributed.deltas.helpers import SPECS, dense, full_rows, some_rows


def test_a_writer_whose_version_was_taken_recovers_with_a_snapshot(tmp_path: Path) -> None:
    stale = DeltaWriter(tmp_path, SPECS)
    stale.write_snapshot(full_rows(0), dense(0))
    DeltaWriter(tmp_path, SPECS).write_delta(some_rows(1))  # v2, by another writer
    with pytest.raises(DeltaWriteError, match="v000000002 was written by another writer"):
        stale.write_delta(some_rows(2))
    assert DeltaReader(tmp_path).versions() == [1, 2] and not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    with pytest.raises(DeltaFormatError, match="write_snapshot"):
        stale.write_delta(some_rows(3))  # it would build on v2, which this writer did not write
    assert stale.write_snapshot(full_rows(4), dense(4)) == 3
    assert stale.write_delta(some_rows(5)) == 4
    state = DeltaReader(tmp_path).state(4)
    assert torch.equal(state.rows["a"].ids, torch.arange(50))
