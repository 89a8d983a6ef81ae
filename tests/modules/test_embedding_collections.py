"""EmbeddingBagCollection / EmbeddingCollection against nn.EmbeddingBag / nn.Embedding."""

from __future__ import annotations

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
from lightrec.modules import EmbeddingIdError, FeatureKeyError
from lightrec.modules.feature_checks import strict_checks

B = 4


def _tables(pooling: PoolingType) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="t0", num_embeddings=11, embedding_dim=3, feature_names=["f0", "f1"], pooling=pooling),
        EmbeddingBagConfig(name="t1", num_embeddings=7, embedding_dim=5, feature_names=["f2"], pooling=pooling),
    ]


def _batch(weighted: bool, seed: int = 0, keys: tuple[str, ...] = ("f0", "f1", "f2")) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(keys) * B,), generator=g)
    lengths[1] = 0  # always an empty bag
    rows = {"f0": 11, "f1": 11, "f2": 7}
    values = []
    for k, key in enumerate(keys):
        n = int(lengths[k * B : (k + 1) * B].sum())
        values.append(torch.randint(0, rows.get(key, 5), (n,), generator=g))
    v = torch.cat(values)
    return KeyedJaggedTensor(
        keys=list(keys), values=v, lengths=lengths, weights=torch.rand(v.numel(), generator=g) if weighted else None
    )


def _reference_pooled(ebc: EmbeddingBagCollection, kjt: KeyedJaggedTensor, weighted: bool) -> torch.Tensor:
    """One nn.EmbeddingBag per feature, sharing the collection's weights."""
    outs = []
    for table in ebc.embedding_bag_configs():
        weight = ebc.embedding_bags[table.name].weight
        for f in table.feature_names:
            jt = kjt[f]
            if weighted and table.pooling == PoolingType.MEAN:
                bag = nn.EmbeddingBag.from_pretrained(weight, freeze=False, mode="sum")
                bag.weight = weight
                s = bag(jt.values(), jt.offsets()[:-1], per_sample_weights=jt.weights())
                outs.append(s / jt.lengths().clamp(min=1).unsqueeze(1))
                continue
            mode = "sum" if table.pooling == PoolingType.SUM else "mean"
            bag = nn.EmbeddingBag.from_pretrained(weight, freeze=False, mode=mode)
            bag.weight = weight  # share the parameter so gradients land on the collection's weight
            outs.append(bag(jt.values(), jt.offsets()[:-1], per_sample_weights=jt.weights() if weighted else None))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
@pytest.mark.parametrize("weighted", [False, True])
def test_ebc_forward_backward_match_embedding_bag(pooling: PoolingType, weighted: bool, device: torch.device) -> None:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(_tables(pooling), is_weighted=weighted, device=device)
    kjt = _batch(weighted).to(device)
    out = ebc(kjt)
    assert out.keys() == ["f0", "f1", "f2"] and out.length_per_key() == [3, 3, 5]
    assert out.values().device.type == device.type
    grad = torch.randn_like(out.values())
    out.values().backward(grad)
    got_grads = {n: p.grad.clone() for n, p in ebc.named_parameters()}
    ebc.zero_grad()
    ref = _reference_pooled(ebc, kjt, weighted)
    torch.testing.assert_close(out.values(), ref)
    ref.backward(grad)
    for n, p in ebc.named_parameters():
        torch.testing.assert_close(got_grads[n], p.grad, msg=n)
    assert set(got_grads) == {"embedding_bags.t0.weight", "embedding_bags.t1.weight"}


def test_ebc_accepts_keys_in_any_order(device: torch.device) -> None:
    ebc = EmbeddingBagCollection(_tables(PoolingType.SUM), device=device)
    kjt = _batch(False).to(device)
    shuffled = kjt.permute([2, 0, 1])
    torch.testing.assert_close(ebc(shuffled).values(), ebc(kjt).values())


