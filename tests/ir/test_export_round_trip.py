"""torchrec's ``torch.export`` round trip under lightrec: encapsulate, export with dynamic shapes,
save, load, unflatten, decapsulate -- and get eager collections back that hold the original
weights and compute exactly the original outputs, on the example batch and on another batch size."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.export import Dim

from lightrec.ir.serializer import JsonSerializer
from lightrec.ir.types import IRSerializationError
from lightrec.ir.utils import (
    decapsulate_ir_modules,
    encapsulate_ir_modules,
    mark_dynamic_kjt,
    unlift_and_swap_modules,
)
from lightrec.models import DLRM
from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.modules.feature_processor_ import PositionWeightedModule, PositionWeightedModuleCollection
from lightrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from lightrec.sparse import KeyedJaggedTensor

FEATURES = ["f0", "f1", "f2"]
ROWS = {"f0": 20, "f1": 20, "f2": 13}


def batch(size: int, seed: int) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """Dense ``[size, 4]`` and a KJT of the three features, 1-3 ids per bag (some bags empty)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(FEATURES) * size,), generator=g)
    lengths[0] = 2  # at least 2 ids (torch.export specializes 0 and 1)
    values = torch.cat([
        torch.randint(0, ROWS[f], (int(lengths[i * size : (i + 1) * size].sum()),), generator=g)
        for i, f in enumerate(FEATURES)
    ])  # fmt: skip
    return torch.rand(size, 4, generator=g), KeyedJaggedTensor(keys=FEATURES, values=values, lengths=lengths)


class RankingModel(nn.Module):
    """A DLRM (pooled tables, one shared by two features, a MEAN table) beside a sequence branch (EC)."""

    def __init__(self) -> None:
        super().__init__()
        ebc = EmbeddingBagCollection([
            EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=8, feature_names=["f0", "f1"]),
            EmbeddingBagConfig(name="t1", num_embeddings=13, embedding_dim=8, feature_names=["f2"],
                               pooling=PoolingType.MEAN),
        ])  # fmt: skip
        self.dlrm = DLRM(ebc, dense_in_features=4, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[8, 1])
        self.sequence = EmbeddingCollection(
            [EmbeddingConfig(name="s0", num_embeddings=20, embedding_dim=6, feature_names=["f0"])]
        )

    def forward(self, dense: torch.Tensor, features: KeyedJaggedTensor) -> tuple[torch.Tensor, ...]:
        history = self.sequence(features)["f0"]
        return self.dlrm(dense, features), history.values(), history.lengths()


def tables_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if "embedding" in name}


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    torch.manual_seed(0)
    model = RankingModel().eval()
    dense, kjt = batch(4, seed=1)
    keys_before = list(model.state_dict())
    expected = {"weights": tables_of(model), "outputs": {seed: model(*batch(n, seed)) for n, seed in ((4, 1), (7, 2))}}

    model, fqns = encapsulate_ir_modules(model)
    batch_dim = Dim("batch", min=2)
    shapes = mark_dynamic_kjt(kjt, variable_batch=True, batch_size=batch_dim)
    shapes[dense] = (batch_dim, None)
    program = torch.export.export(
        model, (dense, kjt), dynamic_shapes=shapes.dynamic_shapes(model, (dense, kjt)), strict=False,
        preserve_module_call_signature=tuple(fqns),
    )  # fmt: skip
    path: Path = tmp_path_factory.mktemp("ir") / "ranking.pt2"
    torch.export.save(program, str(path))
    return {"model": model, "fqns": fqns, "keys_before": keys_before, "path": path, **expected}


def test_encapsulation_marks_the_collections_and_keeps_the_state_dict(round_trip: dict) -> None:
    assert round_trip["fqns"] == ["dlrm.sparse_arch.embedding_bag_collection", "sequence"]
    assert list(round_trip["model"].state_dict()) == round_trip["keys_before"]  # ir_metadata is not persistent


