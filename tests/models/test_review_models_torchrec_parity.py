"""DLRM family, DLRMTrain and TwoTower against plain nn.EmbeddingBag / F.linear references and torchrec's API.

The references load the models' state dicts by torchrec's key names (the DLRM family's are
torchrec's; TwoTower's are lightrec's own, see ``lightrec.models.two_tower``) into
``nn.EmbeddingBag(mode="sum")`` and explicit matrix products written here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightrec.models import DLRM, DLRM_DCN, DLRM_Projection, DLRMTrain, TwoTower, TwoTowerTrainTask
from lightrec.modules import EmbeddingBagCollection, EmbeddingBagConfig
from lightrec.sparse import KeyedJaggedTensor
from tests.models.helpers import FakeBatch

B, D, NUM_DENSE = 5, 4, 3


def _tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="t0", num_embeddings=11, embedding_dim=D, feature_names=["f0", "f1"]),
        EmbeddingBagConfig(name="t1", num_embeddings=7, embedding_dim=D, feature_names=["f2"]),
    ]


def _kjt(g: torch.Generator) -> KeyedJaggedTensor:
    lengths = torch.randint(0, 3, (3 * B,), generator=g)
    lengths[B + 1] = 0  # an empty bag
    caps = torch.tensor([11] * (2 * B) + [7] * B)
    values = torch.cat([torch.randint(0, int(c), (int(n),), generator=g) for c, n in zip(caps, lengths, strict=True)])
    return KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=values, lengths=lengths)


def _pooled(sd: dict[str, torch.Tensor], prefix: str, kjt: KeyedJaggedTensor) -> list[torch.Tensor]:
    """``[B, D]`` per feature (f0, f1 from t0, f2 from t1) through ``nn.EmbeddingBag(mode="sum")``."""
    out = []
    for feature, table in (("f0", "t0"), ("f1", "t0"), ("f2", "t1")):
        bag = nn.EmbeddingBag.from_pretrained(sd[f"{prefix}embedding_bags.{table}.weight"], mode="sum")
        jt = kjt[feature]
        out.append(bag(jt.values(), jt.offsets()[:-1]))
    return out


def _mlp(sd: dict[str, torch.Tensor], prefix: str, n: int, x: torch.Tensor) -> torch.Tensor:
    for i in range(n):
        x = torch.relu(F.linear(x, sd[f"{prefix}_mlp.{i}._linear.weight"], sd[f"{prefix}_mlp.{i}._linear.bias"]))
    return x


def _over(sd: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    x = _mlp(sd, "over_arch.model.0.", 1, x)
    return F.linear(x, sd["over_arch.model.1.weight"], sd["over_arch.model.1.bias"])


@pytest.mark.parametrize("kind", ["dot", "dcn", "projection"])
def test_dlrm_family_matches_plain_embeddingbag_reference(kind: str) -> None:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(_tables())
    if kind == "dot":
        model: nn.Module = DLRM(ebc, NUM_DENSE, [6, D], [5, 1])
    elif kind == "dcn":
        model = DLRM_DCN(ebc, NUM_DENSE, [6, D], [5, 1], dcn_num_layers=2, dcn_low_rank_dim=3)
    else:
        model = DLRM_Projection(ebc, NUM_DENSE, [6, D], [5, 1], [8, 2 * D], [8, 3 * D])
    for p in model.parameters():  # non-zero biases everywhere, so a dropped bias shows
        nn.init.normal_(p, std=0.5)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    dense, kjt = torch.randn(B, NUM_DENSE, generator=g), _kjt(g)

    d = _mlp(sd, "dense_arch.model.", 2, dense)
    x = torch.stack([d, *_pooled(sd, "sparse_arch.embedding_bag_collection.", kjt)], dim=1)  # [B, F+1, D]
    if kind == "dot":
        gram = x @ x.transpose(1, 2)
        pairs = [gram[:, i, j] for i in range(4) for j in range(i + 1, 4)]  # torchrec's triu order
        inter = torch.cat([d, torch.stack(pairs, dim=1)], dim=1)
    elif kind == "dcn":
        x0 = xl = x.flatten(1)
        for layer in range(2):
            w, v = sd[f"inter_arch.crossnet.W_kernels.{layer}"], sd[f"inter_arch.crossnet.V_kernels.{layer}"]
            xl = x0 * ((xl @ v.t()) @ w.t() + sd[f"inter_arch.crossnet.bias.{layer}"].reshape(-1)) + xl
        inter = xl
    else:
        flat = x.flatten(1)
        p1 = _mlp(sd, "inter_arch.interaction_branch1.model.", 2, flat).reshape(B, 2, D)
        p2 = _mlp(sd, "inter_arch.interaction_branch2.model.", 2, flat).reshape(B, D, 3)
        inter = torch.cat([d, (p1 @ p2).flatten(1)], dim=1)
    torch.testing.assert_close(model(dense, kjt), _over(sd, inter))


def test_dlrm_train_takes_torchrecs_dlrm_module_keyword() -> None:
    """torchrec's ``DLRMTrain(dlrm_module=...)``: lightrec named the argument ``dlrm`` (TypeError)."""
    torch.manual_seed(0)
    model = DLRM(EmbeddingBagCollection(_tables()), NUM_DENSE, [6, D], [5, 1])
    task = DLRMTrain(dlrm_module=model)
    assert task.model is model
    g = torch.Generator().manual_seed(2)
    dense, kjt = torch.randn(B, NUM_DENSE, generator=g), _kjt(g)
    labels = torch.tensor([1, 0, 1, 1, 0])
    loss, (detached, logits, got_labels) = task(FakeBatch(dense, kjt, labels))
    want = F.binary_cross_entropy_with_logits(model(dense, kjt).squeeze(1), labels.float())
    torch.testing.assert_close(loss, want)
    assert logits.shape == (B,) and torch.equal(got_labels, labels) and not detached.requires_grad
    with pytest.raises(TypeError, match=r"dlrm_module=.*must be an nn.Module, got function"):
        DLRMTrain(dlrm_module=lambda d, s: d)  # type: ignore[arg-type]


