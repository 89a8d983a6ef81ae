"""A damaged version is refused with a typed error naming the file and what is wrong, before any of
its bytes are parsed; a chain with a hole is refused naming the missing versions."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch

from lightrec.distributed.deltas import (
    DeltaChainError,
    DeltaNotFoundError,
    DeltaReader,
    DeltaVerificationError,
    DeltaWriter,
)
from tests.distributed.deltas.helpers import SPECS, dense, full_rows, some_rows


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    writer = DeltaWriter(tmp_path, SPECS)
    writer.write_snapshot(full_rows(0), dense(0))
    writer.write_delta(some_rows(1), dense(1))
    writer.write_delta(some_rows(2))
    return tmp_path


def _refused(folder: Path, version: int, name: str, message: str) -> None:
    with pytest.raises(DeltaVerificationError, match=message) as info:
        DeltaReader(folder).read(version)
    assert info.value.path == folder / f"v{version:09d}" / name and info.value.version == version
    assert str(folder / f"v{version:09d}" / name) in str(info.value)


@pytest.mark.parametrize("name", ["rows.safetensors", "dense.safetensors"])
def test_flipped_bytes_are_named(folder: Path, name: str) -> None:
    path = folder / "v000000002" / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    _refused(folder, 2, name, "is corrupt: its SHA-256 differs from the one its manifest records")
    DeltaReader(folder).read(3)  # the other versions still read


@pytest.mark.parametrize("name", ["rows.safetensors", "dense.safetensors"])
def test_truncated_file_is_named(folder: Path, name: str) -> None:
    path = folder / "v000000002" / name
    size = path.stat().st_size
    os.truncate(path, size - 7)
    _refused(folder, 2, name, rf"is truncated: {size - 7} bytes on disk, the manifest records {size}")


def test_missing_file_and_manifest_are_named(folder: Path) -> None:
    (folder / "v000000002" / "dense.safetensors").unlink()
    _refused(folder, 2, "dense.safetensors", "is missing; the manifest lists it")
    (folder / "v000000003" / "manifest.json").unlink()
    _refused(folder, 3, "manifest.json", "is missing: the version is incomplete")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(lambda raw: "{not json", "manifest.json is corrupt: not valid JSON", id="garbage"),
        pytest.param(lambda raw: json.dumps({**raw, "format_version": 2}), "upgrade lightrec", id="newer-format"),
        pytest.param(lambda raw: json.dumps({**raw, "version": 9, "parent": 8}), "is the manifest of version 9, not 2",
                     id="other-version"),
        pytest.param(lambda raw: json.dumps({**raw, "parent": 0}), "must have parent 1", id="bad-parent"),
        pytest.param(lambda raw: json.dumps({k: v for k, v in raw.items() if k != "files"}),
                     "a field is missing or malformed", id="no-files"),
        # valid JSON that used to escape as OverflowError / RecursionError and stop every later update
        pytest.param(lambda raw: json.dumps(raw).replace('"wall_time": ', '"wall_time": 1' + "0" * 400 + ", \"x\": "),
                     r"a field is missing or malformed \(OverflowError", id="huge-number"),
        pytest.param(lambda raw: "[" * 100_000 + "]" * 100_000, "not valid JSON", id="deep-nesting"),
    ],
)
def test_corrupt_manifest_is_named(folder: Path, edit, message: str) -> None:  # noqa: ANN001
    path = folder / "v000000002" / "manifest.json"
    path.write_text(edit(json.loads(path.read_text())))
    _refused(folder, 2, "manifest.json", message)


def test_tensors_that_contradict_the_manifest_are_named(folder: Path) -> None:
    """A well-formed file with the right checksum but rows the manifest does not describe."""
    version = folder / "v000000002"
    tensors = safetensors.torch.load((version / "rows.safetensors").read_bytes())
    tensors["a/values"] = tensors["a/values"][:, :3].contiguous()
    data = safetensors.torch.save(tensors)
    (version / "rows.safetensors").write_bytes(data)
    raw = json.loads((version / "manifest.json").read_text())
    raw["files"]["rows.safetensors"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (version / "manifest.json").write_text(json.dumps(raw))
    _refused(folder, 2, "rows.safetensors", r"does not match its manifest: table 'a': values must be \[\d+, 8\]")


def test_a_hole_in_the_chain_is_named(folder: Path) -> None:
    shutil.rmtree(folder / "v000000002")
    reader = DeltaReader(folder)
    with pytest.raises(DeltaChainError, match=r"builds on snapshot 1, but \['v000000002'\] are not in"):
        reader.state(3)
    with pytest.raises(DeltaNotFoundError, match="v000000002 does not exist"):
        reader.read(2)
    assert torch.equal(reader.state(1).rows["a"].values, full_rows(0)["a"].values)


def test_an_empty_or_missing_folder_has_no_versions(tmp_path: Path) -> None:
    reader = DeltaReader(tmp_path / "not-yet")
    assert reader.versions() == [] and reader.latest() is None and reader.latest_hint() is None
    with pytest.raises(DeltaNotFoundError, match="holds no version yet"):
        reader.state()


def test_non_finite_values_are_refused_by_the_writer_and_by_the_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer that diverged: NaN dense weights (or float rows) with valid checksums would make every served
    request fail. The writer refuses them; a version another writer made anyway is refused on reading."""
    from lightrec.distributed.deltas import DeltaFormatError
    from lightrec.distributed.deltas import rows as rows_module
    from lightrec.distributed.deltas import writer as writer_module

    writer = DeltaWriter(tmp_path, SPECS)
    writer.write_snapshot(full_rows(0), dense(0))
    bad = {k: v.clone() for k, v in dense(1).items()}
    bad["mlp.0.bias"][2] = float("nan")
    with pytest.raises(DeltaFormatError, match=r"dense\['mlp.0.bias'\] has non-finite values"):
        writer.write_delta(some_rows(1), bad)
    for module in (writer_module, rows_module):  # a writer without the checks (the reader keeps its own)
        monkeypatch.setattr(module, "all_finite", lambda values: True)
    writer.write_delta(some_rows(1), bad)
    _refused(tmp_path, 2, "dense.safetensors", r"dense tensors \['mlp.0.bias'\] hold NaN or infinite values")
    rows = some_rows(2)
    rows["a"].values[0, 0] = float("inf")  # fp32 rows, stored as they are
    writer.write_delta(rows)
    _refused(tmp_path, 3, "rows.safetensors", r"the rows of tables \['a'\] hold NaN or infinite values")


def test_a_reader_forgets_the_manifests_of_removed_versions(folder: Path) -> None:
    """A server follows a folder for days while retention removes versions: its cache must not keep them."""
    reader = DeltaReader(folder)
    assert [reader.manifest(v).version for v in reader.versions()] == [1, 2, 3]
    shutil.rmtree(folder / "v000000001")
    shutil.rmtree(folder / "v000000002")
    assert reader.versions() == [3]
    assert set(reader._manifests) == {3}