def test_empty_batch_and_all_empty_bags() -> None:
    ebc = EmbeddingBagCollection(_tables(PoolingType.MEAN))
    empty = KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=torch.empty(0, dtype=torch.long),
                              lengths=torch.zeros(3 * B, dtype=torch.long))
    assert torch.equal(ebc(empty).values(), torch.zeros(B, 11))
    zero_batch = KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=torch.empty(0, dtype=torch.long),
                                   lengths=torch.zeros(0, dtype=torch.long))
    assert ebc(zero_batch).values().shape == (0, 11)


def test_feature_key_errors_list_missing_and_unknown() -> None:
    ebc = EmbeddingBagCollection(_tables(PoolingType.SUM))
    with pytest.raises(FeatureKeyError, match=r"missing features \['f2'\]\. The collection serves"):
        ebc(_batch(False, keys=("f0", "f1", "zz")))  # a missing feature is an error in every mode
    with strict_checks(), pytest.raises(FeatureKeyError, match=r"missing features \['f2'\]; unknown features \['zz'\]"):
        ebc(_batch(False, keys=("f0", "f1", "zz")))


@pytest.mark.parametrize("bad_id", [7, -1])
def test_out_of_range_ids_name_feature_table_and_id(bad_id: int, device: torch.device) -> None:
    ebc = EmbeddingBagCollection(_tables(PoolingType.SUM), device=device)
    kjt = KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=torch.tensor([1, 2, 3, bad_id]),
                            lengths=torch.tensor([1, 0, 1, 0, 0, 2])).to(device)
    with pytest.raises(EmbeddingIdError, match=rf"feature 'f2' \(sample 1\) has id {bad_id} but table 't1' has 7 rows"):
        ebc(kjt)


def test_bounds_check_clamp_and_skip(device: torch.device) -> None:
    tables = _tables(PoolingType.SUM)
    kjt = KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=torch.tensor([1, 2, 3, 9, 6]),
                            lengths=torch.tensor([1, 0, 1, 0, 0, 3])).to(device)
    clamp = EmbeddingBagCollection(tables, bounds_check="clamp", device=device)
    skip = EmbeddingBagCollection(tables, bounds_check="skip", device=device)
    skip.load_state_dict(clamp.state_dict())
    w = clamp.embedding_bags["t1"].weight
    torch.testing.assert_close(clamp(kjt)["f2"][1], w[3] + w[6] + w[6])
    torch.testing.assert_close(skip(kjt)["f2"][1], w[3] + w[6])
    with pytest.raises(ValueError, match="bounds_check must be one of"):
        EmbeddingBagCollection(tables, bounds_check="ignore")


def test_weighted_collection_needs_weights() -> None:
    ebc = EmbeddingBagCollection(_tables(PoolingType.SUM), is_weighted=True)
    with pytest.raises(ValueError, match="needs per-id weights"):
        ebc(_batch(False))


@pytest.mark.parametrize(
    "tables, match",
    [
        ([], "at least one table"),
        ([EmbeddingBagConfig(name="a", num_embeddings=2, embedding_dim=2, feature_names=["x"]),
          EmbeddingBagConfig(name="a", num_embeddings=2, embedding_dim=2, feature_names=["y"])], "duplicated"),
        ([EmbeddingBagConfig(name="a", num_embeddings=2, embedding_dim=2, feature_names=["x"]),
          EmbeddingBagConfig(name="b", num_embeddings=2, embedding_dim=2, feature_names=["x"])], "exactly one table"),
        ([EmbeddingBagConfig(name="a", num_embeddings=2, embedding_dim=2, feature_names=[])], "no feature_names"),
    ],
)
def test_bad_table_lists(tables: list, match: str) -> None:
    with strict_checks(), pytest.raises(ValueError, match=match):  # some are errors only when strict
        EmbeddingBagCollection(tables)


def test_bad_configs() -> None:
    with pytest.raises(ValueError, match="num_embeddings of table 'a' must be a positive int, got 0"):
        EmbeddingBagConfig(name="a", num_embeddings=0, embedding_dim=2, feature_names=["x"])
    with pytest.raises(TypeError, match="write feature_names=\\['x'\\]"):
        EmbeddingBagConfig(name="a", num_embeddings=2, embedding_dim=2, feature_names="x")
    with pytest.raises(ValueError, match="use EmbeddingConfig"):
        EmbeddingBagConfig(name="a", num_embeddings=2, embedding_dim=2, feature_names=["x"], pooling=PoolingType.NONE)