def test_two_tower_matches_plain_reference_and_documented_keys() -> None:
    """Each tower: ReLU MLP then a linear last layer (torchrec's example ReLUs the last layer too)."""
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(name="t0", num_embeddings=11, embedding_dim=D, feature_names=["f0", "f1"]),
        EmbeddingBagConfig(name="t1", num_embeddings=7, embedding_dim=D, feature_names=["f2"]),
    ]
    model = TwoTower(EmbeddingBagCollection(tables), [6, 5])
    assert model.query_feature_names == ["f0", "f1"] and model.candidate_feature_names == ["f2"]
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    assert {k for k in sd if k.startswith("query_proj.")} == {
        "query_proj.0._mlp.0._linear.weight", "query_proj.0._mlp.0._linear.bias",
        "query_proj.1.weight", "query_proj.1.bias",
    }  # fmt: skip
    g = torch.Generator().manual_seed(3)
    kjt = _kjt(g)
    f0, f1, f2 = _pooled(sd, "ebc.", kjt)

    def tower(name: str, x: torch.Tensor) -> torch.Tensor:
        h = _mlp(sd, f"{name}.0.", 1, x)
        return F.linear(h, sd[f"{name}.1.weight"], sd[f"{name}.1.bias"])

    query, candidate = model(kjt)
    torch.testing.assert_close(query, tower("query_proj", torch.cat([f0, f1], dim=1)))
    torch.testing.assert_close(candidate, tower("candidate_proj", f2))
    loss, (_, logits, targets) = TwoTowerTrainTask(model, temperature=0.5)(FakeBatch(None, kjt, None))
    ref_logits = tower("query_proj", torch.cat([f0, f1], dim=1)) @ tower("candidate_proj", f2).t() / 0.5
    torch.testing.assert_close(logits, ref_logits)
    torch.testing.assert_close(loss, F.cross_entropy(ref_logits, torch.arange(B)))
    assert torch.equal(targets, torch.arange(B))
