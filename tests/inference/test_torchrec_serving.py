"""torchrec's serving entry points under lightrec: quantize_embeddings, PredictFactory /
PredictModule, the model packager round trip, quantize_dense."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.package import PackageExporter

from lightrec import EmbeddingCollection
from lightrec.inference import quantize
from lightrec.inference.model_packager import PredictFactoryPackager, load_predict_factory
from lightrec.inference.modules import PredictModule, quantize_dense, quantize_embeddings
from lightrec.quant import QuantEmbeddingBagCollection
from tests.inference.helpers import dlrm, kjt


def test_quantize_embeddings_is_lightrecs_quantize() -> None:
    model = dlrm()
    dense, features = torch.randn(5, 5), kjt()
    copy = quantize_embeddings(model, dtype=torch.qint8, inplace=False)
    want = quantize(model, dtype=torch.int8)(dense, features)
    torch.testing.assert_close(copy(dense, features), want)
    assert not isinstance(model.sparse_arch.embedding_bag_collection, QuantEmbeddingBagCollection)
    same = quantize_embeddings(model, dtype=torch.qint8, inplace=True, additional_qconfig_spec_keys=[EmbeddingCollection])
    assert same is model and isinstance(model.sparse_arch.embedding_bag_collection, QuantEmbeddingBagCollection)
    torch.testing.assert_close(model(dense, features), want)
    with pytest.raises(ValueError, match="return float32"):
        quantize_embeddings(dlrm(), dtype=torch.qint8, inplace=False, output_dtype=torch.half)
    with pytest.raises(ValueError, match="cannot map \\['Linear'\\]"):
        quantize_embeddings(dlrm(), dtype=torch.qint8, inplace=False, additional_mapping={torch.nn.Linear: torch.nn.Linear})


class _Packager(PredictFactoryPackager):
    @classmethod
    def set_extern_modules(cls, pe: PackageExporter) -> None:
        pe.extern(["torch.**", "lightrec.**", "numpy.**", "sys", "io", "typing_extensions", "tests.inference.helpers"])

    @classmethod
    def set_mocked_modules(cls, pe: PackageExporter) -> None:
        pe.mock(["__future__"])


def test_predict_factory_packaged_and_loaded_back(tmp_path: Path) -> None:
    from tests.inference.predict_factory_example import DLRMPredictFactory

    weights = tmp_path / "weights.pt"
    torch.save(dlrm(seed=0).state_dict(), weights)
    package = tmp_path / "model.package"
    _Packager.save_predict_factory(DLRMPredictFactory, {"weights_path": str(weights)}, package,
                                   extra_files={"README": "DLRM"})  # fmt: skip
    assert package.is_file() and not list(tmp_path.glob("*.tmp"))
    factory = load_predict_factory(package)()
    assert factory.result_metadata() == "dict_of_tensor" and "sparse" in factory.batching_metadata_json()
    module = factory.create_predict_module()
    features = kjt(seed=3)
    batch = {"float_features": torch.randn(5, 5), "values": features.values(), "lengths": features.lengths()}
    out = module(batch)["default"]
    want = torch.sigmoid(quantize(dlrm(seed=0), dtype=torch.int8)(batch["float_features"], features)).squeeze(1)
    torch.testing.assert_close(out, want)
    assert not out.requires_grad and torch.is_inference(out)


class _Dense(PredictModule):
    def predict_forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.predict_module(batch["x"])


def test_quantize_dense_halves_dense_children() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.randn(2, 4)
    want = model(x)
    module = quantize_dense(_Dense(model), torch.half)
    out = module({"x": x})
    assert out.dtype == torch.float16 and model[0].weight.dtype == torch.float16
    torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="torch.half only"):
        quantize_dense(_Dense(model), torch.int8)


def test_shard_modules_with_a_table_wise_plan() -> None:
    from lightrec.distributed.quant_embeddingbag import (
        QuantEmbeddingBagCollectionSharder,
        ShardedQuantEmbeddingBagCollection,
    )
    from lightrec.distributed.shard import _shard_modules
    from lightrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
    from lightrec.distributed.types import ShardingEnv, ShardingPlan

    model = quantize_embeddings(dlrm(), dtype=torch.qint8, inplace=False)
    dense, features = torch.randn(5, 5), kjt(seed=4)
    want = model(dense, features)
    ebc = model.sparse_arch.embedding_bag_collection
    path = "sparse_arch.embedding_bag_collection"
    plan = ShardingPlan({path: construct_module_sharding_plan(
        ebc, {"t0": table_wise(1), "t1": table_wise(0), "t2": table_wise(1)}, world_size=2)})  # fmt: skip
    sharded = _shard_modules(model, env=ShardingEnv.from_local(2, 0), device="cpu", plan=plan,
                             sharders=[QuantEmbeddingBagCollectionSharder()])  # fmt: skip
    collection = sharded.sparse_arch.embedding_bag_collection
    assert isinstance(collection, ShardedQuantEmbeddingBagCollection)
    torch.testing.assert_close(sharded(dense, features), want, rtol=0, atol=0)
    bad = ShardingPlan({path: construct_module_sharding_plan(
        quantize_embeddings(dlrm(), dtype=torch.qint8, inplace=False).sparse_arch.embedding_bag_collection,
        {"t0": row_wise()}, world_size=2)})  # fmt: skip
    with pytest.raises(ValueError, match="table 't0' is planned row_wise"):
        _shard_modules(quantize_embeddings(dlrm(), dtype=torch.qint8, inplace=False), env=ShardingEnv.from_local(2, 0),
                       plan=bad)  # fmt: skip
    with pytest.raises(TypeError, match="takes QuantEmbeddingBagCollectionSharder"):
        _shard_modules(model, sharders=[object()])  # type: ignore[list-item]
