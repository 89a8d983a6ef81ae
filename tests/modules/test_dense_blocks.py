"""Dense blocks (MLP, DLRM interaction, cross nets, FM) against hand-written torch references."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightrec.modules._dense_checks import DenseShapeError
from lightrec.modules.crossnet import CrossNet, LowRankCrossNet, LowRankMixtureCrossNet, VectorCrossNet
from lightrec.modules.deepfm import DeepFM, FactorizationMachine, field_factorization_machine
from lightrec.modules.interaction import InteractionArch, InteractionDCNArch, num_interaction_outputs
from lightrec.modules.mlp import MLP, Perceptron

# ---------------------------------------------------------------------------------------------- MLP


def _reference_mlp(mlp: MLP, x: torch.Tensor, act) -> torch.Tensor:  # noqa: ANN001
    """Explicit ``act(x W^T + b)`` per layer, reading the module's parameters."""
    for layer in mlp._mlp:
        x = act(x @ layer.linear.weight.t() + layer.linear.bias)
    return x


@pytest.mark.parametrize(
    ("activation", "reference"),
    [
        ("relu", torch.relu),
        ("ReLU", torch.relu),
        (torch.relu, torch.relu),
        (F.relu, torch.relu),
        ("sigmoid", torch.sigmoid),
        (nn.Tanh(), torch.tanh),
        (nn.GELU, F.gelu),
        ("swish", F.silu),
        (None, lambda t: t),
        ("identity", lambda t: t),
        (lambda t: t * 2.0, lambda t: t * 2.0),
    ],
)
def test_mlp_matches_reference(activation, reference) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    mlp = MLP(5, [7, 4, 3], activation=activation)
    x = torch.randn(6, 5, requires_grad=True)
    out = mlp(x)
    assert out.shape == (6, 3)
    assert mlp.in_size == 5 and mlp.out_size == 3 and mlp.layer_sizes == [7, 4, 3]
    x_ref = x.detach().clone().requires_grad_(True)
    ref = _reference_mlp(mlp, x_ref, reference)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_mlp_accepts_extra_leading_dims_and_no_bias() -> None:
    mlp = MLP(4, [3], bias=False)
    assert mlp._mlp[0].linear.bias is None
    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(mlp(x), torch.relu(x @ mlp._mlp[0].linear.weight.t()))


def test_perceptron_is_linear_then_activation() -> None:
    p = Perceptron(3, 2, activation="tanh")
    x = torch.randn(4, 3)
    torch.testing.assert_close(p(x), torch.tanh(F.linear(x, p.linear.weight, p.linear.bias)))
    assert (p.in_size, p.out_size) == (3, 2)


def test_mlp_parametrised_activation_is_copied_per_layer() -> None:
    mlp = MLP(3, [3, 3], activation=nn.PReLU())
    a0, a1 = mlp._mlp[0].activation, mlp._mlp[1].activation
    assert a0 is not a1 and a0.weight is not a1.weight
    assert len(list(mlp.parameters())) == 2 * 2 + 2


def test_mlp_is_seeded_and_meta_capable() -> None:
    torch.manual_seed(3)
    a = MLP(4, [8, 2])
    torch.manual_seed(3)
    b = MLP(4, [8, 2])
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    meta = MLP(4, [8, 2], device="meta")
    assert all(p.device.type == "meta" for p in meta.parameters())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(in_size=0, layer_sizes=[2]), ValueError, "in_size must be a positive int, got 0"),
        (dict(in_size=True, layer_sizes=[2]), ValueError, "in_size"),
        (dict(in_size=2.5, layer_sizes=[2]), ValueError, "in_size"),
        (dict(in_size=3, layer_sizes=[]), ValueError, "layer_sizes must name at least one"),
        (dict(in_size=3, layer_sizes=4), TypeError, "layer_sizes must be a list"),
        (dict(in_size=3, layer_sizes=[4, -1]), ValueError, r"layer_sizes\[1\] must be a positive int, got -1"),
        (dict(in_size=3, layer_sizes=[4], activation="relu6x"), ValueError, "'relu6x' is not a known activation"),
        (dict(in_size=3, layer_sizes=[4], activation=3), TypeError, "activation must be"),
    ],
)
def test_mlp_rejects_bad_arguments(kwargs, error, match) -> None:  # noqa: ANN001
    with pytest.raises(error, match=match):
        MLP(**kwargs)


