"""A manifest carries a checksum of its own fields: an edited or bit-flipped manifest is refused, not read
as a valid version that decodes to other values (review of the publish folder)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lightrec.distributed.deltas import DeltaReader, DeltaVerificationError, DeltaWriter
from tests.distributed.deltas.helpers import SPECS, dense, full_rows, snapshot_and_delta, some_rows


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return snapshot_and_delta(tmp_path)


def _int8_as_int4(raw: dict) -> dict:
    # table "c" is int8, dim 8: 16-byte rows, long enough for an int4 row of dim 8 (8 bytes of payload), so
    # every tensor check passes and the rows decode to other values
    raw["tables"]["c"]["row_format"] = "int4"
    return raw


def _global_step(raw: dict) -> dict:
    raw["global_step"] = 21
    return raw


def _dim(raw: dict) -> dict:
    raw["tables"]["c"]["dim"] = 4  # int8 rows of dim 4 fit the same 16 bytes
    return raw


@pytest.mark.parametrize("edit", [_int8_as_int4, _global_step, _dim], ids=["row-format", "global-step", "dim"])
def test_an_edited_manifest_field_is_refused(folder: Path, edit: Callable[[dict], dict]) -> None:
    path = folder / "v000000002" / "manifest.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text())), indent=1))
    with pytest.raises(DeltaVerificationError, match="manifest.json is corrupt: .*checksum") as info:
        DeltaReader(folder).read(2)
    assert info.value.path == path and info.value.version == 2


def test_a_manifest_without_a_checksum_is_read_as_before(folder: Path) -> None:
    """Manifests of format version 1 written before the checksum existed stay readable."""
    path = folder / "v000000002" / "manifest.json"
    raw = json.loads(path.read_text())
    assert len(raw.pop("manifest_sha256")) == 64
    path.write_text(json.dumps(raw))
    state = DeltaReader(folder).state(2)
    assert state.global_step == 20 and torch.equal(state.rows["a"].ids, torch.arange(50))


def test_the_checksum_does_not_depend_on_key_order_or_spacing(folder: Path) -> None:
    path = folder / "v000000002" / "manifest.json"
    raw = json.loads(path.read_text())
    path.write_text(json.dumps(dict(reversed(list(raw.items()))), separators=(",", ":")))
    assert DeltaReader(folder).read(2).manifest.global_step == 20


def test_a_writer_does_not_count_an_edited_manifest_as_a_snapshot(tmp_path: Path) -> None:
    """A delta relabelled "snapshot" (checksum no longer matching) is no snapshot to a restarted writer:
    its retention keeps the real snapshot v1 that the versions after it build on."""
    folder = tmp_path
    first = DeltaWriter(folder, SPECS)
    first.write_snapshot(full_rows(0), dense(0), global_step=10)
    first.write_delta(full_rows(1), dense(1), global_step=20)  # every row: its fields pass as a snapshot's
    path = folder / "v000000002" / "manifest.json"
    raw = json.loads(path.read_text())
    raw.update(kind="snapshot", parent=None, base=2)  # consistent fields: only the checksum tells
    path.write_text(json.dumps(raw))
    writer = DeltaWriter(folder, SPECS, retention=1)
    assert writer.latest_snapshot == 1
    assert writer.write_delta(some_rows(3), global_step=30) == 3
    assert (folder / "v000000001").is_dir()
    state = DeltaReader(folder).state(1)
    assert state.global_step == 10 and torch.equal(state.rows["a"].ids, torch.arange(50))
