"""DLRM / DLRM_DCN / DLRMTrain against explicit torch references; meta init; tracing; learning."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightrec.data.batch import Batch
from lightrec.models import DLRM, DLRM_DCN, DenseArch, DLRMTrain, InteractionArch, OverArch, SparseArch
from lightrec.models._sparse_arch import _stack_pooled
from lightrec.modules import EmbeddingBagCollection
from lightrec.modules._dense_checks import DenseShapeError
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor
from tests.models.helpers import FakeBatch, linears, random_kjt, reference_mlp, reference_pooled, tables

B, DENSE_IN, D = 5, 3, 4


def _inputs(seed: int = 0, batch: int = B) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, DENSE_IN, generator=g), random_kjt(batch, g)


def _dlrm(dcn: bool = False, seed: int = 0) -> DLRM:
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(tables(D))
    if dcn:
        return DLRM_DCN(ebc, DENSE_IN, [6, D], [7, 1], dcn_num_layers=2, dcn_low_rank_dim=3)
    return DLRM(ebc, DENSE_IN, [6, D], [7, 1])


def _reference_dlrm(model: DLRM, dense: torch.Tensor, kjt: KeyedJaggedTensor) -> torch.Tensor:
    """The DLRM paper's forward written out: bottom MLP, row sums, pairwise dots / cross net, top MLP."""
    x = reference_mlp(linears(model.dense_arch), dense, last_activation=True)
    vectors = [x] + reference_pooled(model.sparse_arch.embedding_bag_collection, kjt)
    if isinstance(model, DLRM_DCN):
        x0 = torch.cat(vectors, dim=1)
        xl = x0
        cross = model.inter_arch.crossnet
        for w, v, b in zip(cross.W_kernels, cross.V_kernels, cross.bias, strict=True):
            xl = x0 * (xl @ v.t() @ w.t() + b.squeeze(1)) + xl
        z = xl
    else:
        pairs = [(vectors[i] * vectors[j]).sum(1, keepdim=True) for i, j in itertools.combinations(range(len(vectors)), 2)]
        z = torch.cat([x] + pairs, dim=1)
    return reference_mlp(linears(model.over_arch), z, last_activation=False)


@pytest.mark.parametrize("dcn", [False, True])
def test_forward_and_backward_match_reference(dcn: bool) -> None:
    model = _dlrm(dcn)
    dense, kjt = _inputs()
    out = model(dense, kjt)
    assert out.shape == (B, 1)
    ref = _reference_dlrm(model, dense, kjt)
    torch.testing.assert_close(out, ref)
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(out.square().sum(), params)
    ref_grads = torch.autograd.grad(ref.square().sum(), params)
    for (name, _), g, r in zip(model.named_parameters(), grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, msg=lambda m, name=name: f"{name}: {m}")
    # every dense parameter and every table receive gradient
    assert all(g.abs().sum() > 0 for g in grads)


def test_arch_widths() -> None:
    model, dcn = _dlrm(), _dlrm(dcn=True)
    num_features = 3
    assert model.sparse_arch.sparse_feature_names == ["f0", "f1", "f2"]
    assert linears(model.over_arch)[0].in_features == D + (num_features + 1) * num_features // 2
    assert dcn.inter_arch.crossnet.in_features == (num_features + 1) * D
    assert linears(dcn.over_arch)[0].in_features == (num_features + 1) * D
    assert isinstance(model.inter_arch, InteractionArch)
    assert linears(model.over_arch)[-1].out_features == 1


def test_over_arch_single_layer_and_no_final_activation() -> None:
    arch = OverArch(3, [1])
    x = torch.randn(4, 3)
    (layer,) = linears(arch)
    torch.testing.assert_close(arch(x), x @ layer.weight.t() + layer.bias)
    with torch.no_grad():
        layer.bias.fill_(-100.0)
    assert (arch(x) < 0).all()  # a ReLU at the end would clamp these to 0


def test_dense_arch_checks_its_input_width() -> None:
    arch = DenseArch(3, [4])
    with pytest.raises(DenseShapeError, match=r"dense_features must have shape \[batch_size, 3\], got \[2, 5\]"):
        arch(torch.randn(2, 5))
    model = _dlrm()
    _, kjt = _inputs()
    with pytest.raises(DenseShapeError, match="same batch size, got 4 and 5"):
        model(torch.randn(4, DENSE_IN), kjt)


def test_sparse_arch_stacks_features_in_table_order() -> None:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables(D))
    _, kjt = _inputs()
    stacked = SparseArch(ebc)(kjt)
    pooled = ebc(kjt)
    assert stacked.shape == (B, 3, D)
    for f, name in enumerate(["f0", "f1", "f2"]):
        torch.testing.assert_close(stacked[:, f], pooled[name])