# ------------------------------------------------------------------------------ InteractionArch


def _reference_interaction(dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
    """Explicit loop over samples and pairs i < j of [dense, sparse_0, ..., sparse_{F-1}]."""
    batch, num_features, _ = sparse.shape
    rows = []
    for b in range(batch):
        vectors = [dense[b]] + [sparse[b, f] for f in range(num_features)]
        dots = [torch.dot(vectors[i], vectors[j]) for i, j in itertools.combinations(range(num_features + 1), 2)]
        rows.append(torch.cat([dense[b], torch.stack(dots)]))
    return torch.stack(rows)


@pytest.mark.parametrize(("batch", "num_features", "dim"), [(1, 1, 1), (4, 3, 5), (3, 6, 2)])
def test_interaction_arch_matches_reference(batch: int, num_features: int, dim: int) -> None:
    torch.manual_seed(0)
    dense = torch.randn(batch, dim, requires_grad=True)
    sparse = torch.randn(batch, num_features, dim, requires_grad=True)
    arch = InteractionArch(num_features)
    out = arch(dense, sparse)
    assert out.shape == (batch, num_interaction_outputs(num_features, dim)) == (batch, arch.output_size(dim))
    assert out.shape[1] == dim + num_features * (num_features + 1) // 2
    d_ref, s_ref = dense.detach().clone().requires_grad_(True), sparse.detach().clone().requires_grad_(True)
    ref = _reference_interaction(d_ref, s_ref)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(dense.grad, d_ref.grad)
    torch.testing.assert_close(sparse.grad, s_ref.grad)


def test_interaction_arch_matches_bmm_triu_formula_and_pair_order() -> None:
    dense = torch.tensor([[1.0, 0.0]])
    sparse = torch.tensor([[[2.0, 0.0], [0.0, 3.0]]])  # v0=(1,0) v1=(2,0) v2=(0,3)
    out = InteractionArch(2)(dense, sparse)
    # pairs in row-major order: <v0,v1>=2, <v0,v2>=0, <v1,v2>=0
    assert out.tolist() == [[1.0, 0.0, 2.0, 0.0, 0.0]]
    x = torch.randn(5, 4, 3)
    gram = torch.bmm(x, x.transpose(1, 2))
    r, c = torch.triu_indices(4, 4, offset=1)
    torch.testing.assert_close(InteractionArch(3)(x[:, 0], x[:, 1:]), torch.cat([x[:, 0], gram[:, r, c]], dim=1))


def test_interaction_arch_has_no_state_and_moves_with_to() -> None:
    arch = InteractionArch(3)
    assert arch.state_dict() == {} and list(arch.parameters()) == []
    assert arch.to(torch.float64).triu_rows.dtype == torch.int64  # index buffers keep their dtype


@pytest.mark.parametrize(
    ("dense_shape", "sparse_shape", "match"),
    [
        ((2, 4), (2, 2, 4), r"sparse_features must have shape \[batch_size, 3, 4\], got \[2, 2, 4\]"),
        ((2, 4), (2, 3, 5), r"sparse_features must have shape \[batch_size, 3, 4\], got \[2, 3, 5\]"),
        ((2, 4), (3, 3, 4), "same batch size, got 2 and 3"),
        ((4,), (1, 3, 4), r"dense_features must have shape \[batch_size, 4\], got \[4\]"),
    ],
)
def test_interaction_arch_rejects_bad_shapes(dense_shape, sparse_shape, match) -> None:  # noqa: ANN001
    for arch in (InteractionArch(3), InteractionDCNArch(3, CrossNet(16, 1))):
        with pytest.raises(DenseShapeError, match=match):
            arch(torch.randn(dense_shape), torch.randn(sparse_shape))


@pytest.mark.parametrize("bad", [0, -2, True, 2.0])
def test_interaction_arch_rejects_bad_num_features(bad) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="num_sparse_features must be a positive int"):
        InteractionArch(bad)


# -------------------------------------------------------------------------------- cross nets


