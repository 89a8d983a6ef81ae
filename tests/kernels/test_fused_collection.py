"""FusedEmbeddingBagCollection / FusedEmbeddingCollection against the unfused collections."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.kernels import FusedEmbeddingBagCollection, FusedEmbeddingCollection
from lightrec.modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from lightrec.optim import (
    CombinedOptimizer,
    EmbOptimType,
    KeyedOptimizerWrapper,
    RowWiseAdagrad,
    apply_optimizer_in_backward,
    in_backward_optimizer_filter,
)
from lightrec.sparse import KeyedJaggedTensor

BACKENDS = [
    "torch",
    pytest.param("fbgemm", marks=pytest.mark.skipif(not fbgemm_available(), reason="fbgemm absent")),
]


def _tables(shared: bool = True) -> list[EmbeddingBagConfig]:
    """Four features; with ``shared`` two of them read one table (fbgemm's CPU Adagrads refuse that)."""
    users = (
        [
            EmbeddingBagConfig(
                num_embeddings=40, embedding_dim=8, name="t_user", feature_names=["user", "friend"]
            )
        ]
        if shared
        else [
            EmbeddingBagConfig(num_embeddings=40, embedding_dim=8, name="t_user", feature_names=["user"]),
            EmbeddingBagConfig(num_embeddings=40, embedding_dim=8, name="t_friend", feature_names=["friend"]),
        ]
    )
    return users + [
        EmbeddingBagConfig(
            num_embeddings=30,
            embedding_dim=4,
            name="t_item",
            feature_names=["item"],
            pooling=PoolingType.MEAN,
        ),
        EmbeddingBagConfig(num_embeddings=20, embedding_dim=8, name="t_cat", feature_names=["cat"]),
    ]


def _kjt(gen: torch.Generator, keys: list[str], batch: int, weighted: bool = False) -> KeyedJaggedTensor:
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=gen)
    values = torch.randint(0, 20, (int(lengths.sum()),), generator=gen)
    weights = torch.rand(values.numel(), generator=gen) if weighted else None
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, weights=weights)


