"""A served artifact patched with a delta scores exactly like a fresh export of the updated model:
fp32 and quantized tables, TorchScript and torch.export, sequence and managed-collision tables;
and a version that cannot be applied leaves the artifact and its version untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightrec import KeyedJaggedTensor
from lightrec.distributed.deltas import (
    DeltaApplyError,
    DeltaReader,
    DeltaWriter,
    TableRows,
    TableSpec,
    publish_rows,
    publish_snapshot,
    table_rows,
    table_specs,
)
from lightrec.inference import export, load, quantize
from lightrec.modules.embedding_configs import DataType
from lightrec.quant.row_codec import quantize_rows
from lightrec.serving.deltas import DeltaFollower, PendingUpdate, TableTarget, artifact_rows, find_targets
from lightrec.serving.deltas import apply as apply_module
from lightrec.serving.deltas import targets as targets_module
from tests.serving.deltas.models import build, cat_batches, changed_rows, train

slow = pytest.mark.slow


def _serving_copy(model: torch.nn.Module, dtype: str | None) -> torch.nn.Module:
    return quantize(model, dtype=dtype) if dtype else model


@pytest.mark.parametrize(
    ("kind", "dtype", "fmt"),
    [
        ("dlrm", None, "torchscript"),
        ("dlrm", "int8", "torchscript"),
        ("dlrm", "fp16", "export"),
        ("mc", "int8", "torchscript"),
        pytest.param("dlrm", None, "export", marks=slow),
        pytest.param("dlrm", "int8", "export", marks=slow),
        pytest.param("dlrm", "int4", "torchscript", marks=slow),
        pytest.param("mc", "int8", "export", marks=slow),
        pytest.param("mc", "fp16", "torchscript", marks=slow),
        pytest.param("seq", "int8", "torchscript", marks=slow),
        pytest.param("seq", "int4", "export", marks=slow),
    ],
)
def test_a_patched_artifact_scores_like_a_fresh_export(tmp_path: Path, kind: str, dtype: str | None, fmt: str) -> None:
    _patch_and_compare(tmp_path, kind, dtype, fmt, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize(("kind", "dtype", "fmt"), [("dlrm", "int8", "torchscript"), ("dlrm", None, "export"),
                                                    ("mc", "int8", "torchscript")])  # fmt: skip
def test_a_patched_artifact_on_the_gpu_scores_like_a_fresh_export(tmp_path: Path, kind: str, dtype: str | None,
                                                                  fmt: str) -> None:  # fmt: skip
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    _patch_and_compare(tmp_path, kind, dtype, fmt, "cuda")


def _patch_and_compare(tmp_path: Path, kind: str, dtype: str | None, fmt: str, device: str) -> None:
    """Publish a model, export it, train it, publish the rows that changed, patch the served
    artifact (loaded on ``device``) and compare it with a fresh export of the trained model."""
    model, batch = build(kind)
    takes_dense = kind != "seq"
    writer = DeltaWriter(tmp_path / "publish", table_specs(model, dtype or "fp32"))
    publish_snapshot(model, writer)
    predictor = load(export(_serving_copy(model, dtype), tmp_path / "served.pt", format=fmt), device=device)
    before = table_rows(model)
    batches = [batch(s) for s in range(3)]
    train(model, batches, takes_dense)
    changed = changed_rows(before, model)
    assert all(ids.numel() for ids in changed.values())
    publish_rows(model, writer, changed, dense=True)
    probe = cat_batches(batches + [batch(50)])  # ids trained on (and, managed, ids evicted since) and new ones
    inputs = (probe[0], probe[1].values(), probe[1].lengths())
    stale = predictor(*inputs).clone()

    follower = DeltaFollower(tmp_path / "publish", start_version=1)
    update = follower.poll()
    assert update is not None and update.from_version == 1 and list(update.versions) == [2]
    assert update.apply(predictor) == 2 and follower.version == 2

    fresh = load(export(_serving_copy(model, dtype), tmp_path / "fresh.pt", format=fmt), device=device)
    want = fresh(*inputs)
    assert not torch.equal(stale, want)  # the delta changed the scores ...
    assert torch.equal(predictor(*inputs), want)  # ... to exactly a fresh export's


def _target(fmt: str, dim: int = 8, rows: int = 5, width: int = 16) -> TableTarget:
    dtype = torch.float32 if fmt == "fp32" else torch.uint8
    return TableTarget("t", torch.zeros(rows, dim if fmt == "fp32" else width, dtype=dtype), fmt, dim, None)


@pytest.mark.parametrize("fmt", ["fp16", "int8", "int4"])
def test_fp32_rows_become_the_bytes_quantize_stores(fmt: str) -> None:
    x = torch.randn(3, 8)
    rows = TableRows(torch.tensor([0, 2, 4]), x)
    got = artifact_rows(rows, TableSpec("t", 5, 8, "fp32"), _target(fmt))
    assert torch.equal(got, quantize_rows(x, DataType[fmt.upper()]))


def test_rows_in_the_artifacts_format_are_copied_with_its_padding() -> None:
    x = torch.randn(3, 8)
    stored = quantize_rows(x, DataType.INT8, row_alignment=4)  # 12-byte rows, the artifact pads to 16
    rows = TableRows(torch.tensor([0, 1, 2]), stored)
    assert torch.equal(artifact_rows(rows, TableSpec("t", 5, 8, "int8"), _target("int8")), quantize_rows(x, DataType.INT8))
    with pytest.raises(DeltaApplyError, match="int8 rows cannot be served as int4; publish it as int4 or fp32"):
        artifact_rows(rows, TableSpec("t", 5, 8, "int8"), _target("int4"))
    with pytest.raises(DeltaApplyError, match="the version holds 5 x 6 rows, the artifact 5 x 8"):
        artifact_rows(TableRows(torch.tensor([0]), torch.zeros(1, 6)), TableSpec("t", 5, 6), _target("fp32"))


@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_find_targets_locates_every_table_where_the_metadata_records_it(tmp_path: Path, fmt: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = build("dlrm")
    q = quantize(model, dtype="int8", per_table={"t1": "int4", "t2": "fp16"})
    predictor = load(export(q, tmp_path / "m.pt", format=fmt))
    collection = q.sparse_arch.embedding_bag_collection
    offset = 0
    for table in predictor.meta["tables"]:  # back to back in the collection's flat buffer, in order
        weight = collection.embedding_bags[table["name"]].weight
        assert table["storage"] == {"buffer": "model.sparse_arch.embedding_bag_collection._flat_weights",
                                    "offset": offset, "rows": weight.shape[0], "row_bytes": weight.shape[1]}
        offset += weight.numel()
    monkeypatch.setattr(targets_module, "_flat_tables", _no_inference)
    targets = find_targets(predictor)
    for name, target in targets.tables.items():  # each is the artifact's slice of the flat buffer
        assert torch.equal(target.storage, collection.embedding_bags[name].weight), name
    assert {t.row_format for t in targets.tables.values()} == {"int8", "int4", "fp16"}
    assert "dense_arch.model._mlp.0._linear.weight" in targets.dense
    flat = dict(predictor.module.named_buffers())["model.sparse_arch.embedding_bag_collection._flat_weights"]
    assert targets.tables["t0"].storage.data_ptr() == flat.data_ptr()  # a view: writes reach the lookups


def _no_inference(*args: object) -> dict:
    raise AssertionError("the layout was inferred although the metadata records it")


def _without_storage(artifact: Path) -> None:
    """Rewrite ``artifact``'s metadata as lightrec wrote it before it recorded the tables' places."""
    meta_path = Path(f"{artifact}.meta.json")
    meta = json.loads(meta_path.read_text())
    for table in meta["tables"]:
        del table["storage"]
    meta_path.write_text(json.dumps(meta))


def test_find_targets_infers_the_layout_of_an_artifact_exported_before_it_was_recorded(tmp_path: Path) -> None:
    model, _ = build("dlrm")
    q = quantize(model, dtype="int8", per_table={"t1": "int4", "t2": "fp16"})
    artifact = export(q, tmp_path / "m.pt")
    _without_storage(artifact)
    targets = find_targets(load(artifact))
    for name, target in targets.tables.items():
        assert torch.equal(target.storage, q.sparse_arch.embedding_bag_collection.embedding_bags[name].weight), name


def test_a_recorded_place_outside_the_buffer_is_refused(tmp_path: Path) -> None:
    model, _ = build("dlrm")
    predictor = load(export(quantize(model, dtype="int8"), tmp_path / "m.pt"))
    predictor.meta["tables"][2]["storage"]["offset"] += 10_000
    with pytest.raises(DeltaApplyError, match=r"table 't2': the metadata places 17 rows of 16 bytes at byte 1\d+ "):
        find_targets(predictor)
    predictor.meta["tables"][2]["storage"]["buffer"] = "model.nothing._flat_weights"
    with pytest.raises(DeltaApplyError, match="which the artifact does not hold"):
        find_targets(predictor)


class _TwoCollections(torch.nn.Module):
    """Two pooled collections, one of 8 equal tables: several ways to cut a flat buffer by size alone."""

    def __init__(self) -> None:
        super().__init__()
        from lightrec import EmbeddingBagCollection, EmbeddingBagConfig

        def table(name: str, rows: int, dim: int) -> EmbeddingBagConfig:
            return EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[f"f_{name}"])

        self.a = EmbeddingBagCollection([table(f"a{i}", 10, 64) for i in range(8)])
        self.b = EmbeddingBagCollection([table("b0", 7, 8), table("b1", 5, 16)])

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return torch.cat([self.a(features).values(), self.b(features).values()], dim=1).sum(dim=1, keepdim=True)


def test_find_targets_cuts_flat_buffers_of_equal_tables_right(tmp_path: Path) -> None:
    torch.manual_seed(0)
    q = quantize(_TwoCollections(), dtype="int8")
    artifact = export(q, tmp_path / "m.pt")
    _without_storage(artifact)  # TorchScript keeps no per-table views: the layout is inferred
    targets = find_targets(load(artifact))
    for collection in (q.a, q.b):
        for name, table in collection.embedding_bags.items():
            assert torch.equal(targets.tables[name].storage, table.weight), name


def test_a_failed_apply_leaves_the_artifact_and_the_version_unchanged(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    model, batch = build("dlrm")
    folder = tmp_path / "publish"
    writer = DeltaWriter(folder, table_specs(model))
    publish_snapshot(model, writer)
    predictor = load(export(model, tmp_path / "m.pt"))
    before = table_rows(model)
    train(model, [batch(0)])
    publish_rows(model, writer, changed_rows(before, model), dense=True)
    probe = batch(7)
    inputs = (probe[0], probe[1].values(), probe[1].lengths())
    scores = predictor(*inputs).clone()
    state = {k: v.clone() for k, v in predictor.module.state_dict().items()}

    def broken(self, rows=None):  # noqa: ANN001, ANN202 - the dense copies fail after the rows are written
        raise RuntimeError("device lost")

    follower = DeltaFollower(folder, start_version=1)
    update = follower.poll()
    assert update is not None
    monkeypatch.setattr(apply_module._Replace, "write", lambda self, rows=None: broken(self) if rows is None
                        else self.storage.copy_(rows))  # fmt: skip
    with pytest.raises(DeltaApplyError, match=r"applying version 2 failed \(RuntimeError: device lost\); the artifact is unchanged"):
        update.apply(predictor)
    assert all(torch.equal(v, state[k]) for k, v in predictor.module.state_dict().items())
    assert torch.equal(predictor(*inputs), scores)
    assert follower.version == 1 and follower.refused_versions == {2}
    monkeypatch.undo()
    assert follower.poll(force=True) is None  # v2 is refused; a new snapshot brings the model back
    publish_snapshot(model, writer)
    assert follower.sync(predictor, force=True) == 3
    assert torch.equal(predictor(*inputs), model(*probe))


def test_a_version_of_another_model_is_refused(tmp_path: Path) -> None:
    model, _ = build("dlrm")
    predictor = load(export(model, tmp_path / "m.pt"))
    writer = DeltaWriter(tmp_path / "other", [TableSpec("t0", 40, 8), TableSpec("zz", 3, 8)])
    rows = {"t0": TableRows(torch.arange(40), torch.zeros(40, 8)), "zz": TableRows(torch.arange(3), torch.zeros(3, 8))}
    writer.write_snapshot(rows, {})
    update = PendingUpdate(DeltaReader(tmp_path / "other").state())
    with pytest.raises(DeltaApplyError, match=r"the version has table 'zz', the artifact does not"):
        update.apply(predictor)
    follower = DeltaFollower(tmp_path / "other")
    pending = follower.poll(force=True)
    assert pending is not None
    with pytest.raises(DeltaApplyError, match="'zz'"):
        pending.prepare(predictor)  # a failure found off the hot path refuses the version too
    assert follower.refused_versions == {1} and follower.poll(force=True) is None and follower.version is None
    writer.write_snapshot({**rows, "t0": TableRows(torch.arange(40), torch.zeros(40, 8))}, {"nope.weight": torch.ones(2)})
    state = DeltaReader(tmp_path / "other").state()
    with pytest.raises(DeltaApplyError, match=r"none of the version's 1 dense weights .*'nope.weight'"):
        PendingUpdate(type(state)(**{**state.__dict__, "rows": {"t0": state.rows["t0"]}})).apply(predictor)