def _reference_crossnet(net: nn.Module, x0: torch.Tensor) -> torch.Tensor:
    """torchrec's formulas on column vectors: x_{l+1} = x_0 * (W x_l + b) + x_l, ``[B, N, 1]``."""
    c0 = x0.unsqueeze(2)
    cl = c0
    if isinstance(net, CrossNet):
        for w, b in zip(net.kernels, net.bias, strict=True):
            cl = c0 * (torch.matmul(w, cl) + b) + cl
    elif isinstance(net, LowRankCrossNet):
        for w, v, b in zip(net.W_kernels, net.V_kernels, net.bias, strict=True):
            cl = c0 * (torch.matmul(w, torch.matmul(v, cl)) + b) + cl
    else:
        for w, b in zip(net.kernels, net.bias, strict=True):
            cl = torch.matmul(c0, torch.tensordot(cl, w, dims=([1], [0]))) + b + cl
    return cl.squeeze(2)


@pytest.mark.parametrize(
    "make", [lambda: CrossNet(6, 3), lambda: LowRankCrossNet(6, 3, low_rank=2), lambda: VectorCrossNet(6, 3)]
)
def test_crossnets_match_reference(make) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    net = make()
    with torch.no_grad():  # non-zero biases so that they are exercised
        for name, p in net.named_parameters():
            if "bias" in name:
                p.normal_()
    x = torch.randn(5, 6, requires_grad=True)
    out = net(x)
    assert out.shape == (5, 6)
    x_ref = x.detach().clone().requires_grad_(True)
    ref = _reference_crossnet(net, x_ref)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)
    assert all(p.grad is not None for p in net.parameters())


def _reference_mixture(net: LowRankMixtureCrossNet, x0: torch.Tensor) -> torch.Tensor:
    """torchrec's per-expert loop on ``[B, N, 1]`` column vectors."""
    c0 = x0.unsqueeze(2)
    cl = c0
    for layer in range(net.num_layers):
        experts = []
        for i in range(net.num_experts):
            h = torch.matmul(net.V_kernels[layer][i], cl).relu()
            h = torch.matmul(net.C_kernels[layer][i], h).relu()
            experts.append((c0 * (torch.matmul(net.U_kernels[layer][i], h) + net.bias[layer])).squeeze(2))
        stacked = torch.stack(experts, 2)  # [B, N, K]
        if net.num_experts > 1:
            gates = torch.stack([g(cl.squeeze(2)) for g in net.gates], 1)  # [B, K, 1]
            cl = torch.matmul(stacked, torch.softmax(gates, 1)) + cl
        else:
            cl = stacked + cl
    return cl.squeeze(2)


@pytest.mark.parametrize("experts", [1, 3])
def test_low_rank_mixture_crossnet_matches_reference(experts: int) -> None:
    torch.manual_seed(0)
    net = LowRankMixtureCrossNet(6, 2, num_experts=experts, low_rank=2)
    with torch.no_grad():
        for b in net.bias:
            b.normal_()
    x = torch.randn(4, 6)
    torch.testing.assert_close(net(x), _reference_mixture(net, x))
    names = {n for n, _ in net.named_parameters()}
    assert {"U_kernels.0", "V_kernels.1", "C_kernels.0", "bias.1"} <= names
    assert ("gates.2.weight" in names) == (experts == 3)


def test_crossnets_load_torchrec_state_dicts() -> None:
    """Keys and shapes as torchrec's ParameterLists write them (docs/migrating-from-torchrec.md)."""
    n, r, g = 5, 2, torch.Generator().manual_seed(3)
    x = torch.randn(3, n, generator=g)
    layouts = {
        CrossNet(n, 2): {f"{k}.{layer}": s for layer in range(2) for k, s in (("kernels", [n, n]), ("bias", [n, 1]))},
        LowRankCrossNet(n, 2, r): {f"{k}.{layer}": s for layer in range(2)
                                   for k, s in (("W_kernels", [n, r]), ("V_kernels", [r, n]), ("bias", [n, 1]))},
        VectorCrossNet(n, 2): {f"{k}.{layer}": s for layer in range(2) for k, s in (("kernels", [n, 1]), ("bias", [n, 1]))},
    }  # fmt: skip
    for net, layout in layouts.items():
        torchrec_state = {k: torch.randn(s, generator=g) for k, s in layout.items()}
        net.load_state_dict(torchrec_state)  # strict: same keys, same shapes
        torch.testing.assert_close(net(x), _reference_crossnet(net, x))


