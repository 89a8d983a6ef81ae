"""``publish_changes`` on 2 gloo ranks: a snapshot plus the deltas up to version ``v`` rebuild the trained
model at the step of ``v`` -- every table of every sharding type (table-, row-, column-, table-row-,
table-column-wise, data-parallel), tiered (SSD and host memory) and dense-kernel tables, a sequence
collection, managed-collision tables with the raw ids their rows hold -- bit for bit in fp32 and as
the very bytes of the row format when quantized; the dense weights of the versions that carry them.
The same through ``BackgroundPublisher``: each version is sent and written while the next steps train
(and while the test gathers the model over the default group), and still holds the model of its step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed.model_tracker.helpers import train_step
from tests.multiprocess import run_ranks

STEPS = 6
FORMATS = {"cw": "fp16", "twcw": "int8", "rw": "int4", "m_rw": "int8"}


def _full_tables(model: Any, tracker: Any) -> dict[str, Any]:
    """Rank 0: ``{table: full fp32 weights, table/raw: raw ids, "<dense>": {...}}`` now (collective)."""
    from lightrec.distributed.deltas import sharded_dense_weights
    from lightrec.modules.managed_collision.ops import EMPTY_ID

    full = model.gather_full_state_dict(dst=0)
    if not full:
        return {}
    out: dict[str, Any] = {"<dense>": sharded_dense_weights(model)}
    for fqn, t in tracker.tables.items():
        out[t.name] = full[f"{fqn}.weight"].float()
        if t.managed:
            ids = full[f"mc._managed_collision_collection._managed_collision_modules.{t.name}._mch_sorted_raw_ids"]
            ids = ids.reshape(-1)
            out[f"{t.name}/raw"] = torch.where(ids == EMPTY_ID, -1, ids)
    return out


def _body(rank: int, world_size: int, tmp: str, background: bool, shm: bool) -> dict[str, Any]:
    import os

    os.environ["LIGHTREC_SHM"] = "1" if shm else "0"  # the rows travel through shared memory, or gloo
    from lightrec.distributed.deltas import BackgroundPublisher, publish_changes
    from lightrec.distributed.model_tracker import DeltaTrackerConfig
    from tests.distributed.model_tracker.helpers import sharded

    model = sharded(f"{tmp}/ssd", world_size)
    tracker = model.init_torchrec_delta_tracker(DeltaTrackerConfig(consumers=["publish"]))
    folder = f"{tmp}/publish"
    publisher = BackgroundPublisher(model) if background else None

    def publish(**kwargs: Any) -> Any:
        kwargs = {"consumer": "publish", "row_format": FORMATS, "retention": None, **kwargs}
        if publisher is None:
            return publish_changes(model, folder, tracker, **kwargs)
        return publisher.publish(folder, tracker, **kwargs)  # pending: the version is read by now

    expected: dict[Any, dict[str, Any]] = {}
    # the snapshot (every row) in chunks of ~1 KiB: tables split over many chunks and pieces
    version = publish(chunk_bytes=1024)
    expected[version] = _full_tables(model, tracker)
    for step in range(1, STEPS + 1):
        train_step(model, step, rank)
        if step % 2 == 0:
            # and every other delta
            version = publish(global_step=step, dense=step == 4, chunk_bytes=1024 if step % 4 == 2 else 64 * 2**20)
            expected[version] = _full_tables(model, tracker)
    if publisher is not None:
        publisher.close()
        expected = {pending.result(): tables for pending, tables in expected.items()}
    return {"expected": expected, "versions": sorted(expected)}


@pytest.mark.parametrize(("background", "shm"), [(False, True), (True, True), (False, False)],
                         ids=["publish_changes", "BackgroundPublisher", "publish_changes-gloo"])  # fmt: skip
def test_snapshot_plus_deltas_rebuild_the_trained_model_at_every_version(tmp_path: Path, background: bool,
                                                                          shm: bool) -> None:  # fmt: skip
    from lightrec.distributed.deltas import DeltaReader, encode_rows

    results = run_ranks(_body, 2, args=(str(tmp_path), background, shm), timeout=300)
    assert results[0]["versions"] == results[1]["versions"] == [1, 2, 3, 4]
    reader = DeltaReader(tmp_path / "publish")
    dense_at = {}
    for version, tables in results[0]["expected"].items():
        state = reader.state(version)
        manifest = reader.manifest(version)
        assert manifest.kind == ("snapshot" if version == 1 else "delta") and manifest.global_step == 2 * (version - 1)
        for name, spec in state.tables.items():
            rows = state.rows[name]
            assert torch.equal(rows.ids, torch.arange(spec.num_embeddings)), name
            if spec.row_format == "fp32":
                assert torch.equal(rows.values, tables[name]), (version, name)
            else:  # the bytes quantize_rows gives the trained rows (what `quantize` serves)
                assert torch.equal(rows.values, encode_rows(tables[name], spec)), (version, name, spec.row_format)
            if spec.managed:
                assert torch.equal(rows.raw_ids, tables[f"{name}/raw"]), (version, name)
                assert version == 1 or bool((rows.raw_ids >= 0).any()), name
        if manifest.dense:
            dense_at[version] = state.dense
        for key, value in tables["<dense>"].items():
            if version in (1, 3):  # the snapshot, and the delta published with dense=True
                assert torch.equal(state.dense[key], value), (version, key)
    assert sorted(dense_at) == [1, 3]
    # deltas carry the changed rows only: fewer than the table (fp32 rw ... ) but every row of the dense-kernel table
    delta = reader.read(2)
    rows = {n: int(r) for n, r in delta.manifest.rows.items()}
    assert rows["dense"] == 15 and 0 < rows["tw"] < 23 and 0 < rows["kv"] < 120, rows
