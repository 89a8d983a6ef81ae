"""torchrec's collection semantics: extra keys ignored, shared features, ``tables=[]``,
``need_indices``, variable-batch KJTs, and fx-traced collections that script.

No `from __future__ import annotations`: fx copies forward() annotations into generated code.
"""

import pytest
import torch
from torch import nn

from lightrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
)
from lightrec.modules import FeatureKeyError
from lightrec.modules.feature_checks import set_strict_checks, strict_checks, strict_checks_enabled
from lightrec.quant import QuantEmbeddingBagCollection


def _bag_tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=3, feature_names=["a", "b"]),
        EmbeddingBagConfig(name="t1", num_embeddings=6, embedding_dim=2, feature_names=["c"]),
    ]


def _kjt(keys: list[str]) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(len(keys))
    lengths = torch.randint(0, 3, (len(keys) * 2,), generator=g)
    values = torch.randint(0, 6, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)


def _reference_pool(weight: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Plain-PyTorch SUM pooling: one row per bag."""
    return torch.stack([weight[chunk].sum(0) for chunk in torch.split(ids, lengths.tolist())])


def test_extra_keys_are_ignored_unless_strict() -> None:
    ebc = EmbeddingBagCollection(_bag_tables())
    batch = _kjt(["a", "zz", "b", "c"])
    expected = ebc(batch.permute([0, 2, 3]))
    torch.testing.assert_close(ebc(batch).values(), expected.values())
    quant = QuantEmbeddingBagCollection.from_float(ebc, "fp16")
    torch.testing.assert_close(quant(batch).values(), quant(batch.permute([0, 2, 3])).values())
    ec = EmbeddingCollection([EmbeddingConfig(name="t", num_embeddings=10, embedding_dim=2, feature_names=["a"])])
    assert list(ec(batch)) == ["a"]
    with strict_checks(), pytest.raises(FeatureKeyError, match=r"unknown features \['zz'\]"):
        ebc(batch)
    assert not strict_checks_enabled()
    with pytest.raises(FeatureKeyError, match=r"missing features \['c'\]"):  # protective: always on
        ebc(_kjt(["a", "b"]))


def test_set_strict_checks_is_process_wide_and_typed() -> None:
    try:
        set_strict_checks(True)
        with pytest.raises(ValueError, match="at least one table"):
            EmbeddingBagCollection([])
    finally:
        set_strict_checks(False)
    with pytest.raises(TypeError, match="takes a bool"):
        set_strict_checks("yes")  # type: ignore[arg-type]


def test_feature_read_by_two_tables_pools_once_per_table() -> None:
    tables = [
        EmbeddingBagConfig(name="small", num_embeddings=6, embedding_dim=2, feature_names=["a"]),
        EmbeddingBagConfig(name="big", num_embeddings=6, embedding_dim=4, feature_names=["a", "c"]),
    ]
    ebc = EmbeddingBagCollection(tables)
    assert ebc.embedding_names() == ["a@small", "a@big", "c"]
    batch = _kjt(["a", "c"])
    out = ebc(batch)
    a = batch["a"]
    torch.testing.assert_close(out["a@small"], _reference_pool(ebc.embedding_bags["small"].weight, a.values(), a.lengths()))
    torch.testing.assert_close(out["a@big"], _reference_pool(ebc.embedding_bags["big"].weight, a.values(), a.lengths()))
    with strict_checks(), pytest.raises(ValueError, match="listed by tables 'small' and 'big'"):
        EmbeddingBagCollection(tables)


def test_empty_collections() -> None:
    ebc = EmbeddingBagCollection([])
    out = ebc(_kjt(["a"]))
    assert out.keys() == [] and out.values().shape == (2, 0) and ebc.device == torch.device("cpu")
    assert EmbeddingCollection([])(_kjt(["a"])) == {}


def test_embedding_collection_need_indices_returns_the_ids_as_weights() -> None:
    ec = EmbeddingCollection(
        [EmbeddingConfig(name="t", num_embeddings=10, embedding_dim=2, feature_names=["a", "b"])], need_indices=True
    )
    batch = _kjt(["a", "b"])
    out = ec(batch)
    assert torch.equal(out["b"].weights(), batch["b"].values())
    torch.testing.assert_close(out["b"].values(), ec.embeddings["t"].weight[batch["b"].values()])


def _vbe_batch(weighted: bool = False) -> KeyedJaggedTensor:
    """``a`` and ``c`` are read once per user (2 users), ``b`` per impression (3 rows)."""
    return KeyedJaggedTensor(
        keys=["a", "b", "c"],
        values=torch.tensor([1, 2, 3, 4, 5, 0, 5, 5, 1]),
        lengths=torch.tensor([2, 1, 0, 2, 1, 2, 1]),
        weights=torch.rand(9) if weighted else None,
        stride_per_key_per_rank=[[2], [3], [2]],
        inverse_indices=(["a", "b", "c"], torch.tensor([[0, 1, 1], [0, 1, 2], [1, 0, 0]])),
    )


@pytest.mark.parametrize("weighted", [False, True])
def test_variable_batch_through_ebc_equals_the_expanded_batch(weighted: bool) -> None:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(_bag_tables(), is_weighted=weighted)
    vbe = _vbe_batch(weighted)
    out = ebc(vbe)
    assert out.values().shape == (3, 3 + 3 + 2)
    torch.testing.assert_close(out.values(), ebc(vbe.to_fixed_batch()).values())
    # by hand for feature a (rows 0, 1, 1 of its 2 user bags)
    w = ebc.embedding_bags["t0"].weight
    user_bags = [w[[1, 2]].sum(0), w[[3]].sum(0)] if not weighted else None
    if user_bags is not None:
        torch.testing.assert_close(out["a"], torch.stack([user_bags[0], user_bags[1], user_bags[1]]))


def test_variable_batch_through_ebc_backward_matches_expanded() -> None:
    ebc = EmbeddingBagCollection(_bag_tables())
    ebc(_vbe_batch()).values().sum().backward()
    grads = [p.grad.clone() for p in ebc.parameters()]
    ebc.zero_grad()
    ebc(_vbe_batch().to_fixed_batch()).values().sum().backward()
    for g, p in zip(grads, ebc.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)


def test_variable_batch_without_inverse_indices_is_a_clear_error() -> None:
    kjt = KeyedJaggedTensor(
        keys=["a", "b", "c"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 0, 1, 0]),
        stride_per_key_per_rank=[[2], [1], [2]],
    )  # fmt: skip
    with pytest.raises(ValueError, match="without inverse_indices"):
        EmbeddingBagCollection(_bag_tables())(kjt)


def test_variable_batch_through_embedding_collection_keeps_each_batch() -> None:
    ec = EmbeddingCollection([EmbeddingConfig(name="t", num_embeddings=10, embedding_dim=2, feature_names=["a", "b", "c"])])
    out = ec(_vbe_batch())
    assert out["a"].lengths().tolist() == [2, 1] and out["b"].lengths().tolist() == [0, 2, 1]
    torch.testing.assert_close(out["c"].values(), ec.embeddings["t"].weight[torch.tensor([5, 5, 1])])


def test_fx_traced_collection_scripts_directly() -> None:
    """Issue 17: symbolic_trace(EBC) then torch.jit.script (no wrapper module)."""
    ebc = EmbeddingBagCollection(_bag_tables())
    scripted = torch.jit.script(torch.fx.symbolic_trace(ebc))
    batch = _kjt(["a", "b", "c"])
    torch.testing.assert_close(scripted(batch).values(), ebc(batch).values())
    ec = EmbeddingCollection([EmbeddingConfig(name="t", num_embeddings=10, embedding_dim=2, feature_names=["a"])])
    scripted_ec = torch.jit.script(torch.fx.symbolic_trace(ec))
    torch.testing.assert_close(scripted_ec(_kjt(["a"]))["a"].values(), ec(_kjt(["a"]))["a"].values())


class _TwoCollections(nn.Module):
    """A model whose collections are fed from one KJT (what extra-key leniency is for)."""

    def __init__(self) -> None:
        super().__init__()
        self.user = EmbeddingBagCollection([EmbeddingBagConfig(name="u", num_embeddings=6, embedding_dim=2, feature_names=["a"])])
        self.item = EmbeddingBagCollection([EmbeddingBagConfig(name="i", num_embeddings=6, embedding_dim=2, feature_names=["c"])])

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.user(features).values() * self.item(features).values()


def test_two_collections_fed_from_one_kjt_trace_and_script() -> None:
    model = _TwoCollections()
    batch = _kjt(["a", "b", "c"])
    expected = model(batch)
    torch.testing.assert_close(torch.jit.script(torch.fx.symbolic_trace(model))(batch), expected)


def test_quantized_collections_name_and_pool_shared_features_like_the_float_ones() -> None:
    from lightrec.quant import QuantEmbeddingCollection

    torch.manual_seed(0)
    bags = EmbeddingBagCollection([
        EmbeddingBagConfig(name="small", num_embeddings=6, embedding_dim=4, feature_names=["a"]),
        EmbeddingBagConfig(name="big", num_embeddings=6, embedding_dim=8, feature_names=["a", "c"]),
    ])  # fmt: skip
    seqs = EmbeddingCollection([
        EmbeddingConfig(name="s", num_embeddings=6, embedding_dim=4, feature_names=["a"]),
        EmbeddingConfig(name="b", num_embeddings=6, embedding_dim=4, feature_names=["a", "c"]),
    ])  # fmt: skip
    batch = _kjt(["a", "c", "zz"])
    pooled, quant_pooled = bags(batch), QuantEmbeddingBagCollection.from_float(bags, "fp16")(batch)
    assert quant_pooled.keys() == pooled.keys() == ["a@small", "a@big", "c"]
    torch.testing.assert_close(quant_pooled.values(), pooled.values(), atol=1e-2, rtol=1e-2)
    rows, quant_rows = seqs(batch), QuantEmbeddingCollection.from_float(seqs, "fp16")(batch)
    assert list(quant_rows) == list(rows) == ["a@s", "a@b", "c"]
    for key in rows:
        torch.testing.assert_close(quant_rows[key].values(), rows[key].values(), atol=1e-2, rtol=1e-2)