class _ReversedKeys(nn.Module):
    """A collection that returns its keys in reverse order (as a sharded one might)."""

    def __init__(self, ebc: EmbeddingBagCollection) -> None:
        super().__init__()
        self.ebc = ebc

    def embedding_bag_configs(self):  # noqa: ANN201
        return self.ebc.embedding_bag_configs()

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedTensor:
        blocks = self.ebc(kjt).to_dict()
        keys = list(reversed(list(blocks)))
        return KeyedTensor.from_tensor_list(keys, [blocks[k] for k in keys])


def test_sparse_arch_reorders_keys_by_name() -> None:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables(D))
    _, kjt = _inputs()
    torch.testing.assert_close(SparseArch(_ReversedKeys(ebc))(kjt), SparseArch(ebc)(kjt))
    kt = KeyedTensor.from_tensor_list(["a", "b"], [torch.zeros(2, 2), torch.ones(2, 2)])
    with pytest.raises(KeyError, match="key c is not in this KeyedTensor"):
        _stack_pooled(kt, ["a", "c"], 2)


def test_embedding_dims_must_match_dense_output() -> None:
    with pytest.raises(ValueError, match=r"sparse embedding dim \(4\) must equal dense_arch_layer_sizes\[-1\] \(8\)"):
        DLRM(EmbeddingBagCollection(tables(4), device="meta"), 3, [16, 8], [4, 1])
    with pytest.raises(ValueError, match=r"same embedding_dim .*t0: 4, t1: 8"):
        DLRM(EmbeddingBagCollection(tables(dims=(4, 8)), device="meta"), 3, [16, 4], [4, 1])
    with pytest.raises(ValueError, match=r"same embedding_dim"):
        DLRM_DCN(EmbeddingBagCollection(tables(dims=(4, 8)), device="meta"), 3, [4], [1], 1, 1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(dense_in_features=0), "dense_in_features must be a positive int, got 0"),
        (dict(dense_arch_layer_sizes=[]), "dense_arch_layer_sizes must name at least one"),
        (dict(over_arch_layer_sizes=[8, 0]), r"over_arch_layer_sizes\[1\] must be a positive int, got 0"),
        (dict(dcn_num_layers=0), "dcn_num_layers must be a positive int, got 0"),
        (dict(dcn_low_rank_dim=-1), "dcn_low_rank_dim must be a positive int, got -1"),
    ],
)
def test_dlrm_dcn_rejects_bad_sizes(kwargs, match) -> None:  # noqa: ANN001
    args = dict(dense_in_features=3, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[1], dcn_num_layers=1,
                dcn_low_rank_dim=1) | kwargs
    with pytest.raises(ValueError, match=match):
        DLRM_DCN(EmbeddingBagCollection(tables(4), device="meta"), **args)


def test_not_a_collection_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="embedding_bag_collection must be an EmbeddingBagCollection"):
        DLRM(nn.Linear(2, 2), 3, [4], [1])


@pytest.mark.parametrize("dcn", [False, True])
def test_meta_collection_with_dense_parts_on_dense_device(dcn: bool) -> None:
    ebc = EmbeddingBagCollection(tables(D), device="meta")
    kwargs = dict(dcn_num_layers=1, dcn_low_rank_dim=2) if dcn else {}
    cls = DLRM_DCN if dcn else DLRM
    model = cls(ebc, DENSE_IN, [6, D], [7, 1], dense_device="cpu", **kwargs)
    for name, p in model.named_parameters():
        expected = "meta" if name.startswith("sparse_arch.") else "cpu"
        assert p.device.type == expected, name
    assert model.inter_arch.to("meta") is not None
    all_meta = cls(ebc, DENSE_IN, [6, D], [7, 1], dense_device="meta", **kwargs)
    assert all(p.device.type == "meta" for p in all_meta.parameters())
    assert all(b.device.type == "meta" for b in all_meta.buffers())


def test_dlrm_train_loss_matches_bce_and_detaches() -> None:
    model = _dlrm()
    dense, kjt = _inputs()
    labels = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    loss, (loss_d, logits, labels_out) = DLRMTrain(model)(Batch(dense, kjt, labels))
    expected_logits = model(dense, kjt).squeeze(1)
    torch.testing.assert_close(logits, expected_logits.detach())
    torch.testing.assert_close(loss, F.binary_cross_entropy(torch.sigmoid(expected_logits), labels))
    assert loss.requires_grad and not loss_d.requires_grad and not logits.requires_grad
    assert logits.shape == (B,) and torch.equal(labels_out, labels)
    # integer labels are accepted
    loss_int, _ = DLRMTrain(model)(FakeBatch(dense, kjt, labels.long()))
    torch.testing.assert_close(loss_int, loss)


