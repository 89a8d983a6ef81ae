"""Feature processors and FeatureProcessedEmbeddingBagCollection (unsharded): outputs and position
weight gradients against a plain-PyTorch formula, torchrec's state-dict keys, clear errors."""

from __future__ import annotations

import pytest
import torch

from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from lightrec.modules.feature_processor_ import (
    FeatureProcessorError,
    PositionWeightedModule,
    PositionWeightedModuleCollection,
    positions_in_bags,
)
from lightrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

TABLES = [
    EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f"]),
    EmbeddingBagConfig(name="t1", num_embeddings=7, embedding_dim=2, feature_names=["g"]),
]


def _kjt() -> KeyedJaggedTensor:
    # f: bags [1, 2], [3, 9]   g: bags [4], [5, 6, 0]
    return KeyedJaggedTensor(keys=["f", "g"], values=torch.tensor([1, 2, 3, 9, 4, 5, 6, 0]),
                             lengths=torch.tensor([2, 2, 1, 3]))  # fmt: skip


def _reference(weights: dict[str, torch.Tensor], pos: dict[str, torch.Tensor], tables: dict[str, torch.Tensor]) -> torch.Tensor:
    """Plain pooled sums: row b = sum_k pos[f][k] * table[id_k] per feature, concatenated."""
    bags = {"f": [[1, 2], [3, 9]], "g": [[4], [5, 6, 0]]}
    out = []
    for b in range(2):
        row = []
        for f, t in (("f", "t0"), ("g", "t1")):
            row.append(sum(pos[f][k] * tables[t][i] for k, i in enumerate(bags[f][b])))
        out.append(torch.cat(row))
    return torch.stack(out)


@pytest.mark.parametrize("kind", ["dict", "collection"])
def test_position_weighted_pooling_and_gradients(kind: str) -> None:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(TABLES, is_weighted=True)
    processors = ({"f": PositionWeightedModule(3), "g": PositionWeightedModule(4)} if kind == "dict"
                  else PositionWeightedModuleCollection({"f": 3, "g": 4}))  # fmt: skip
    fp = FeatureProcessedEmbeddingBagCollection(ebc, processors)
    params = dict(fp.named_parameters())
    pos_keys = {f: next(k for k in params if k.endswith(f"{f}.position_weight") or k.endswith(f"position_weights.{f}"))
                for f in ("f", "g")}  # fmt: skip
    with torch.no_grad():
        for key in pos_keys.values():
            params[key].copy_(torch.arange(1.0, 1.0 + params[key].numel()) * 0.5)
    ref_pos = {f: params[k].detach().clone().requires_grad_(True) for f, k in pos_keys.items()}
    ref_tables = {t: ebc.embedding_bags[t].weight.detach().clone().requires_grad_(True) for t in ("t0", "t1")}
    scale = torch.randn(2, 6)
    out = fp(_kjt())
    assert out.keys() == ["f", "g"]
    (out.values() * scale).sum().backward()
    want = _reference(ref_pos, ref_pos, ref_tables)
    (want * scale).sum().backward()
    torch.testing.assert_close(out.values(), want)
    for f, key in pos_keys.items():
        torch.testing.assert_close(params[key].grad, ref_pos[f].grad)
    torch.testing.assert_close(ebc.embedding_bags["t0"].weight.grad, ref_tables["t0"].grad)
    prefix = "_feature_processors.f.position_weight" if kind == "dict" else "_feature_processors.position_weights.f"
    assert {"_embedding_bag_collection.embedding_bags.t0.weight", prefix} <= set(fp.state_dict())


def test_collection_gives_weight_one_to_keys_without_processor() -> None:
    out = PositionWeightedModuleCollection({"g": 4})(_kjt())
    assert out.weights()[:4].tolist() == [1.0] * 4 and out.keys() == ["f", "g"]
    assert positions_in_bags(torch.tensor([2, 0, 3]), 5).tolist() == [0, 1, 0, 1, 2]


def test_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="is_weighted=True"):
        FeatureProcessedEmbeddingBagCollection(EmbeddingBagCollection(TABLES), {"f": PositionWeightedModule(2)})
    with pytest.raises(ValueError, match="reads \\['f', 'g'\\]"):
        FeatureProcessedEmbeddingBagCollection(EmbeddingBagCollection(TABLES, is_weighted=True),
                                               {"f": PositionWeightedModule(2)})  # fmt: skip
    with pytest.raises(FeatureProcessorError, match="feature 'g' has a bag of 3 ids .* max_feature_length=2"):
        PositionWeightedModuleCollection({"g": 2})(_kjt())
    with pytest.raises(ValueError, match="max_feature_length must be a positive int"):
        PositionWeightedModule(0)