def test_meta_device_allocates_nothing_and_init_ranges() -> None:
    big = EmbeddingBagConfig(name="big", num_embeddings=10**10, embedding_dim=128, feature_names=["f"])
    ebc = EmbeddingBagCollection([big], device="meta")
    assert ebc.embedding_bags["big"].weight.is_meta and ebc.device.type == "meta"
    ec = EmbeddingCollection([EmbeddingConfig(name="big", num_embeddings=10**10, embedding_dim=128, feature_names=["f"])],
                             device="meta")
    assert ec.embeddings["big"].weight.is_meta
    cfg = EmbeddingBagConfig(name="t", num_embeddings=100, embedding_dim=4, feature_names=["f"],
                             weight_init_min=0.5, weight_init_max=0.6)
    w = EmbeddingBagCollection([cfg]).embedding_bags["t"].weight
    assert float(w.min()) >= 0.5 and float(w.max()) <= 0.6
    custom = EmbeddingBagConfig(name="t", num_embeddings=3, embedding_dim=2, feature_names=["f"],
                                init_fn=lambda w: w.fill_(7.0))
    assert torch.equal(EmbeddingBagCollection([custom]).embedding_bags["t"].weight, torch.full((3, 2), 7.0))


def test_ec_matches_embedding_per_id(device: torch.device) -> None:
    torch.manual_seed(0)
    tables = [
        EmbeddingConfig(name="t0", num_embeddings=11, embedding_dim=4, feature_names=["f0", "f1"]),
        EmbeddingConfig(name="t1", num_embeddings=7, embedding_dim=4, feature_names=["f2"]),
    ]
    ec = EmbeddingCollection(tables, device=device)
    kjt = _batch(False).to(device)
    out = ec(kjt)
    assert list(out) == ["f0", "f1", "f2"]
    loss = sum((jt.values() * (i + 1)).sum() for i, jt in enumerate(out.values()))
    loss.backward()
    for name, table in (("f0", "t0"), ("f1", "t0"), ("f2", "t1")):
        emb = nn.Embedding.from_pretrained(ec.embeddings[table].weight.detach())
        torch.testing.assert_close(out[name].values(), emb(kjt[name].values()))
        assert torch.equal(out[name].lengths(), kjt[name].lengths())
    ref = torch.zeros_like(ec.embeddings["t0"].weight)
    ref.index_add_(0, kjt["f0"].values(), torch.ones(kjt["f0"].values().numel(), 4, device=device))
    ref.index_add_(0, kjt["f1"].values(), torch.full((kjt["f1"].values().numel(), 4), 2.0, device=device))
    torch.testing.assert_close(ec.embeddings["t0"].weight.grad, ref)
    with pytest.raises(EmbeddingIdError, match="table 't1' has 7 rows"):
        ec(KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=torch.tensor([8]), lengths=torch.tensor([0, 0, 0, 0, 0, 1])).to(device))


def test_table_names_that_clash_with_module_dict_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"table names \['items'\] cannot be used"):
        EmbeddingBagCollection([EmbeddingBagConfig(name="items", num_embeddings=2, embedding_dim=2, feature_names=["x"])])


def test_collections_script_directly() -> None:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(_tables(PoolingType.MEAN), is_weighted=True)
    kjt = _batch(True)
    torch.testing.assert_close(torch.jit.script(ebc)(kjt).values(), ebc(kjt).values())
    ec = EmbeddingCollection([EmbeddingConfig(name="t", num_embeddings=11, embedding_dim=3, feature_names=["f0", "f1"]),
                              EmbeddingConfig(name="u", num_embeddings=7, embedding_dim=3, feature_names=["f2"])])
    scripted = torch.jit.script(ec)(kjt)
    for name, jt in ec(kjt).items():
        torch.testing.assert_close(scripted[name].values(), jt.values())
