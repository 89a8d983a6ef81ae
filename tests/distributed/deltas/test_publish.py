"""Publishing an unsharded model: a snapshot plus the deltas of the rows that changed rebuild the
model's tables at every version (fp32 bit for bit, int8 as the bytes ``quantize`` stores), managed
tables carry the ids their rows hold, dense weights are the model's non-table floats."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.distributed.deltas import (
    DeltaFormatError,
    DeltaReader,
    DeltaWriter,
    dense_weights,
    publish_rows,
    publish_snapshot,
    table_rows,
    table_specs,
)
from lightrec.inference import quantize
from lightrec.modules.managed_collision.ops import EMPTY_ID
from tests.inference.helpers import dlrm, tables
from tests.serving.deltas.models import build, changed_rows, train


@pytest.mark.parametrize("row_format", ["fp32", "int8"])
def test_every_version_rebuilds_the_trained_tables(tmp_path: Path, row_format: str) -> None:
    model, batch = build("dlrm")
    writer = DeltaWriter(tmp_path, table_specs(model, row_format), retention=None)
    publish_snapshot(model, writer)
    weights = {1: {n: r.values for n, r in table_rows(model).items()}}
    for step in range(2, 5):
        before = table_rows(model)
        train(model, [batch(step)])
        assert publish_rows(model, writer, changed_rows(before, model), global_step=step) == step
        weights[step] = {n: r.values for n, r in table_rows(model).items()}
    reader = DeltaReader(tmp_path)
    for version, tables_at_v in weights.items():
        state = reader.state(version)
        if row_format == "fp32":
            assert all(torch.equal(state.rows[n].values, w) for n, w in tables_at_v.items())
            continue
        model_at_v = dlrm()
        for n, w in tables_at_v.items():
            model_at_v.sparse_arch.embedding_bag_collection.embedding_bags[n].weight.data.copy_(w)
        served = quantize(model_at_v, dtype="int8").sparse_arch.embedding_bag_collection
        assert all(torch.equal(state.rows[n].values, served.embedding_bags[n].weight) for n in tables_at_v)


def test_specs_rows_and_dense_of_a_model() -> None:
    model = dlrm()
    specs = {s.name: s for s in table_specs(model, {"t1": "int8"})}
    assert [(s.num_embeddings, s.dim, s.row_format, s.managed) for s in specs.values()] == [
        (40, 8, "fp32", False), (31, 8, "int8", False), (17, 8, "fp32", False)]  # fmt: skip
    rows = table_rows(model, {"t0": torch.tensor([5, 1, 5])})
    weight = model.sparse_arch.embedding_bag_collection.embedding_bags["t0"].weight
    assert torch.equal(rows["t0"].ids, torch.tensor([1, 5])) and torch.equal(rows["t0"].values, weight[[1, 5]])
    dense = dense_weights(model)
    assert "dense_arch.model._mlp.0._linear.weight" in dense and not any("embedding_bags" in k for k in dense)
    bare = EmbeddingBagCollection(tables())  # a collection alone: its own tables, no dense weights
    assert [s.name for s in table_specs(bare)] == ["t0", "t1", "t2"] and dense_weights(bare) == {}


def test_managed_rows_carry_the_ids_their_id_maps_keep() -> None:
    model, _ = build("mc")
    specs = {s.name: s for s in table_specs(model)}
    assert specs["t0"].managed and specs["t1"].managed
    rows = table_rows(model)
    mcc = model.sparse_arch.embedding_bag_collection._managed_collision_collection
    mch = mcc._managed_collision_modules["t0"]._mch_sorted_raw_ids
    assert torch.equal(rows["t0"].raw_ids, torch.where(mch == EMPTY_ID, -1, mch))
    assert bool((rows["t0"].raw_ids >= 0).any()) and bool((rows["t0"].raw_ids == -1).any())
    zch = mcc._managed_collision_modules["t1"]._hash_zch_identities.reshape(-1)
    assert torch.equal(rows["t1"].raw_ids, zch)


def test_publish_refuses_what_it_cannot_publish(tmp_path: Path) -> None:
    with pytest.raises(DeltaFormatError, match="holds no unsharded EmbeddingBagCollection"):
        table_specs(torch.nn.Linear(2, 2))
    model = dlrm()
    with pytest.raises(DeltaFormatError, match=r"row_format names tables \['nope'\]"):
        table_specs(model, {"nope": "int8"})
    with pytest.raises(DeltaFormatError, match=r"table_ids\['t2'\] holds ids outside \[0, 17\): 3\.\.17"):
        table_rows(model, {"t2": torch.tensor([3, 17])})
    with pytest.raises(DeltaFormatError, match="has no snapshot yet"):
        publish_rows(model, tmp_path, {"t0": torch.tensor([1])})
    # two towers whose tables share a name: the folder keys tables by name (one used to hide the other)
    towers = torch.nn.ModuleDict({side: EmbeddingBagCollection([EmbeddingBagConfig(
        name="t0", num_embeddings=rows, embedding_dim=4, feature_names=[side])]) for side, rows in (("user", 10), ("item", 50))})  # fmt: skip
    with pytest.raises(DeltaFormatError, match=r"two collections hold a table named 't0' \(user.embedding_bags.t0.weight, "
                       r"item.embedding_bags.t0.weight\)"):  # fmt: skip
        table_specs(towers)