def test_dlrm_train_rejects_multi_logit_models() -> None:
    model = DLRM(EmbeddingBagCollection(tables(D)), DENSE_IN, [D], [2])
    dense, kjt = _inputs()
    with pytest.raises(ValueError, match=r"one logit per label: .* shape \(5, 2\) for labels of shape \(5,\)"):
        DLRMTrain(model)(FakeBatch(dense, kjt, torch.zeros(B)))
    with pytest.raises(TypeError, match="dlrm must be an nn.Module"):
        DLRMTrain(lambda d, s: d)


def _planted_problem(n: int, seed: int) -> FakeBatch:
    """Clicks iff ``2 * [f0's id is even] - 1 + 2 * dense[:, 0] > 0`` (about half the samples)."""
    g = torch.Generator().manual_seed(seed)
    f0 = torch.randint(0, 20, (n,), generator=g)
    dense = torch.randn(n, DENSE_IN, generator=g)
    labels = (2.0 * (f0 % 2 == 0).float() - 1.0 + 2.0 * dense[:, 0] > 0).float()
    return FakeBatch(dense, random_kjt(n, g, f0_ids=f0), labels)


def _train(dcn: bool, steps: int = 25) -> tuple[list[float], float, float]:
    """Adagrad (DLRM's usual optimizer), a fresh planted batch per step; losses and held-out loss before/after."""
    task = DLRMTrain(_dlrm(dcn, seed=1))
    held_out = _planted_problem(256, seed=1000)
    opt = torch.optim.Adagrad(task.parameters(), lr=0.1)
    with torch.no_grad():
        held_out_before = task(held_out)[0].item()
    losses = []
    for step in range(steps):
        loss, _ = task(_planted_problem(128, seed=step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        held_out_after = task(held_out)[0].item()
    return losses, held_out_before, held_out_after


@pytest.mark.parametrize("dcn", [False, True])
def test_training_learns_planted_signal_deterministically(dcn: bool) -> None:
    losses, before, after = _train(dcn)
    assert sum(losses[-5:]) < 0.6 * sum(losses[:5]), losses
    assert after < 0.6 * before, (before, after)
    assert _train(dcn) == (losses, before, after)


@pytest.mark.parametrize("dcn", [False, True])
def test_fx_symbolic_trace(dcn: bool) -> None:
    model = _dlrm(dcn)
    dense, kjt = _inputs()
    traced = torch.fx.symbolic_trace(model)
    torch.testing.assert_close(traced(dense, kjt), model(dense, kjt))
    dense3, kjt3 = _inputs(seed=5, batch=3)  # a different batch size than any seen so far
    torch.testing.assert_close(traced(dense3, kjt3), model(dense3, kjt3))

    class LeafTracer(torch.fx.Tracer):
        def is_leaf_module(self, m: nn.Module, name: str) -> bool:
            return isinstance(m, EmbeddingBagCollection) or super().is_leaf_module(m, name)

    graph = LeafTracer().trace(model)
    leaf = torch.fx.GraphModule(model, graph)
    targets = {n.target for n in graph.nodes if n.op == "call_module"}
    assert "sparse_arch.embedding_bag_collection" in targets
    torch.testing.assert_close(leaf(dense, kjt), model(dense, kjt))
    with pytest.raises(DenseShapeError, match=r"\[batch_size, 3\]"):
        leaf(torch.randn(B, DENSE_IN + 1), kjt)
    for arch in (model.dense_arch, model.inter_arch, model.over_arch):
        assert isinstance(torch.fx.symbolic_trace(arch), torch.fx.GraphModule)


@pytest.mark.filterwarnings("ignore:The TorchScript type system:UserWarning")
def test_dense_arches_script() -> None:
    model = _dlrm(dcn=True)
    dense, kjt = _inputs()
    x = model.dense_arch(dense)
    s = model.sparse_arch(kjt)
    z = model.inter_arch(x, s)
    torch.testing.assert_close(torch.jit.script(model.dense_arch)(dense), x)
    torch.testing.assert_close(torch.jit.script(model.inter_arch)(x, s), z)
    torch.testing.assert_close(torch.jit.script(model.over_arch)(z), model.over_arch(z))


@pytest.mark.slow
@pytest.mark.parametrize("dcn", [False, True])
def test_torch_compile_fullgraph(dcn: bool) -> None:
    model = _dlrm(dcn)
    dense, kjt = _inputs()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(dense, kjt), model(dense, kjt))
