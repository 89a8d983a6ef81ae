"""Review of ``lightrec.ir``: the round trip of each collection kind (exact outputs, configs,
weights, device) and the typed errors for metadata that cannot be read back."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from lightrec.ir import IRMetadataError, JsonSerializer, UnknownModuleTypeError
from lightrec.ir.serializer import IR_METADATA
from lightrec.ir.utils import decapsulate_ir_modules, encapsulate_ir_modules, mark_dynamic_kjt
from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.modules.feature_processor_ import PositionWeightedModuleCollection
from lightrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from lightrec.sparse import KeyedJaggedTensor

KEYS = ["f0", "f1"]


def kjt_of(batch: int, seed: int, weighted: bool = False) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (len(KEYS) * batch,), generator=g)
    lengths[0] = 2  # at least 2 ids (torch.export specializes sizes 0 and 1)
    values = torch.randint(0, 10, (int(lengths.sum()),), generator=g)
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor(keys=KEYS, values=values, lengths=lengths, weights=weights)


def bag_tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f0"],
                           weight_init_min=-0.25, weight_init_max=0.5),
        EmbeddingBagConfig(name="t1", num_embeddings=10, embedding_dim=3, feature_names=["f1"],
                           pooling=PoolingType.MEAN),
    ]  # fmt: skip


class TwoCollections(nn.Module):
    """A bag collection and a sequence collection reading the same KJT."""

    def __init__(self) -> None:
        super().__init__()
        self.bags = EmbeddingBagCollection(bag_tables())
        self.seq = EmbeddingCollection(
            [EmbeddingConfig(name="s0", num_embeddings=10, embedding_dim=2, feature_names=["f0", "f1"])]
        )

    def forward(self, kjt: KeyedJaggedTensor) -> tuple[torch.Tensor, ...]:
        out = self.seq(kjt)
        return self.bags(kjt).values(), out["f0"].values(), out["f1"].values()


class Wrapped(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        out = self.inner(kjt)
        return out.values() if hasattr(out, "values") else out


def build(kind: str) -> tuple[nn.Module, bool]:
    torch.manual_seed(0)
    if kind == "ebc":
        return Wrapped(EmbeddingBagCollection(bag_tables())), False
    if kind == "weighted-ebc":
        return Wrapped(EmbeddingBagCollection(bag_tables(), is_weighted=True)), True
    if kind == "fp-ebc":
        fp = FeatureProcessedEmbeddingBagCollection(
            EmbeddingBagCollection(bag_tables(), is_weighted=True), PositionWeightedModuleCollection({"f0": 3, "f1": 3})
        )
        with torch.no_grad():
            fp._feature_processors.position_weights["f0"].uniform_(-1.0, 1.0)  # away from 1 so that they count
        return Wrapped(fp), False
    return TwoCollections(), False


@pytest.mark.parametrize("kind", ["ebc", "weighted-ebc", "fp-ebc", "two-collections"])
def test_round_trip_with_a_dynamic_batch_gives_the_original_outputs_configs_and_weights(kind: str) -> None:
    model, weighted = build(kind)
    model.eval()
    example, other = kjt_of(3, seed=1, weighted=weighted), kjt_of(5, seed=2, weighted=weighted)
    expected = [model(example), model(other)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    configs = [
        m.embedding_bag_configs() if isinstance(m, EmbeddingBagCollection) else m.embedding_configs()
        for m in model.modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))
    ]  # fmt: skip

    model, fqns = encapsulate_ir_modules(model, JsonSerializer)
    shapes = mark_dynamic_kjt(example, variable_batch=True)
    ep = torch.export.export(
        model, (example,), dynamic_shapes=shapes.dynamic_shapes(model, (example,)), strict=False,
        preserve_module_call_signature=tuple(fqns),
    )  # fmt: skip
    rebuilt = decapsulate_ir_modules(torch.export.unflatten(ep), JsonSerializer)

    for batch, want in zip((example, other), expected, strict=True):
        for runner in (rebuilt, ep.module()):
            got = runner(batch)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                            strict=True):  # fmt: skip
                assert torch.equal(g, w)
    assert {k: v for k, v in rebuilt.state_dict().items() if k in state}.keys() == state.keys()
    for name, value in rebuilt.state_dict().items():
        assert torch.equal(value, state[name]), name
    eager = [m for m in rebuilt.modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))]
    assert [
        m.embedding_bag_configs() if isinstance(m, EmbeddingBagCollection) else m.embedding_configs() for m in eager
    ] == configs
    assert all(m.device == torch.device("cpu") for m in eager)


# ------------------------------------------------------------------------------ bad metadata
def with_metadata(raw: object) -> nn.Module:
    module = EmbeddingBagCollection(bag_tables())
    data = json.dumps(raw).encode()
    module.register_buffer(IR_METADATA, torch.frombuffer(bytearray(data), dtype=torch.uint8), persistent=False)
    return module


def test_a_lost_pooling_entry_is_refused_not_read_as_sum() -> None:
    raw = JsonSerializer.serialize(EmbeddingBagCollection(bag_tables()))
    del raw["metadata_dict"]["tables"][1]["pooling"]  # t1 pools by MEAN
    with pytest.raises(IRMetadataError, match=r"missing fields \['pooling'\]"):
        JsonSerializer.decapsulate_module(with_metadata(raw))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda md: md.update(is_weighted="no"), r"'is_weighted' must be bool, got str: 'no'"),
        (lambda md: md.update(tables=5), r"'tables' must be .*got int: 5"),
        (lambda md: md["tables"][0].update(embedding_dim=4.0), r"'embedding_dim' must be int, got float"),
        (lambda md: md["tables"][0].update(need_pos=1), r"'need_pos' must be bool, got int"),
        (lambda md: md.update(bounds_check="ignore"), r"EmbeddingBagCollection metadata .*bounds_check.*'ignore'"),
    ],
    ids=["bool-as-string", "tables-not-a-list", "float-rows", "int-as-bool", "bad-bounds-check"],
)
def test_metadata_values_of_the_wrong_kind_raise_a_typed_error(change, message: str) -> None:  # noqa: ANN001
    raw = JsonSerializer.serialize(EmbeddingBagCollection(bag_tables()))
    change(raw["metadata_dict"])
    with pytest.raises(IRMetadataError, match=message):
        JsonSerializer.decapsulate_module(with_metadata(raw))


def exported_two_collections() -> nn.Module:
    model, fqns = encapsulate_ir_modules(nn.Sequential(TwoCollections()))
    ep = torch.export.export(model, (kjt_of(3, seed=1),), strict=False, preserve_module_call_signature=tuple(fqns))
    return torch.export.unflatten(ep)


def set_metadata(module: nn.Module, raw: object) -> None:
    data = bytearray(json.dumps(raw).encode())
    module.register_buffer(IR_METADATA, torch.frombuffer(data, dtype=torch.uint8), persistent=False)


def test_errors_of_decapsulation_name_the_module_in_the_model() -> None:
    unflat = exported_two_collections()
    set_metadata(unflat.get_submodule("0.seq"), {"typename": "elsewhere.Mystery", "metadata_dict": {}})
    with pytest.raises(UnknownModuleTypeError, match=r"module '0\.seq'.*'elsewhere\.Mystery'.*module_to_serializer_cls"):
        decapsulate_ir_modules(unflat)

    unflat = exported_two_collections()
    raw = JsonSerializer.serialize(EmbeddingBagCollection(bag_tables()))
    del raw["metadata_dict"]["is_weighted"]
    set_metadata(unflat.get_submodule("0.bags"), raw)
    with pytest.raises(IRMetadataError, match=r"module '0\.bags'.*missing fields \['is_weighted'\]"):
        decapsulate_ir_modules(unflat)


def test_device_may_be_given_as_a_string() -> None:
    rebuilt = decapsulate_ir_modules(exported_two_collections(), device="meta")
    assert rebuilt.get_submodule("0.bags").device.type == "meta"
    assert rebuilt.get_submodule("0.seq").device.type == "meta"
    with pytest.raises(ValueError, match=r"device='nowhere'"):
        decapsulate_ir_modules(exported_two_collections(), device="nowhere")
