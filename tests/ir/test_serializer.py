"""The JSON serializers without export: configs survive JSON exactly, an encapsulated eager model
decapsulates to equal modules, and bad input fails with typed errors that say what to fix."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from lightrec.ir import schema
from lightrec.ir.serializer import IR_METADATA, JsonSerializer
from lightrec.ir.types import IRMetadataError, SerializerInterface, UnknownModuleTypeError, qualname
from lightrec.ir.utils import decapsulate_ir_modules, encapsulate_ir_modules, mark_dynamic_kjt
from lightrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.modules.feature_processor_ import PositionWeightedModule, PositionWeightedModuleCollection
from lightrec.sparse import KeyedJaggedTensor

BAG_TABLES = [
    EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f0", "f1"]),
    EmbeddingBagConfig(name="t1", num_embeddings=7, embedding_dim=2, feature_names=["f2"], pooling=PoolingType.MEAN,
                       data_type=DataType.FP16, weight_init_min=-0.5, weight_init_max=0.25, need_pos=True,
                       num_embeddings_post_pruning=5),
]  # fmt: skip
SEQ_TABLES = [EmbeddingConfig(name="s0", num_embeddings=9, embedding_dim=3, feature_names=["f0"], data_type=DataType.BF16)]


def through_json(module: nn.Module, device: torch.device | None = None) -> nn.Module:
    raw = json.loads(json.dumps(JsonSerializer.serialize(module)))  # JSON-able: no tensors, no enums
    return JsonSerializer.deserialize(raw["metadata_dict"], raw["typename"], device)


def test_bag_collection_config_survives_json() -> None:
    ebc = EmbeddingBagCollection(BAG_TABLES, is_weighted=True, bounds_check="clamp")
    raw = JsonSerializer.serialize(ebc)
    assert raw["typename"] == "lightrec.modules.embedding_modules.EmbeddingBagCollection"
    assert raw["metadata_dict"]["tables"][1]["pooling"] == "MEAN"
    assert raw["metadata_dict"]["tables"][1]["data_type"] == "FP16"
    rebuilt = through_json(ebc)
    assert isinstance(rebuilt, EmbeddingBagCollection)
    assert rebuilt.embedding_bag_configs() == BAG_TABLES  # names, dims, features, pooling, data type, init range
    assert rebuilt.embedding_bag_configs()[1].num_embeddings_post_pruning == 5
    # metadata written before num_embeddings_post_pruning existed still reads
    old = json.loads(json.dumps(raw))
    for table in old["metadata_dict"]["tables"]:
        del table["num_embeddings_post_pruning"]
    older = JsonSerializer.deserialize(old["metadata_dict"], old["typename"], None)
    assert [t.num_embeddings_post_pruning for t in older.embedding_bag_configs()] == [None, None]
    assert rebuilt.is_weighted() and rebuilt._bounds_check == "clamp"
    assert rebuilt.embedding_names() == ebc.embedding_names()


def test_sequence_collection_and_position_weights_survive_json() -> None:
    ec = EmbeddingCollection(SEQ_TABLES, need_indices=True)
    rebuilt = through_json(ec)
    assert isinstance(rebuilt, EmbeddingCollection)
    assert rebuilt.embedding_configs() == SEQ_TABLES and rebuilt.need_indices()
    pwm = through_json(PositionWeightedModule(6, dtype=torch.float64))
    assert isinstance(pwm, PositionWeightedModule)
    assert pwm.position_weight.shape == (6,) and pwm.position_weight.dtype == torch.float64
    pwmc = through_json(PositionWeightedModuleCollection({"b": 3, "a": 5}))
    assert isinstance(pwmc, PositionWeightedModuleCollection)
    assert list(pwmc.max_feature_lengths.items()) == [("b", 3), ("a", 5)]  # order kept


def test_deserialize_onto_another_device() -> None:
    rebuilt = through_json(EmbeddingBagCollection(BAG_TABLES), device=torch.device("meta"))
    assert rebuilt.device.type == "meta"


class Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bags = EmbeddingBagCollection(BAG_TABLES)
        self.seq = EmbeddingCollection(SEQ_TABLES)
        self.proj = nn.Linear(6, 1)


def test_an_encapsulated_eager_model_decapsulates_to_equal_modules() -> None:
    model = Tower()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model, fqns = encapsulate_ir_modules(model)
    assert fqns == ["bags", "seq"]
    assert model.bags.get_buffer(IR_METADATA).dtype == torch.uint8
    old_bags = model.bags
    rebuilt = decapsulate_ir_modules(model)
    assert rebuilt.bags is not old_bags and IR_METADATA not in dict(rebuilt.bags.named_buffers())
    after = rebuilt.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key


def test_a_registered_custom_serializer_is_used() -> None:
    class Scaler(nn.Module):
        def __init__(self, factor: float) -> None:
            super().__init__()
            self.factor = factor
            self.bias = nn.Parameter(torch.zeros(2))

    class ScalerSerializer(JsonSerializer):
        _module_cls = Scaler

        @classmethod
        def serialize_to_dict(cls, module: nn.Module) -> dict[str, object]:
            assert isinstance(module, Scaler)
            return {"factor": module.factor}

        @classmethod
        def deserialize_from_dict(cls, metadata_dict, device=None, unflatten_ep=None) -> nn.Module:  # noqa: ANN001
            return Scaler(metadata_dict["factor"])

    JsonSerializer.module_to_serializer_cls[qualname(Scaler)] = ScalerSerializer
    try:
        holder = nn.Sequential(Scaler(2.5))
        with torch.no_grad():
            holder[0].bias.fill_(3.0)
        holder, fqns = encapsulate_ir_modules(holder)
        assert fqns == ["0"]
        rebuilt = decapsulate_ir_modules(holder)[0]
        assert isinstance(rebuilt, Scaler) and rebuilt.factor == 2.5 and torch.equal(rebuilt.bias, torch.full((2,), 3.0))
    finally:
        del JsonSerializer.module_to_serializer_cls[qualname(Scaler)]


def test_the_interface_is_abstract_and_keys_are_qualified_names() -> None:
    assert issubclass(JsonSerializer, SerializerInterface)
    with pytest.raises(TypeError):
        SerializerInterface()  # type: ignore[abstract]
    assert qualname(EmbeddingCollection) == qualname(EmbeddingCollection(SEQ_TABLES))
    assert JsonSerializer.requires_children(
        "lightrec.modules.fp_embedding_modules.FeatureProcessedEmbeddingBagCollection"
    )
    assert not JsonSerializer.requires_children(qualname(EmbeddingBagCollection))


# ------------------------------------------------------------------------------ errors
def with_metadata(raw: object) -> nn.Module:
    module = EmbeddingBagCollection(BAG_TABLES)
    data = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    module.register_buffer(IR_METADATA, torch.frombuffer(bytearray(data), dtype=torch.uint8), persistent=False)
    return module


def good_metadata() -> dict:
    return JsonSerializer.serialize(EmbeddingBagCollection(BAG_TABLES))


def test_unknown_module_type_in_metadata() -> None:
    raw = good_metadata() | {"typename": "somewhere.else.MysteryCollection"}
    with pytest.raises(UnknownModuleTypeError, match=r"'somewhere\.else\.MysteryCollection'.*module_to_serializer_cls"):
        decapsulate_ir_modules(nn.Sequential(with_metadata(raw)))


def test_encapsulating_a_module_type_without_serializer() -> None:
    with pytest.raises(UnknownModuleTypeError, match=r"torch\.nn\.modules\.linear\.Linear"):
        JsonSerializer.encapsulate_module(nn.Linear(2, 2))
    assert encapsulate_ir_modules(nn.Linear(2, 2))[1] == []  # a model without collections: nothing to do


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda raw: raw["metadata_dict"].pop("is_weighted"), r"missing fields \['is_weighted'\]"),
        (lambda raw: raw["metadata_dict"].update(colour="red"), r"unknown fields \['colour'\]"),
        (lambda raw: raw["metadata_dict"]["tables"][0].update(data_type="FP7"), r"table 't0'.*FP7"),
        (lambda raw: raw["metadata_dict"]["tables"][0].update(pooling="MAX"), r"table 't0'.*MAX"),
        (lambda raw: raw["metadata_dict"]["tables"][0].update(num_embeddings=-3), r"table 't0'.*num_embeddings"),
        (lambda raw: raw.pop("metadata_dict"), r"'typename': str, 'metadata_dict'"),
    ],
    ids=["missing-field", "unknown-field", "bad-data-type", "bad-pooling", "bad-rows", "no-metadata-dict"],
)
def test_malformed_metadata(change, message: str) -> None:  # noqa: ANN001
    raw = good_metadata()
    change(raw)
    with pytest.raises(IRMetadataError, match=message):
        JsonSerializer.decapsulate_module(with_metadata(raw))


def test_metadata_that_is_not_json() -> None:
    with pytest.raises(IRMetadataError, match="is not JSON"):
        JsonSerializer.decapsulate_module(with_metadata(b"\xff{not json"))


def test_tensors_that_do_not_fit_the_metadata() -> None:
    raw = good_metadata()
    raw["metadata_dict"]["tables"][0]["num_embeddings"] = 11  # the module's table t0 has 10 rows
    with pytest.raises(IRMetadataError, match=r"embedding_bags\.t0\.weight.*\(10, 4\).*\(11, 4\)"):
        JsonSerializer.decapsulate_module(with_metadata(raw))


def test_schema_reads_only_objects() -> None:
    with pytest.raises(IRMetadataError, match="must be a JSON object"):
        schema.from_dict(schema.EBCMetadata, [1, 2], "EmbeddingBagCollection metadata")


def test_mark_dynamic_kjt() -> None:
    kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(5), lengths=torch.tensor([1, 2, 0, 2]),
                            weights=torch.rand(5))  # fmt: skip
    shapes = mark_dynamic_kjt(kjt, variable_batch=True)
    # the KJT enters the program as [values, weights, lengths]
    (values, weights, lengths) = shapes.dynamic_shapes(nn.Identity(), (kjt,))["input"]
    assert values[0] is weights[0] and values[0].__name__.startswith("vlen_") and values[0].min == 2
    assert str(lengths[0]).startswith("2*batch_size_")  # F * B: 2 keys, a dynamic batch
    with pytest.raises(ValueError, match="at least 2 ids"):
        mark_dynamic_kjt(KeyedJaggedTensor(keys=["a"], values=torch.tensor([1]), lengths=torch.tensor([1, 0])))
    with pytest.raises(ValueError, match="at least 2 samples"):
        mark_dynamic_kjt(KeyedJaggedTensor(keys=["a"], values=torch.tensor([1, 2]), lengths=torch.tensor([2])),
                         variable_batch=True)  # fmt: skip