def test_loaded_program_decapsulates_to_eager_collections_with_the_weights(
    round_trip: dict, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        program = torch.export.load(str(round_trip["path"]))
    # the KJT example inputs load with weights_only=True: no fallback to unpickling with code execution
    assert not [r for r in caplog.records if "weights_only=False" in str(r.msg)]
    model = decapsulate_ir_modules(torch.export.unflatten(program))
    assert type(model.dlrm.sparse_arch.embedding_bag_collection) is EmbeddingBagCollection
    assert type(model.sequence) is EmbeddingCollection
    weights = tables_of(model)
    assert weights.keys() == round_trip["weights"].keys()
    for name, original in round_trip["weights"].items():
        assert torch.equal(weights[name], original), name


@pytest.mark.parametrize(("size", "seed"), [(4, 1), (7, 2)], ids=["example-batch", "other-batch-size"])
def test_decapsulated_model_and_program_compute_the_original_outputs(round_trip: dict, size: int, seed: int) -> None:
    program = torch.export.load(str(round_trip["path"]))
    model = decapsulate_ir_modules(program)  # an ExportedProgram is unflattened first
    expected = round_trip["outputs"][seed]
    for got in (model(*batch(size, seed)), program.module()(*batch(size, seed))):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert torch.equal(g, e)


def test_torchrecs_finalize_and_regroup_options(round_trip: dict) -> None:
    program = torch.export.load(str(round_trip["path"]))
    with pytest.raises(ValueError, match="finalize_interpreter_modules=True"):
        decapsulate_ir_modules(torch.export.unflatten(program), short_circuit_pytree_ebc_regroup=True)
    model = decapsulate_ir_modules(
        torch.export.unflatten(program), finalize_interpreter_modules=True, short_circuit_pytree_ebc_regroup=True
    )
    for got, want in zip(model(*batch(7, 2)), round_trip["outputs"][2], strict=True):
        assert torch.equal(got, want)


def test_decapsulate_builds_on_the_requested_device(round_trip: dict) -> None:
    model = decapsulate_ir_modules(torch.export.load(str(round_trip["path"])), device=torch.device("meta"))
    assert model.sequence.device.type == "meta"
    assert model.dlrm.sparse_arch.embedding_bag_collection.device.type == "meta"


def test_the_flat_program_module_is_refused_with_the_fix(round_trip: dict) -> None:
    program = torch.export.load(str(round_trip["path"]))
    with pytest.raises(IRSerializationError, match=r"torch\.export\.unflatten\(ep\)"):
        decapsulate_ir_modules(program.module())


class Processed(nn.Module):
    """Both kinds of feature-processed collection: a processor collection and a dict of processors."""

    def __init__(self) -> None:
        super().__init__()
        t0 = EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=4, feature_names=["f0", "f1"])
        t1 = EmbeddingBagConfig(name="t1", num_embeddings=13, embedding_dim=3, feature_names=["f2"])
        self.by_collection = FeatureProcessedEmbeddingBagCollection(
            EmbeddingBagCollection([t0], is_weighted=True), PositionWeightedModuleCollection({"f0": 4, "f1": 4})
        )
        self.by_feature = FeatureProcessedEmbeddingBagCollection(
            EmbeddingBagCollection([t1], is_weighted=True), {"f2": PositionWeightedModule(4)}
        )
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-1.0, 1.0)  # position weights away from 1 so that they count

    def forward(self, features: KeyedJaggedTensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.by_collection(features).values(), self.by_feature(features).values()


def test_feature_processed_collections_round_trip(tmp_path: Path) -> None:
    model = Processed()
    _, kjt = batch(4, seed=3)
    _, other = batch(6, seed=4)
    expected, expected_other, weights = model(kjt), model(other), dict(model.state_dict())
    model, fqns = encapsulate_ir_modules(model, JsonSerializer)
    shapes = mark_dynamic_kjt(kjt, variable_batch=True)
    program = torch.export.export(
        model, (kjt,), dynamic_shapes=shapes.dynamic_shapes(model, (kjt,)), strict=False,
        preserve_module_call_signature=tuple(fqns),
    )  # fmt: skip
    torch.export.save(program, str(tmp_path / "fp.pt2"))
    rebuilt = decapsulate_ir_modules(torch.export.unflatten(torch.export.load(str(tmp_path / "fp.pt2"))))
    assert type(rebuilt.by_collection._feature_processors) is PositionWeightedModuleCollection
    assert type(rebuilt.by_feature._feature_processors["f2"]) is PositionWeightedModule
    for name, tensor in rebuilt.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    for got, want in ((rebuilt(kjt), expected), (rebuilt(other), expected_other)):
        for g, e in zip(got, want, strict=True):
            assert torch.equal(g, e)


def test_unlift_and_swap_keeps_the_flat_graph_and_calls_eager_collections(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = RankingModel().dlrm.eval()
    dense, kjt = batch(4, seed=5)
    expected = model(dense, kjt)
    model, fqns = encapsulate_ir_modules(model)
    program = torch.export.export(model, (dense, kjt), strict=False, preserve_module_call_signature=tuple(fqns))
    torch.export.save(program, str(tmp_path / "dlrm.pt2"))
    swapped = unlift_and_swap_modules(torch.export.load(str(tmp_path / "dlrm.pt2")))
    assert isinstance(swapped, torch.fx.GraphModule)
    assert type(swapped.sparse_arch.embedding_bag_collection) is EmbeddingBagCollection
    assert torch.equal(swapped(dense, kjt), expected)


def test_unlift_and_swap_refuses_nested_serialized_modules() -> None:
    model, fqns = encapsulate_ir_modules(Processed())
    _, kjt = batch(4, seed=5)
    program = torch.export.export(model, (kjt,), strict=False, preserve_module_call_signature=tuple(fqns))
    with pytest.raises(IRSerializationError, match=r"cannot swap by_collection: it is built from serialized children"):
        unlift_and_swap_modules(program)


def test_unlift_and_swap_refuses_outputs_it_would_shift(round_trip: dict) -> None:
    program = torch.export.load(str(round_trip["path"]))  # the sequence collection returns JaggedTensors
    with pytest.raises(IRSerializationError, match=r"cannot swap sequence.*decapsulate_ir_modules"):
        unlift_and_swap_modules(program)


def test_a_bag_longer_than_its_position_weights_fails_in_the_program() -> None:
    model = Processed()
    _, kjt = batch(4, seed=6)
    model, fqns = encapsulate_ir_modules(model)
    shapes = mark_dynamic_kjt(kjt).dynamic_shapes(model, (kjt,))
    program = torch.export.export(
        model, (kjt,), dynamic_shapes=shapes, strict=False, preserve_module_call_signature=tuple(fqns)
    )
    long = KeyedJaggedTensor(keys=FEATURES, values=torch.zeros(5, dtype=torch.long),
                             lengths=torch.tensor([0] * 8 + [5, 0, 0, 0]))  # fmt: skip  # f2's first bag: 5 > 4
    with pytest.raises(RuntimeError, match="longer than 4 positions"):
        program.module()(long)


class SharedTables(nn.Module):
    """One collection called twice (two towers over the same tables): unflattened as a dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.tables = EmbeddingBagCollection(
            [EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=4, feature_names=["f0", "f1"])]
        )

    def forward(self, query: KeyedJaggedTensor, item: KeyedJaggedTensor) -> torch.Tensor:
        return (self.tables(query).values() * self.tables(item).values()).sum(dim=1)


def test_a_collection_called_twice_is_rebuilt_once() -> None:
    model = SharedTables()
    (_, query), (_, item) = batch(4, seed=7), batch(4, seed=8)
    expected = model(query, item)
    model, fqns = encapsulate_ir_modules(model)
    program = torch.export.export(model, (query, item), strict=False, preserve_module_call_signature=tuple(fqns))
    rebuilt = decapsulate_ir_modules(torch.export.unflatten(program))
    assert type(rebuilt.tables) is EmbeddingBagCollection
    assert torch.equal(rebuilt(query, item), expected)


class Weighted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(
            [EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=4, feature_names=["f0", "f1"])],
            is_weighted=True,
        )

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.ebc(features).values()


def weighted_kjt(lengths: list[int], seed: int, **variable_batch: object) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    return KeyedJaggedTensor(keys=["f0", "f1"], values=torch.randint(0, 20, (n,), generator=g),
                             lengths=torch.tensor(lengths), weights=torch.rand(n, generator=g), **variable_batch)  # fmt: skip


def test_per_id_weights_export_with_a_dynamic_number_of_ids() -> None:
    model = Weighted()
    example, other = weighted_kjt([2, 0, 1, 2], seed=0), weighted_kjt([2, 0, 3, 1, 1, 1], seed=1)
    expected = model(other)
    model, fqns = encapsulate_ir_modules(model)
    shapes = mark_dynamic_kjt(example, variable_batch=True).dynamic_shapes(model, (example,))
    program = torch.export.export(
        model, (example,), dynamic_shapes=shapes, strict=False, preserve_module_call_signature=tuple(fqns)
    )
    assert torch.equal(decapsulate_ir_modules(torch.export.unflatten(program))(other), expected)
    assert torch.equal(program.module()(other), expected)


def test_a_variable_batch_kjt_exports_with_static_shapes() -> None:
    model = Weighted()
    # f0 has 2 samples, f1 3; the batch of 3 reads f0's bags [0, 1, 0] and f1's [2, 0, 1]
    kjt = weighted_kjt([2, 1, 0, 2, 1], seed=2, stride_per_key_per_rank=[[2], [3]],
                       inverse_indices=(["f0", "f1"], torch.tensor([[0, 1, 0], [2, 0, 1]])))  # fmt: skip
    expected = model(kjt)
    with pytest.raises(ValueError, match="part of its pytree context"):
        mark_dynamic_kjt(kjt, variable_length=True)
    model, fqns = encapsulate_ir_modules(model)
    program = torch.export.export(model, (kjt,), strict=False, preserve_module_call_signature=tuple(fqns))
    assert torch.equal(decapsulate_ir_modules(torch.export.unflatten(program))(kjt), expected)


def test_a_program_exported_without_call_signatures_is_refused_with_the_fix() -> None:
    model, _ = encapsulate_ir_modules(Weighted())
    kjt = weighted_kjt([2, 0, 1, 2], seed=3)
    program = torch.export.export(model, (kjt,), strict=False)  # no preserve_module_call_signature
    with pytest.raises(IRSerializationError, match=r"\['ebc'\] were exported without.*preserve_module_call_signature"):
        decapsulate_ir_modules(torch.export.unflatten(program))
