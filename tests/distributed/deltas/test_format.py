"""The publish folder round-trips: a snapshot plus the deltas up to ``v`` rebuild version ``v`` exactly
(fp32 bit for bit; quantized rows as the very bytes ``quantize`` stores, within the row format's
error of the fp32 rows); the manifest says what the format says; bad input is refused before
anything reaches the disk; retention keeps the newest snapshot and everything after it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightrec.distributed.deltas import (
    DeltaFormatError,
    DeltaReader,
    DeltaWriter,
    TableRows,
    TableSpec,
    decode_rows,
    encode_rows,
)
from lightrec.distributed.deltas.rows import payload_bytes, row_data_type
from lightrec.quant.row_codec import max_abs_error, quantize_rows
from tests.distributed.deltas.helpers import SPECS, dense, full_rows, some_rows


def _apply(model: dict[str, TableRows], rows: dict[str, TableRows]) -> None:
    """What a version does to the float tables: its rows replace theirs."""
    for name, r in rows.items():
        model[name].values[r.ids] = r.values
        if r.raw_ids is not None and model[name].raw_ids is not None:
            model[name].raw_ids[r.ids] = r.raw_ids


def test_snapshot_plus_deltas_rebuild_every_version(tmp_path: Path) -> None:
    writer = DeltaWriter(tmp_path, SPECS, retention=None)
    first = full_rows(0)
    model = {n: TableRows(r.ids, r.values.clone(), None if r.raw_ids is None else r.raw_ids.clone()) for n, r in first.items()}
    assert writer.write_snapshot(first, dense(0), global_step=0) == 1
    expected = {}
    latest_dense = dense(0)
    for v in range(1, 6):
        if v == 1:
            expected[1] = ({n: (r.values.clone(), None if r.raw_ids is None else r.raw_ids.clone())
                            for n, r in model.items()}, latest_dense)  # fmt: skip
            continue
        rows = some_rows(v, skip="d" if v == 3 else None)
        with_dense = dense(v) if v == 4 else None
        assert writer.write_delta(rows, with_dense, global_step=10 * v) == v
        _apply(model, rows)
        latest_dense = with_dense or latest_dense
        expected[v] = ({n: (r.values.clone(), None if r.raw_ids is None else r.raw_ids.clone()) for n, r in model.items()},
                       latest_dense)  # fmt: skip
    reader = DeltaReader(tmp_path)
    assert reader.versions() == [1, 2, 3, 4, 5] and reader.latest() == 5 and reader.latest_hint() == 5
    for v, (tables, dense_at_v) in expected.items():
        state = reader.state(v)
        assert (state.version, state.first, state.complete) == (v, 1, True)
        assert state.global_step == 10 * v if v > 1 else state.global_step == 0
        for spec in SPECS:
            got = state.rows[spec.name]
            want, raw = tables[spec.name]
            assert torch.equal(got.ids, torch.arange(spec.num_embeddings))
            # the stored rows are exactly the format's encoding of the float rows at v ...
            assert torch.equal(got.values, encode_rows(want, spec)), (v, spec.name)
            if spec.row_format == "fp32":  # ... bit for bit in fp32
                assert torch.equal(got.values, want)
            else:  # ... and within the format's error
                bound = max_abs_error(want, row_data_type(spec.row_format)).unsqueeze(1)
                assert bool(((decode_rows(got.values, spec) - want).abs() <= bound).all())
            if spec.managed:
                assert torch.equal(got.raw_ids, raw)
        assert state.dense.keys() == dense_at_v.keys()
        assert all(torch.equal(state.dense[k], dense_at_v[k]) for k in dense_at_v)


def test_a_delta_holds_only_what_changed(tmp_path: Path) -> None:
    writer = DeltaWriter(tmp_path, SPECS)
    writer.write_snapshot(full_rows(0), dense(0))
    rows = some_rows(1, skip="a")
    writer.write_delta(rows)
    version = DeltaReader(tmp_path).read(2)
    assert set(version.rows) == {"b", "c", "d"} and version.dense == {}
    assert version.manifest.rows == {"a": 0, **{n: r.ids.numel() for n, r in rows.items()}}
    assert set(version.manifest.files) == {"rows.safetensors"}
    assert DeltaReader(tmp_path).state(2).dense.keys() == dense(0).keys()  # the snapshot's
    writer.write_delta({})  # nothing changed: a version with no files
    assert DeltaReader(tmp_path).read(3).manifest.files == {}


def test_manifest_follows_the_documented_format(tmp_path: Path) -> None:
    writer = DeltaWriter(tmp_path, SPECS)
    writer.write_snapshot(full_rows(0), dense(0), global_step=7)
    writer.write_delta(some_rows(1), global_step=9)
    raw = json.loads((tmp_path / "v000000002" / "manifest.json").read_text())
    assert {k: raw[k] for k in ("format", "format_version", "version", "kind", "base", "parent", "global_step", "dense")} == {
        "format": "lightrec.deltas", "format_version": 1, "version": 2, "kind": "delta", "base": 1, "parent": 1,
        "global_step": 9, "dense": False}  # fmt: skip
    assert raw["tables"]["c"] == {"rows": 6, "num_embeddings": 20, "dim": 8, "row_format": "int8", "managed": True}
    assert set(raw["files"]) == {"rows.safetensors"} and len(raw["files"]["rows.safetensors"]["sha256"]) == 64
    snapshot = json.loads((tmp_path / "v000000001" / "manifest.json").read_text())
    assert (snapshot["kind"], snapshot["base"], snapshot["parent"], snapshot["dense"]) == ("snapshot", 1, None, True)
    assert (tmp_path / "LATEST").read_text() == "v000000002\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "v000000001", "v000000002"]


@pytest.mark.parametrize("fmt", ["fp16", "int8", "int4"])
def test_rows_are_the_bytes_quantize_stores(fmt: str) -> None:
    spec = TableSpec("t", 9, 10, fmt)
    x = torch.randn(9, 10) * 3
    encoded = encode_rows(x, spec)
    stored = quantize_rows(x, row_data_type(fmt))  # what QuantEmbeddingBagCollection holds
    if fmt == "fp16":
        assert encoded.dtype == torch.float16 and torch.equal(encoded.view(torch.uint8), stored[:, :20])
    else:
        assert encoded.dtype == torch.uint8 and torch.equal(encoded, stored)
    assert torch.equal(encode_rows(encoded, spec), encoded)  # rows already in the format pass as they are


def test_a_restarted_writer_continues_the_numbering(tmp_path: Path) -> None:
    DeltaWriter(tmp_path, SPECS).write_snapshot(full_rows(0), dense(0))
    writer = DeltaWriter(tmp_path, SPECS)
    assert (writer.latest_version, writer.latest_snapshot) == (1, 1)
    assert writer.write_delta(some_rows(1)) == 2
    assert DeltaReader(tmp_path).chain(2) == [1, 2]


def _bad_inputs() -> list:
    a = SPECS[0]
    full = full_rows(0)
    return [
        pytest.param("delta", {"a": full["a"]}, "has no snapshot yet; write_snapshot", id="delta-first"),
        pytest.param("snapshot", {"a": full["a"]}, r"a snapshot holds every table; rows lacks \['b', 'c', 'd'\]",
                     id="partial-snapshot"),
        pytest.param("snapshot", {**full, "a": TableRows(torch.arange(3), torch.zeros(3, a.dim))},
                     "table 'a' needs ids 0..49, got 3 ids", id="snapshot-missing-rows"),
        pytest.param("snapshot", {**full, "zz": full["a"]}, r"tables \['zz'\] this writer does not know",
                     id="unknown-table"),
        pytest.param("snapshot", {**full, "a": TableRows(full["a"].ids, full["a"].values[:, :3])},
                     r"values must be float32 \[n, 8\]", id="wrong-dim"),
        pytest.param("snapshot", {**full, "c": TableRows(full["c"].ids, full["c"].values)},
                     "managed=True but raw_ids is absent", id="managed-without-raw-ids"),
        pytest.param("snapshot", {**full, "a": TableRows(full["a"].ids, full["a"].values * float("nan"))},
                     "non-finite values", id="nan-rows"),
        pytest.param("snapshot", {**full, "b": TableRows(full["b"].ids, full["b"].values * 1e6)},
                     "beyond fp16's range", id="beyond-fp16"),
    ]


@pytest.mark.parametrize(("kind", "rows", "message"), _bad_inputs())
def test_bad_rows_are_refused_before_the_disk(tmp_path: Path, kind: str, rows: dict, message: str) -> None:
    writer = DeltaWriter(tmp_path, SPECS)
    with pytest.raises(DeltaFormatError, match=message):
        writer.write_snapshot(rows, dense(0)) if kind == "snapshot" else writer.write_delta(rows)
    assert list(tmp_path.iterdir()) == []


def test_delta_ids_must_be_sorted_unique_and_in_range(tmp_path: Path) -> None:
    writer = DeltaWriter(tmp_path, SPECS)
    writer.write_snapshot(full_rows(0), dense(0))
    for ids in ([3, 1], [2, 2], [0, 50]):
        t = torch.tensor(ids)
        with pytest.raises(DeltaFormatError, match=r"table 'a': ids must be unique, ascending and in \[0, 50\)"):
            writer.write_delta({"a": TableRows(t, torch.zeros(2, 8))})
    with pytest.raises(DeltaFormatError, match="dense.*must be a floating-point tensor"):
        writer.write_delta({}, {"step": torch.tensor(3)})
    assert DeltaReader(tmp_path).versions() == [1]


def test_writer_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(DeltaFormatError, match="retention must be None or an int >= 1"):
        DeltaWriter(tmp_path, SPECS, retention=0)
    with pytest.raises(DeltaFormatError, match="two tables share a name"):
        DeltaWriter(tmp_path, [SPECS[0], SPECS[0]])
    with pytest.raises(DeltaFormatError, match="int4 packs two values per byte and needs an even dim, got 5"):
        TableSpec("odd", 4, 5, "int4")
    with pytest.raises(DeltaFormatError, match="row_format must be one of"):
        TableSpec("x", 4, 4, "int2")
    with pytest.raises(DeltaFormatError, match="without '/'"):
        TableSpec("a/b", 4, 4)


@pytest.mark.parametrize("retention", [1, 2, None])
def test_retention_keeps_the_newest_snapshots_and_all_after(tmp_path: Path, retention: int | None) -> None:
    writer = DeltaWriter(tmp_path, SPECS, retention=retention)
    kinds = "SDDSDSDD"
    for i, kind in enumerate(kinds):
        if kind == "S":
            writer.write_snapshot(full_rows(i), dense(i))
        else:
            writer.write_delta(some_rows(i))
    snapshots = [i + 1 for i, k in enumerate(kinds) if k == "S"]  # 1, 4, 6
    keep_from = 1 if retention is None else snapshots[-retention]
    reader = DeltaReader(tmp_path)
    assert reader.versions() == list(range(keep_from, len(kinds) + 1))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    for v in reader.versions():
        reader.state(v)  # every kept version rebuilds


def test_quantized_versions_of_writers_with_other_row_alignments_merge(tmp_path: Path) -> None:
    """A trainer restarted with another ``row_alignment``: its int8/int4 rows are narrower or wider. The merge
    cuts every row to the narrowest (the rest is padding) instead of failing, so a server still catches up."""
    specs = [s for s in SPECS if s.row_format in ("int8", "int4")]
    DeltaWriter(tmp_path, specs, row_alignment=16).write_snapshot(full_rows(0, specs), {})
    DeltaWriter(tmp_path, specs, row_alignment=4).write_delta(some_rows(1, specs))
    reader = DeltaReader(tmp_path)
    widths = {s.name: (reader.read(1).rows[s.name].values.shape[1], reader.read(2).rows[s.name].values.shape[1])
              for s in specs}  # fmt: skip
    assert all(wide > narrow for wide, narrow in widths.values()), widths
    state = reader.state(2)
    for s in specs:
        payload = payload_bytes(s.dim, s.row_format)
        changed = some_rows(1, specs)[s.name].ids
        assert state.rows[s.name].values.shape[1] == widths[s.name][1]
        expected = reader.read(1).rows[s.name].values[:, :payload].clone()
        expected[changed] = reader.read(2).rows[s.name].values[:, :payload]
        assert torch.equal(state.rows[s.name].values[:, :payload], expected)