def _copy_weights(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    dst.load_state_dict(src.state_dict())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_embedding_bag_collection_and_trains_like_rowwise_adagrad(
    backend: str, weighted: bool, device: torch.device
) -> None:
    shared = backend == "torch"
    tables = _tables(shared)
    fused = FusedEmbeddingBagCollection(
        tables, RowWiseAdagrad, {"lr": 0.1, "eps": 1e-8}, is_weighted=weighted, kernel_backend=backend, device=device
    )
    assert [lk.backend_name for lk in fused._lookups] == [backend, backend]
    ebc = EmbeddingBagCollection(_tables(shared), is_weighted=weighted)
    _copy_weights(fused, ebc)
    assert list(fused.state_dict()) == [f"embedding_bags.{t.name}.weight" for t in tables]
    dense_opt = RowWiseAdagrad(ebc.parameters(), lr=0.1, eps=1e-8)
    gen = torch.Generator().manual_seed(0)
    # keys in an order different from the table order: the collection must permute
    keys = ["cat", "item", "friend", "user"]
    for _ in range(3):
        kjt = _kjt(gen, keys, batch=5, weighted=weighted)
        out, ref = fused(kjt.to(device)), ebc(kjt)  # the reference stays on the CPU
        assert out.keys() == ref.keys() == ["user", "friend", "item", "cat"]
        assert out.length_per_key() == [8, 8, 4, 8]
        torch.testing.assert_close(out.values().cpu(), ref.values(), rtol=1e-5, atol=1e-6)
        scale = torch.randn(out.values().shape, generator=gen)
        (out.values() * scale.to(device)).sum().backward()
        dense_opt.zero_grad()
        (ref.values() * scale).sum().backward()
        dense_opt.step()  # dense row-wise Adagrad: untouched rows get 0 grads, so only touched rows move
    for name, p in ebc.named_parameters():
        torch.testing.assert_close(fused.state_dict()[name].cpu(), p.detach(), rtol=1e-5, atol=1e-6)
    state = fused.fused_optimizer.state_dict()["state"]
    for t in tables:
        torch.testing.assert_close(
            state[f"embedding_bags.{t.name}.weight"]["momentum1"].cpu(),
            dense_opt.state[ebc.embedding_bags[t.name].weight]["sum"],
            rtol=1e-5,
            atol=1e-7,
        )


def test_fused_params_repr_and_filter() -> None:
    fused_params = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.02, "eps": 0.002}
    ebc = FusedEmbeddingBagCollection(_tables(), fused_params=fused_params, kernel_backend="torch")
    assert repr(ebc.fused_optimizer).startswith(
        ": EmbeddingFusedOptimizer (\nParameter Group 0\n    lr: 0.02\n)"
    )
    assert dict(in_backward_optimizer_filter(ebc.named_parameters())) == {}
    names = [n for n, _ in ebc.named_parameters()]
    assert names == [
        "embedding_bags.t_user.weight",
        "embedding_bags.t_item.weight",
        "embedding_bags.t_cat.weight",
    ]
    # loss moves without any optimizer.step(): the update happened in backward
    kjt = _kjt(torch.Generator().manual_seed(1), ebc.feature_names(), batch=4)
    first = ebc(kjt).values().sum()
    first.backward()
    assert ebc(kjt).values().sum().item() != pytest.approx(first.item())


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm absent")
def test_fbgemm_enum_is_accepted_by_name() -> None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType as FbgemmOptim

    ebc = FusedEmbeddingBagCollection(
        _tables(shared=False), fused_params={"optimizer": FbgemmOptim.EXACT_ADAGRAD, "learning_rate": 0.3}
    )
    assert ebc._lookups[0].optimizer_spec.optimizer == EmbOptimType.ADAGRAD
    assert ebc._lookups[0].backend_name == "fbgemm"
    assert ebc.fused_optimizer.param_groups[0]["lr"] == 0.3


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_round_trip_with_combined_optimizer(backend: str) -> None:
    def build() -> tuple[torch.nn.Module, FusedEmbeddingBagCollection, CombinedOptimizer]:
        ebc = FusedEmbeddingBagCollection(
            _tables(shared=False), torch.optim.Adagrad, {"lr": 0.1}, kernel_backend=backend
        )
        head = torch.nn.Linear(28, 1)  # 8 + 8 + 4 + 8 pooled columns
        model = torch.nn.ModuleDict({"ebc": ebc, "head": head})
        dense = KeyedOptimizerWrapper(
            dict(in_backward_optimizer_filter(model.named_parameters())),
            lambda ps: torch.optim.Adam(ps, lr=0.01),
        )
        return model, ebc, CombinedOptimizer([("ebc", ebc.fused_optimizer), dense])

    def train_step(model: torch.nn.Module, opt: CombinedOptimizer, kjt: KeyedJaggedTensor) -> torch.Tensor:
        loss = model["head"](model["ebc"](kjt).values()).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    gen = torch.Generator().manual_seed(3)
    batches = [_kjt(gen, ["user", "friend", "item", "cat"], batch=6) for _ in range(5)]
    torch.manual_seed(0)
    model_a, _, opt_a = build()
    for kjt in batches[:2]:
        train_step(model_a, opt_a, kjt)
    model_sd, opt_sd = copy.deepcopy(model_a.state_dict()), copy.deepcopy(opt_a.state_dict())
    assert "ebc.embedding_bags.t_user.weight" in opt_sd["state"]
    assert "head.weight" in opt_sd["state"]
    torch.manual_seed(1)
    model_b, _, opt_b = build()
    model_b.load_state_dict(model_sd)
    opt_b.load_state_dict(opt_sd)
    for kjt in batches[2:]:
        assert torch.equal(train_step(model_a, opt_a, kjt), train_step(model_b, opt_b, kjt))
    for (na, pa), (nb, pb) in zip(model_a.state_dict().items(), model_b.state_dict().items(), strict=True):
        assert na == nb and torch.equal(pa, pb)


