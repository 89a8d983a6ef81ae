"""A manifest whose ``manifest_sha256`` key is there but holds no checksum (``null``, a number) is refused:
only a manifest without the key is one written before the checksum existed (docs/deltas.md), so a
damaged or edited one could otherwise skip the check and be read with edited fields (review)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightrec.distributed.deltas import DeltaReader, DeltaVerificationError, DeltaWriter
from tests.distributed.deltas.helpers import SPECS, dense, full_rows, snapshot_and_delta, some_rows


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return snapshot_and_delta(tmp_path)


@pytest.mark.parametrize("value", [None, 0, ["x"]], ids=["null", "number", "list"])
def test_a_checksum_key_without_a_checksum_is_refused_naming_the_file_and_field(folder: Path, value: object) -> None:
    path = folder / "v000000002" / "manifest.json"
    raw = json.loads(path.read_text())
    raw["manifest_sha256"] = value
    raw["global_step"] = 99  # an edit the checksum would have caught
    path.write_text(json.dumps(raw, indent=1))
    with pytest.raises(DeltaVerificationError, match=r"manifest\.json is corrupt: manifest_sha256 must be") as info:
        DeltaReader(folder).read(2)
    assert info.value.path == path and info.value.version == 2
    assert repr(value) in str(info.value)


def test_a_writer_does_not_count_a_snapshot_label_with_a_null_checksum(folder: Path) -> None:
    """A full-row delta relabelled "snapshot" with its checksum nulled is no snapshot to a restarted
    writer's retention (as with a wrong checksum): the real snapshot v1 stays."""
    first = DeltaWriter(folder, SPECS)
    assert first.write_delta(full_rows(3), dense(3), global_step=30) == 3
    path = folder / "v000000003" / "manifest.json"
    raw = json.loads(path.read_text())
    raw.update(kind="snapshot", parent=None, base=3, manifest_sha256=None)
    path.write_text(json.dumps(raw))
    writer = DeltaWriter(folder, SPECS, retention=1)
    assert writer.latest_snapshot == 1
    writer.write_delta(some_rows(4), global_step=40)
    assert (folder / "v000000001").is_dir()
    state = DeltaReader(folder).state(2)
    assert state.global_step == 20 and torch.equal(state.rows["a"].ids, torch.arange(50))


def test_a_manifest_without_the_key_is_still_read(folder: Path) -> None:
    """The documented compatibility: format version 1 manifests written before the field have no key."""
    path = folder / "v000000002" / "manifest.json"
    raw = json.loads(path.read_text())
    del raw["manifest_sha256"]
    path.write_text(json.dumps(raw))
    assert DeltaReader(folder).read(2).manifest.global_step == 20
