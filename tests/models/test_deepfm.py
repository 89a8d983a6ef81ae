"""FieldDeepFM / SimpleDeepFMNN against an explicit first-order + pairwise FM + MLP reference."""

import itertools

import pytest
import torch

from lightrec.models import DLRMTrain, FieldDeepFM, SimpleDeepFMNN
from lightrec.models.deepfm import SimpleDeepFMNNWrapper
from lightrec.modules import EmbeddingBagCollection
from lightrec.modules._dense_checks import DenseShapeError
from tests.models.helpers import FakeBatch, linears, random_kjt, reference_mlp, reference_pooled, tables

B, D = 6, 4


def _model(dense_in: int, seed: int = 0) -> FieldDeepFM:
    torch.manual_seed(seed)
    return FieldDeepFM(EmbeddingBagCollection(tables(D)), dense_in_features=dense_in, deep_layer_sizes=[8, 5])


def _reference(model: FieldDeepFM, dense: torch.Tensor | None, kjt) -> torch.Tensor:  # noqa: ANN001
    fields = reference_pooled(model.sparse_arch.embedding_bag_collection, kjt)
    if dense is not None and dense.shape[1] > 0:
        fields = [dense @ model.dense_proj.weight.t() + model.dense_proj.bias] + fields
    flat = torch.cat(fields, dim=1)
    first = flat @ model.first_order.weight.t() + model.first_order.bias
    fm = sum((fields[i] * fields[j]).sum(1, keepdim=True) for i, j in itertools.combinations(range(len(fields)), 2))
    deep = reference_mlp(linears(model.deep), flat, last_activation=False)
    return first + fm + deep


@pytest.mark.parametrize("dense_in", [0, 3])
def test_forward_backward_match_reference(dense_in: int) -> None:
    model = _model(dense_in)
    g = torch.Generator().manual_seed(1)
    dense = torch.randn(B, dense_in, generator=g) if dense_in else None
    kjt = random_kjt(B, g)
    out = model(dense, kjt)
    assert out.shape == (B, 1)
    assert model.num_fields == 3 + (1 if dense_in else 0)
    ref = _reference(model, dense, kjt)
    torch.testing.assert_close(out, ref)
    params = list(model.parameters())
    for got, want in zip(torch.autograd.grad(out.sum(), params), torch.autograd.grad(ref.sum(), params), strict=True):
        torch.testing.assert_close(got, want)
    if dense_in == 0:  # an empty [B, 0] dense tensor (what lightrec.data.Batch carries) is the same as None
        torch.testing.assert_close(model(torch.zeros(B, 0), kjt), out)


def test_simple_deepfmnn_is_torchrecs_architecture() -> None:
    """torchrec's SimpleDeepFMNN by its formulas: dense arch, [d | deep | all-scalar-pairs FM], sigmoid."""
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables(D))
    model = SimpleDeepFMNN(num_dense_features=2, embedding_bag_collection=ebc, hidden_layer_size=9, deep_fm_dimension=7)
    assert {"dense_arch.model.0.weight", "dense_arch.model.2.bias", "inter_arch.deep_fm.dense_module.0.weight",
            "over_arch.model.0.weight"} <= set(model.state_dict())  # fmt: skip
    g = torch.Generator().manual_seed(1)
    dense, kjt = torch.randn(B, 2, generator=g), random_kjt(B, g)
    sd = model.state_dict()
    d = torch.relu(torch.relu(dense @ sd["dense_arch.model.0.weight"].t() + sd["dense_arch.model.0.bias"])
                   @ sd["dense_arch.model.2.weight"].t() + sd["dense_arch.model.2.bias"])  # fmt: skip
    x = torch.cat([d, *reference_pooled(ebc, kjt)], dim=1)
    deep = torch.relu(x @ sd["inter_arch.deep_fm.dense_module.0.weight"].t() + sd["inter_arch.deep_fm.dense_module.0.bias"])
    fm = 0.5 * (x.sum(1, keepdim=True) ** 2 - (x * x).sum(1, keepdim=True))
    z = torch.cat([d, deep, fm], dim=1)
    want = torch.sigmoid(z @ sd["over_arch.model.0.weight"].t() + sd["over_arch.model.0.bias"])
    torch.testing.assert_close(model(dense, kjt), want)
    wrapped = SimpleDeepFMNNWrapper(2, ebc, 9, 7)
    wrapped.load_state_dict(sd)
    torch.testing.assert_close(wrapped(FakeBatch(dense, kjt, None)), want)