def test_crossnet_shapes_init_and_parameter_counts() -> None:
    n, layers, rank = 10, 2, 3
    full, low, vec = CrossNet(n, layers), LowRankCrossNet(n, layers, rank), VectorCrossNet(n, layers)
    assert sum(p.numel() for p in full.parameters()) == layers * (n * n + n)
    assert sum(p.numel() for p in low.parameters()) == layers * (2 * n * rank + n)
    assert sum(p.numel() for p in vec.parameters()) == 2 * layers * n
    for net in (full, low, vec):
        biases = [p for name, p in net.named_parameters() if "bias" in name]
        assert biases and all(torch.count_nonzero(b) == 0 for b in biases)
    assert (low.in_features, low.num_layers, low.low_rank) == (n, layers, rank)
    # x0 = 0 is a fixed point of every cross layer (each term is multiplied by x0 or x_l).
    assert torch.count_nonzero(full(torch.zeros(2, n))) == 0


def test_crossnets_on_meta_and_seeded() -> None:
    for net in (CrossNet(4, 2, device="meta"), LowRankCrossNet(4, 2, 1, device="meta"), VectorCrossNet(4, 2, device="meta")):
        assert all(p.device.type == "meta" for p in net.parameters())
    torch.manual_seed(1)
    a = LowRankCrossNet(4, 2, 2)
    torch.manual_seed(1)
    b = LowRankCrossNet(4, 2, 2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_crossnets_reject_bad_arguments_and_inputs() -> None:
    with pytest.raises(ValueError, match="num_layers must be a positive int, got 0"):
        CrossNet(4, 0)
    with pytest.raises(ValueError, match="low_rank must be a positive int, got 0"):
        LowRankCrossNet(4, 1, 0)
    with pytest.raises(ValueError, match="in_features"):
        VectorCrossNet(-1, 1)
    with pytest.raises(DenseShapeError, match=r"CrossNet input must have shape \[batch_size, 4\], got \[2, 5\]"):
        CrossNet(4, 1)(torch.randn(2, 5))
    with pytest.raises(TypeError, match="crossnet must be an nn.Module"):
        InteractionDCNArch(2, lambda x: x)


def test_interaction_dcn_arch_crosses_the_flat_concatenation() -> None:
    torch.manual_seed(0)
    net = LowRankCrossNet(12, 2, 2)
    arch = InteractionDCNArch(2, net)
    dense, sparse = torch.randn(3, 4), torch.randn(3, 2, 4)
    out = arch(dense, sparse)
    flat = torch.cat([dense, sparse[:, 0], sparse[:, 1]], dim=1)
    torch.testing.assert_close(out, _reference_crossnet(net, flat))


# ------------------------------------------------------------------------------------- DeepFM


def test_field_factorization_machine_matches_pairwise_sum() -> None:
    torch.manual_seed(0)
    one, many = torch.randn(4, 3, requires_grad=True), torch.randn(4, 5, 3, requires_grad=True)
    out = field_factorization_machine([one, many])
    assert out.shape == (4, 1)
    fields = [one] + [many[:, f] for f in range(5)]
    ref = sum((fields[i] * fields[j]).sum(1, keepdim=True) for i, j in itertools.combinations(range(6), 2))
    torch.testing.assert_close(out, ref)
    gi = torch.autograd.grad(out.sum(), [one, many])
    gr = torch.autograd.grad(ref.sum(), [one, many])
    torch.testing.assert_close(gi, gr)


def test_factorization_machine_is_torchrecs_all_scalar_pairs() -> None:
    """torchrec's FM: every pair of scalars of the flattened inputs, mixed widths allowed."""
    torch.manual_seed(0)
    a, b = torch.randn(3, 2, 8, requires_grad=True), torch.randn(3, 5, requires_grad=True)
    out = FactorizationMachine()([a, b])
    assert out.shape == (3, 1)
    x = torch.cat([a.flatten(1), b], dim=1)
    ref = torch.stack([
        sum(x[r, i] * x[r, j] for i, j in itertools.combinations(range(x.shape[1]), 2)) for r in range(3)
    ]).unsqueeze(1)  # fmt: skip
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), [a, b]), torch.autograd.grad(ref.sum(), [a, b]))
    # not the field-wise FM: on one [3, 2, 8] input the two differ (the issue's -3.24 vs -0.61 case)
    assert not torch.allclose(FactorizationMachine()([a]), field_factorization_machine([a]))