def test_fused_embedding_collection_matches_embedding_collection() -> None:
    tables = [
        EmbeddingConfig(num_embeddings=30, embedding_dim=4, name="a", feature_names=["fa", "fb"]),
        EmbeddingConfig(num_embeddings=25, embedding_dim=4, name="b", feature_names=["fc"]),
    ]
    fused = FusedEmbeddingCollection(tables, torch.optim.SGD, {"lr": 0.5}, kernel_backend="torch")
    ec = EmbeddingCollection(tables)
    _copy_weights(fused, ec)
    assert list(fused.state_dict()) == ["embeddings.a.weight", "embeddings.b.weight"]
    sgd = torch.optim.SGD(ec.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(5)
    for _ in range(2):
        kjt = _kjt(gen, ["fc", "fa", "fb"], batch=3)
        out, ref = fused(kjt), ec(kjt)
        assert list(out) == ["fa", "fb", "fc"]
        loss_f = sum((jt.values() ** 2).sum() for jt in out.values())
        loss_r = sum((jt.values() ** 2).sum() for jt in ref.values())
        for k in out:
            torch.testing.assert_close(out[k].values(), ref[k].values())
            assert torch.equal(out[k].lengths(), ref[k].lengths())
        loss_f.backward()
        sgd.zero_grad()
        loss_r.backward()
        sgd.step()
    for name, p in ec.named_parameters():
        torch.testing.assert_close(fused.state_dict()[name], p.detach())


def test_bad_arguments_are_explained() -> None:
    with pytest.raises(ValueError, match="exactly one of optimizer_type"):
        FusedEmbeddingBagCollection(_tables())
    with pytest.raises(ValueError, match="momentum"):
        FusedEmbeddingBagCollection(_tables(), torch.optim.SGD, {"lr": 0.1, "momentum": 0.9})
    with pytest.raises(KeyError, match="missing features"):
        ebc = FusedEmbeddingBagCollection(_tables(), torch.optim.SGD, {"lr": 0.1})
        ebc(_kjt(torch.Generator().manual_seed(0), ["user", "item", "cat"], batch=2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_deepcopy_keeps_weights_linked_to_kernel_storage(backend: str) -> None:
    ebc = FusedEmbeddingBagCollection(_tables(shared=False), RowWiseAdagrad, {"lr": 0.1}, kernel_backend=backend)
    twin = copy.deepcopy(ebc)
    kjt = _kjt(torch.Generator().manual_seed(8), ebc.feature_names(), batch=4)
    for module in (ebc, twin):
        module(kjt).values().sum().backward()
    for (name, a), (_, b) in zip(ebc.state_dict().items(), twin.state_dict().items(), strict=True):
        assert torch.equal(a, b), name  # the copy trained exactly like the original ...
    assert twin.embedding_bags.t_user.weight.data_ptr() != ebc.embedding_bags.t_user.weight.data_ptr()
    sd_a, sd_b = ebc.fused_optimizer.state_dict(), twin.fused_optimizer.state_dict()
    key = "embedding_bags.t_user.weight"
    assert torch.equal(sd_a["state"][key]["momentum1"], sd_b["state"][key]["momentum1"])
    assert sd_b["state"][key]["momentum1"].abs().sum() > 0  # ... and its optimizer state is the live one
    assert dict(in_backward_optimizer_filter(twin.named_parameters())) == {}


def test_from_module_reads_apply_optimizer_in_backward_marks() -> None:
    """TorchRec tutorial, option 2: mark an unsharded EBC, convert it, train without optimizer.step()."""
    ebc = EmbeddingBagCollection(_tables())
    for param in ebc.parameters():
        apply_optimizer_in_backward(torch.optim.SGD, [param], {"lr": 0.5})
    fused = FusedEmbeddingBagCollection.from_module(ebc, kernel_backend="torch")
    assert repr(fused.fused_optimizer).startswith(
        ": EmbeddingFusedOptimizer (\nParameter Group 0\n    lr: 0.5\n)"
    )
    kjt = _kjt(torch.Generator().manual_seed(2), ebc.feature_names(), batch=4)
    out_f, out_e = fused(kjt).values(), ebc(kjt).values()
    torch.testing.assert_close(out_f, out_e)
    out_f.square().sum().backward()
    out_e.square().sum().backward()  # the marked EBC steps SGD from its grad hooks
    for name, p in ebc.named_parameters():
        torch.testing.assert_close(fused.state_dict()[name], p.detach())
    with pytest.raises(ValueError, match="from_module needs fused_params"):
        FusedEmbeddingBagCollection.from_module(EmbeddingBagCollection(_tables()))


@pytest.mark.skipif(not fbgemm_available(), reason="needs fbgemm")
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_fbgemm_lookup_under_inference_mode_matches_training_forward(pooling: PoolingType) -> None:
    """Lightning runs validation under torch.inference_mode, where fbgemm's fused ops have no kernel."""
    tables = [
        EmbeddingBagConfig(name="t0", num_embeddings=9, embedding_dim=4, feature_names=["a"], pooling=pooling),
        EmbeddingBagConfig(name="t1", num_embeddings=9, embedding_dim=4, feature_names=["b"], pooling=pooling),
        EmbeddingBagConfig(name="t2", num_embeddings=5, embedding_dim=8, feature_names=["c"], pooling=pooling),
    ]
    ebc = FusedEmbeddingBagCollection(
        tables, fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.1}, kernel_backend="fbgemm"
    )
    kjt = KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.tensor([1, 8, 2, 3, 4, 0]),
                            lengths=torch.tensor([2, 0, 1, 1, 0, 2]))
    with torch.no_grad():
        expected = ebc(kjt).values()
    with torch.inference_mode():
        got = ebc(kjt).values()
    torch.testing.assert_close(got, expected)


_P, _K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
# (name, kind, default) in signature order: what users construct the fused collections with
FUSED_SIGNATURES: dict[type, list[tuple[str, object, object]]] = {
    FusedEmbeddingBagCollection: [
        ("tables", _P, inspect.Parameter.empty), ("optimizer_type", _P, None), ("optimizer_kwargs", _P, None),
        ("fused_params", _K, None), ("is_weighted", _K, False), ("device", _K, None), ("kernel_backend", _K, "auto"),
        ("id_check", _K, "auto"), ("tiering", _K, None), ("backend", _K, None),
    ],
    FusedEmbeddingCollection: [
        ("tables", _P, inspect.Parameter.empty), ("optimizer_type", _P, None), ("optimizer_kwargs", _P, None),
        ("fused_params", _K, None), ("device", _K, None), ("kernel_backend", _K, "auto"),
        ("id_check", _K, "auto"), ("tiering", _K, None), ("backend", _K, None),
    ],
}


@pytest.mark.parametrize("cls", list(FUSED_SIGNATURES), ids=lambda c: c.__name__)
def test_constructor_signature_is_unchanged(cls: type) -> None:
    params = inspect.signature(cls).parameters.values()
    assert [(p.name, p.kind, p.default) for p in params] == FUSED_SIGNATURES[cls]


def test_each_collection_takes_only_its_config_type() -> None:
    bag = [EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=8)]
    seq = [EmbeddingConfig(name="t", num_embeddings=4, embedding_dim=8)]
    # the wrong config on purpose (hence the type: ignore)
    with pytest.raises(TypeError, match="FusedEmbeddingBagCollection takes EmbeddingBagConfig tables, got Emb"):
        FusedEmbeddingBagCollection(seq, torch.optim.SGD, {"lr": 0.1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FusedEmbeddingCollection takes EmbeddingConfig tables, got EmbeddingBag"):
        FusedEmbeddingCollection(bag, torch.optim.SGD, {"lr": 0.1})  # type: ignore[arg-type]