def test_meta_collection_and_dense_device() -> None:
    model = FieldDeepFM(EmbeddingBagCollection(tables(D), device="meta"), 2, [4], dense_device="cpu")
    for name, p in model.named_parameters():
        assert p.device.type == ("meta" if name.startswith("sparse_arch.") else "cpu"), name


def test_rejects_bad_inputs() -> None:
    g = torch.Generator().manual_seed(0)
    kjt = random_kjt(B, g)
    with pytest.raises(ValueError, match="dense_in_features=2, but dense_features is None"):
        _model(2)(None, kjt)
    with pytest.raises(ValueError, match=r"dense_in_features=0 but got dense_features of shape \(6, 3\)"):
        _model(0)(torch.randn(B, 3), kjt)
    with pytest.raises(DenseShapeError, match=r"\[batch_size, 2\], got \[6, 3\]"):
        _model(2)(torch.randn(B, 3), kjt)
    with pytest.raises(DenseShapeError, match="same batch size, got 5 and 6"):
        _model(2)(torch.randn(5, 2), kjt)
    with pytest.raises(ValueError, match="same embedding_dim"):
        FieldDeepFM(EmbeddingBagCollection(tables(dims=(4, 8)), device="meta"), 0, [4])
    with pytest.raises(ValueError, match="dense_in_features must be an int >= 0, got -1"):
        FieldDeepFM(EmbeddingBagCollection(tables(D), device="meta"), -1, [4])
    with pytest.raises(ValueError, match="deep_layer_sizes must name at least one"):
        FieldDeepFM(EmbeddingBagCollection(tables(D), device="meta"), 0, [])


def _pairwise_problem(n: int, seed: int) -> FakeBatch:
    """A pure second-order signal: click iff f0's and f2's ids have the same parity."""
    g = torch.Generator().manual_seed(seed)
    kjt = random_kjt(n, g)
    f2 = kjt["f2"]
    first_f2 = torch.stack([ids[0] if ids.numel() else torch.tensor(1) for ids in f2.to_dense()])
    labels = ((kjt["f0"].values() % 2) == (first_f2 % 2)).float()
    return FakeBatch(torch.zeros(n, 0), kjt, labels)


def _train(steps: int = 30) -> tuple[list[float], float]:
    task = DLRMTrain(_model(0, seed=3))
    opt = torch.optim.Adagrad(task.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        loss, _ = task(_pairwise_problem(128, seed=step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        held_out = task(_pairwise_problem(256, seed=999))[0].item()
    return losses, held_out


def test_training_learns_pairwise_signal_deterministically() -> None:
    losses, held_out = _train()
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), losses
    assert held_out < 0.4, held_out  # a constant predictor scores ln 2 = 0.69
    assert _train() == (losses, held_out)


@pytest.mark.parametrize("dense_in", [0, 3])
def test_fx_symbolic_trace(dense_in: int) -> None:
    model = _model(dense_in)
    g = torch.Generator().manual_seed(0)
    dense, kjt = torch.randn(B, dense_in, generator=g), random_kjt(B, g)
    traced = torch.fx.symbolic_trace(model)
    torch.testing.assert_close(traced(dense, kjt), model(dense, kjt))
    if dense_in == 0:
        with pytest.raises(ValueError, match="dense_in_features=0 but got dense_features"):
            traced(torch.randn(B, 2), kjt)


def test_the_former_name_still_resolves_with_a_deprecation_warning() -> None:
    import lightrec.models
    import lightrec.models.deepfm
    from lightrec.modules import DeepFM as DeepComponent

    with pytest.warns(DeprecationWarning, match="lightrec.models.DeepFM is now lightrec.models.FieldDeepFM"):
        assert lightrec.models.DeepFM is FieldDeepFM
    with pytest.warns(DeprecationWarning):
        assert lightrec.models.deepfm.DeepFM is FieldDeepFM
    assert DeepComponent is not FieldDeepFM  # torchrec's torchrec.modules.deepfm.DeepFM: the deep part