def test_factorization_machine_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="at least one tensor"):
        FactorizationMachine()([])
    with pytest.raises(DenseShapeError, match="same batch size, got 2 and 5"):
        FactorizationMachine()([torch.randn(2, 3), torch.randn(5, 3)])
    with pytest.raises(DenseShapeError, match=r"embeddings\[1\] must have shape"):
        field_factorization_machine([torch.randn(2, 3), torch.randn(2, 4)])


def test_deepfm_component_runs_dense_module_on_flat_concatenation() -> None:
    torch.manual_seed(0)
    mlp = MLP(3 + 2 * 3, [4])
    deep = DeepFM(mlp)
    a, b = torch.randn(5, 3), torch.randn(5, 2, 3)
    torch.testing.assert_close(deep([a, b]), mlp(torch.cat([a, b.reshape(5, 6)], dim=1)))
    with pytest.raises(ValueError, match="at least one tensor"):
        deep([])
    with pytest.raises(TypeError, match="dense_module must be an nn.Module"):
        DeepFM(torch.relu)


# ------------------------------------------------------------------- tracing and scripting


class _ListInput(nn.Module):
    """Calls a list-taking block from tensors, the way models use it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.inner([a, b])


_BLOCKS = {
    "mlp": (lambda: MLP(6, [5, 3]), lambda: (torch.randn(4, 6),)),
    "interaction": (lambda: InteractionArch(3), lambda: (torch.randn(4, 2), torch.randn(4, 3, 2))),
    "dcn": (lambda: InteractionDCNArch(3, LowRankCrossNet(8, 2, 1)), lambda: (torch.randn(4, 2), torch.randn(4, 3, 2))),
    "crossnet": (lambda: CrossNet(6, 2), lambda: (torch.randn(4, 6),)),
    "vector_crossnet": (lambda: VectorCrossNet(6, 2), lambda: (torch.randn(4, 6),)),
    "fm": (lambda: _ListInput(FactorizationMachine()), lambda: (torch.randn(4, 2), torch.randn(4, 3, 2))),
    "deepfm": (lambda: _ListInput(DeepFM(MLP(8, [2]))), lambda: (torch.randn(4, 2), torch.randn(4, 3, 2))),
}


@pytest.mark.filterwarnings("ignore:The TorchScript type system:UserWarning")
@pytest.mark.parametrize("name", sorted(_BLOCKS))
def test_blocks_fx_trace_and_script(name: str) -> None:
    torch.manual_seed(0)
    make, inputs = _BLOCKS[name]
    module, args = make(), inputs()
    expected = module(*args)
    traced = torch.fx.symbolic_trace(module)
    torch.testing.assert_close(traced(*args), expected)
    torch.testing.assert_close(torch.jit.script(module)(*args), expected)
    torch.testing.assert_close(torch.jit.script(traced)(*args), expected)


def test_traced_block_keeps_shape_errors() -> None:
    traced = torch.fx.symbolic_trace(InteractionArch(3))
    with pytest.raises(DenseShapeError, match=r"\[batch_size, 3, 2\]"):
        traced(torch.randn(4, 2), torch.randn(4, 2, 2))


@pytest.mark.slow
def test_interaction_and_crossnet_compile_without_graph_breaks() -> None:
    arch = InteractionDCNArch(3, LowRankCrossNet(8, 2, 1))
    dense, sparse = torch.randn(4, 2), torch.randn(4, 3, 2)
    compiled = torch.compile(arch, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(dense, sparse), arch(dense, sparse))
    compiled_dot = torch.compile(InteractionArch(3), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled_dot(dense, sparse), InteractionArch(3)(dense, sparse))
