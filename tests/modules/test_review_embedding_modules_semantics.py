"""Review of the unsharded embedding modules against torchrec's semantics and plain PyTorch.

Every reference below is written with ``nn.EmbeddingBag`` / ``nn.Embedding`` / ``torch.optim`` on
copies of the collection's weights, independent of lightrec's lookup code.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from lightrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
    PoolingType,
)
from lightrec.modules.feature_processor_ import PositionWeightedModule, PositionWeightedModuleCollection
from lightrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from lightrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

# keys in an order other than the tables': h | g | f, batch 2; f is read by two tables
#   h: [1, 2], []      g: [3], [4, 5, 6]      f: [], [7, 1]
_KEYS = ["h", "g", "f"]
_VALUES = torch.tensor([1, 2, 3, 4, 5, 6, 7, 1])
_LENGTHS = torch.tensor([2, 0, 1, 3, 0, 2])
_WEIGHTS = torch.tensor([0.5, 2.0, 3.0, 1.0, 0.25, 4.0, 1.5, 0.75])


def _kjt(weighted: bool = False) -> KeyedJaggedTensor:
    return KeyedJaggedTensor.from_lengths_sync(
        keys=_KEYS, values=_VALUES, lengths=_LENGTHS, weights=_WEIGHTS if weighted else None
    )


def _bag_tables(pooling: PoolingType = PoolingType.SUM) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(num_embeddings=10, embedding_dim=3, name="a", feature_names=["f", "g"], pooling=pooling),
        EmbeddingBagConfig(num_embeddings=8, embedding_dim=2, name="b", feature_names=["h", "f"]),
    ]


# --- configs -----------------------------------------------------------------------------------


def test_config_accepts_num_embeddings_post_pruning_like_torchrec() -> None:
    config = EmbeddingBagConfig(
        num_embeddings=100, embedding_dim=4, name="t", feature_names=["f"], num_embeddings_post_pruning=60
    )
    assert config.num_embeddings_post_pruning == 60
    assert EmbeddingConfig(num_embeddings=5, embedding_dim=2, name="t").num_embeddings_post_pruning is None


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_config_rejects_a_bad_num_embeddings_post_pruning(bad: object) -> None:
    with pytest.raises(ValueError, match="num_embeddings_post_pruning.*positive int"):
        EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="t", num_embeddings_post_pruning=bad)  # type: ignore[arg-type]


def test_config_num_features_is_a_method_like_torchrec() -> None:
    config = EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="t", feature_names=["f", "g"])
    assert config.num_features() == 2


def test_weight_init_min_defaults_to_minus_sqrt_one_over_rows_when_only_max_is_given() -> None:
    config = EmbeddingBagConfig(num_embeddings=100, embedding_dim=4, name="t", weight_init_max=0.5)
    assert config.get_weight_init_max() == 0.5
    assert config.get_weight_init_min() == pytest.approx(-math.sqrt(1 / 100))  # torchrec's default, not -0.5
    only_min = EmbeddingBagConfig(num_embeddings=100, embedding_dim=4, name="t", weight_init_min=-0.05)
    assert only_min.get_weight_init_max() == pytest.approx(math.sqrt(1 / 100))
    both = EmbeddingBagConfig(num_embeddings=4, embedding_dim=2, name="t")
    assert (both.get_weight_init_min(), both.get_weight_init_max()) == pytest.approx((-0.5, 0.5))


def test_default_init_draws_inside_the_config_range() -> None:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        [EmbeddingBagConfig(num_embeddings=400, embedding_dim=8, name="t", feature_names=["f"], weight_init_max=0.3)]
    )
    w = ebc.embedding_bags["t"].weight.detach()
    assert float(w.min()) >= -math.sqrt(1 / 400) and float(w.max()) <= 0.3
    assert float(w.max()) > 0.2  # the range reaches up to max, not to sqrt(1 / rows)


# --- EmbeddingBagCollection ----------------------------------------------------------------------


def _reference_pooled(ebc: EmbeddingBagCollection, kjt: KeyedJaggedTensor, weighted: bool) -> dict[str, torch.Tensor]:
    """Pooled rows per output key, with one nn.EmbeddingBag per (table, feature) over the same weights."""
    out: dict[str, torch.Tensor] = {}
    jts = kjt.to_dict()
    names = ebc.embedding_names()
    i = 0
    for table in ebc.embedding_bag_configs():
        weight = ebc.embedding_bags[table.name].weight
        for f in table.feature_names:
            jt = jts[f]
            offsets = jt.offsets()[:-1]
            if weighted:
                bag = nn.EmbeddingBag(table.num_embeddings, table.embedding_dim, mode="sum")
                bag.weight = weight
                pooled = bag(jt.values(), offsets, per_sample_weights=jt.weights())
                if table.pooling == PoolingType.MEAN:  # fbgemm's weighted mean: divide by the ids per bag
                    pooled = pooled / jt.lengths().clamp(min=1).unsqueeze(1)
            else:
                mode = "mean" if table.pooling == PoolingType.MEAN else "sum"
                bag = nn.EmbeddingBag(table.num_embeddings, table.embedding_dim, mode=mode)
                bag.weight = weight
                pooled = bag(jt.values(), offsets)
            out[names[i]] = pooled
            i += 1
    return out


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
@pytest.mark.parametrize("weighted", [False, True])
def test_ebc_shared_feature_matches_embedding_bag_values_and_grads(pooling: PoolingType, weighted: bool) -> None:
    torch.manual_seed(1)
    ebc = EmbeddingBagCollection(_bag_tables(pooling), is_weighted=weighted)
    kjt = _kjt(weighted)
    kt = ebc(kjt)
    assert kt.keys() == ["f@a", "g", "h", "f@b"]
    assert kt.length_per_key() == [3, 3, 2, 2]
    assert kt.values().shape == (2, 10)
    got = kt.to_dict()
    ref = _reference_pooled(ebc, kjt, weighted)
    assert got.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(got[k], ref[k])
    # the empty bags pool to zeros: f of sample 0, h of sample 1
    assert torch.count_nonzero(got["f@a"][0]) == 0 and torch.count_nonzero(got["h"][1]) == 0
    # gradients: same loss through the collection and the reference
    probe = torch.randn(kt.values().shape)
    grads = torch.autograd.grad((kt.values() * probe).sum(), list(ebc.parameters()))
    ref_values = torch.cat([ref[k] for k in kt.keys()], dim=1)
    ref_grads = torch.autograd.grad((ref_values * probe).sum(), list(ebc.parameters()))
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)


def test_ebc_on_meta_materialised_and_reset_runs_init_fn() -> None:
    def fill(w: torch.Tensor) -> None:
        w.copy_(torch.arange(w.numel(), dtype=w.dtype).view_as(w))

    tables = [EmbeddingBagConfig(num_embeddings=4, embedding_dim=2, name="t", feature_names=["f"], init_fn=fill)]
    ebc = EmbeddingBagCollection(tables, device="meta")
    assert ebc.device.type == "meta"
    ebc.to_empty(device="cpu")
    ebc.reset_parameters()
    torch.testing.assert_close(ebc.embedding_bags["t"].weight.detach(), torch.arange(8.0).view(4, 2))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=torch.tensor([3, 1]), lengths=torch.tensor([2]))
    torch.testing.assert_close(ebc(kjt).values().detach(), torch.tensor([[8.0, 10.0]]))


def test_ebc_int32_offsets_only_kjt_matches_int64_lengths_kjt() -> None:
    torch.manual_seed(2)
    ebc = EmbeddingBagCollection(_bag_tables())
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(_LENGTHS, 0)])
    kjt32 = KeyedJaggedTensor(keys=_KEYS, values=_VALUES.int(), offsets=offsets.int())
    torch.testing.assert_close(ebc(kjt32).values(), ebc(_kjt()).values())


# --- EmbeddingCollection -------------------------------------------------------------------------


@pytest.mark.parametrize("need_indices", [False, True])
def test_ec_shared_feature_matches_embedding(need_indices: bool) -> None:
    torch.manual_seed(3)
    tables = [
        EmbeddingConfig(num_embeddings=10, embedding_dim=3, name="a", feature_names=["f", "g"]),
        EmbeddingConfig(num_embeddings=8, embedding_dim=3, name="b", feature_names=["h", "f"]),
    ]
    ec = EmbeddingCollection(tables, need_indices=need_indices)
    assert ec.embedding_names_by_table() == [["f@a", "g"], ["h", "f@b"]]
    assert ec.need_indices() is need_indices and ec.embedding_dim() == 3
    out = ec(_kjt())
    assert list(out) == ["f@a", "g", "h", "f@b"]
    jts = _kjt().to_dict()
    for key, table, feature in [("f@a", "a", "f"), ("g", "a", "g"), ("h", "b", "h"), ("f@b", "b", "f")]:
        emb = nn.Embedding(tables[0].num_embeddings if table == "a" else 8, 3)
        emb.weight = ec.embeddings[table].weight
        torch.testing.assert_close(out[key].values(), emb(jts[feature].values()))
        assert torch.equal(out[key].lengths(), jts[feature].lengths())
        if need_indices:
            assert torch.equal(out[key].weights(), jts[feature].values())
        else:
            assert out[key].weights_or_none() is None


# --- feature processors --------------------------------------------------------------------------


@pytest.mark.parametrize("as_collection", [False, True])
def test_fp_ebc_position_weights_match_manual_weighted_sum(as_collection: bool) -> None:
    torch.manual_seed(4)
    tables = [
        EmbeddingBagConfig(num_embeddings=10, embedding_dim=3, name="a", feature_names=["f", "g"]),
        EmbeddingBagConfig(num_embeddings=8, embedding_dim=2, name="b", feature_names=["h"]),
    ]
    ebc = EmbeddingBagCollection(tables, is_weighted=True)
    lengths = {"f": 3, "g": 3, "h": 2}
    if as_collection:
        processors = PositionWeightedModuleCollection(lengths)
        pw = dict(processors.position_weights.items())
        fp = FeatureProcessedEmbeddingBagCollection(ebc, processors)
    else:
        modules = {k: PositionWeightedModule(n) for k, n in lengths.items()}
        pw = {k: m.position_weight for k, m in modules.items()}
        fp = FeatureProcessedEmbeddingBagCollection(ebc, modules)  # type: ignore[arg-type]
    with torch.no_grad():
        for p in pw.values():
            p.copy_(torch.rand_like(p) + 0.5)
    # input weights are replaced by the position weights
    out = fp(_kjt(weighted=True)).to_dict()
    wa, wb = ebc.embedding_bags["a"].weight, ebc.embedding_bags["b"].weight
    torch.testing.assert_close(out["f"], torch.stack([torch.zeros(3), wa[7] * pw["f"][0] + wa[1] * pw["f"][1]]))
    torch.testing.assert_close(
        out["g"], torch.stack([wa[3] * pw["g"][0], wa[4] * pw["g"][0] + wa[5] * pw["g"][1] + wa[6] * pw["g"][2]])
    )
    torch.testing.assert_close(out["h"], torch.stack([wb[1] * pw["h"][0] + wb[2] * pw["h"][1], torch.zeros(2)]))
    # the position weights learn: d(sum of g's pooled row 1)/d pw_g[k] = sum of the row at position k
    (grad,) = torch.autograd.grad(out["g"][1].sum(), [pw["g"]])
    torch.testing.assert_close(grad, torch.stack([wa[4].sum(), wa[5].sum(), wa[6].sum()]).detach())


# --- FusedEmbeddingBagCollection -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("optimizer", "kwargs"),
    [(torch.optim.SGD, {"lr": 0.1}), (torch.optim.Adagrad, {"lr": 0.1}), (torch.optim.Adam, {"lr": 0.01})],
)
def test_fused_ebc_forward_and_steps_match_ebc_with_torch_optim(optimizer: type, kwargs: dict[str, float]) -> None:
    torch.manual_seed(5)
    tables = [
        EmbeddingBagConfig(num_embeddings=10, embedding_dim=3, name="a", feature_names=["f", "g"],
                           pooling=PoolingType.MEAN),
        EmbeddingBagConfig(num_embeddings=8, embedding_dim=2, name="b", feature_names=["h"]),
    ]  # fmt: skip
    ebc = EmbeddingBagCollection(tables)
    fused = FusedEmbeddingBagCollection(tables, optimizer, kwargs, kernel_backend="torch")
    fused.load_state_dict(ebc.state_dict())
    opt = optimizer(ebc.parameters(), **kwargs)
    kjt = _kjt()
    for _ in range(3):
        want, got = ebc(kjt), fused(kjt)
        assert got.keys() == want.keys() and got.length_per_key() == want.length_per_key()
        torch.testing.assert_close(got.values(), want.values())
        opt.zero_grad()
        (want.values() ** 2).sum().backward()
        opt.step()
        (got.values() ** 2).sum().backward()
    state = fused.state_dict()
    for key, value in ebc.state_dict().items():
        torch.testing.assert_close(state[key], value)


def test_fused_ebc_state_dict_keys_equal_ebc_keys() -> None:
    tables = _bag_tables()[:1]
    ebc = EmbeddingBagCollection(copy.deepcopy(tables))
    fused = FusedEmbeddingBagCollection(tables, torch.optim.SGD, {"lr": 0.1}, kernel_backend="torch")
    assert list(fused.state_dict()) == list(ebc.state_dict())
