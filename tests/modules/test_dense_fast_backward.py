"""The hand-written backward passes of the dense blocks against plain autograd.

``InteractionArch`` (one-bmm backward of the dot interaction) and ``Perceptron`` (layout-aware
backward GEMMs of its ``nn.Linear``) replace autograd's formulas in eager training only; these
tests compare every gradient with the one autograd computes from the plain ops, check second
derivatives, and check that hooks, no-grad, TorchScript and fx keep working.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightrec.modules import mlp as mlp_module
from lightrec.modules.interaction import InteractionArch, _dot_interaction
from lightrec.modules.mlp import MLP, Perceptron


def _plain_interaction(arch: InteractionArch, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
    """The interaction as autograd sees it without the custom function (advanced indexing)."""
    stacked = torch.cat([dense.unsqueeze(1), sparse], dim=1)
    gram = torch.bmm(stacked, stacked.transpose(1, 2))
    return torch.cat([dense, gram[:, arch.triu_rows, arch.triu_cols]], dim=1)


@pytest.mark.parametrize(("batch", "num_features", "dim"), [(5, 1, 3), (4, 3, 8), (7, 6, 2), (3, 26, 4)])
def test_interaction_backward_matches_autograd(batch: int, num_features: int, dim: int) -> None:
    torch.manual_seed(num_features)
    arch = InteractionArch(num_features)
    dense = torch.randn(batch, dim, requires_grad=True)
    sparse = torch.randn(batch, num_features, dim, requires_grad=True)
    out = arch(dense, sparse)
    assert out.grad_fn is not None and "DotInteraction" in type(out.grad_fn).__name__
    ref = _plain_interaction(arch, dense, sparse)
    assert torch.equal(out, ref)  # same forward ops and values, bit for bit
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (dense, sparse), g)
    want = torch.autograd.grad(ref, (dense, sparse), g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_interaction_only_sparse_or_only_dense_requires_grad() -> None:
    torch.manual_seed(0)
    arch = InteractionArch(4)
    dense, sparse = torch.randn(3, 5), torch.randn(3, 4, 5)
    for d, s in ((dense.requires_grad_(True), sparse), (dense.detach(), sparse.requires_grad_(True))):
        out = arch(d, s)
        leaf = d if d.requires_grad else s
        (got,) = torch.autograd.grad(out.square().sum(), leaf)
        (want,) = torch.autograd.grad(_plain_interaction(arch, d, s).square().sum(), leaf)
        torch.testing.assert_close(got, want)


def test_interaction_second_derivatives() -> None:
    torch.manual_seed(1)
    arch = InteractionArch(3)
    dense = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    sparse = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(arch, (dense, sparse))
    assert torch.autograd.gradgradcheck(arch, (dense, sparse))


def test_interaction_no_grad_and_scripted_paths_agree() -> None:
    torch.manual_seed(2)
    arch = InteractionArch(5)
    dense, sparse = torch.randn(4, 3), torch.randn(4, 5, 3)
    eager = arch(dense.requires_grad_(True), sparse)
    with torch.no_grad():
        plain = arch(dense, sparse)
    assert torch.equal(plain, _dot_interaction(dense, sparse, arch.triu_flat))
    torch.testing.assert_close(eager.detach(), plain)
    torch.testing.assert_close(torch.jit.script(arch)(dense, sparse), plain)
    torch.testing.assert_close(torch.fx.symbolic_trace(arch)(dense, sparse), plain)


def _plain_mlp(mlp: MLP, x: torch.Tensor) -> torch.Tensor:
    for layer in mlp._mlp:
        x = layer.activation(F.linear(x, layer.linear.weight, layer.linear.bias))
    return x


def _linear_nodes(out: torch.Tensor) -> list:
    """Autograd nodes that compute a linear layer's gradient in ``out``'s graph."""
    seen, stack, found = set(), [out.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "Linear" in node.name() or "Addmm" in node.name() or "Mm" in node.name():
            found.append(node)
        stack += [n for n, _ in node.next_functions]
    assert found
    return found


@pytest.mark.parametrize("force_transposed", [False, True])
@pytest.mark.parametrize(("batch", "sizes"), [(32, [13, 48, 20]), (16, [7, 5]), (64, [33, 16, 1])])
def test_perceptron_backward_matches_autograd(
    monkeypatch: pytest.MonkeyPatch, force_transposed: bool, batch: int, sizes: list[int]
) -> None:
    if force_transposed:  # take the transposed GEMMs even for these small shapes
        monkeypatch.setattr(mlp_module, "_MIN_TRANSPOSED_MACS", 0)
    torch.manual_seed(batch)
    mlp = MLP(sizes[0], sizes[1:])
    x = torch.randn(batch, sizes[0], requires_grad=True)
    out = mlp(x)
    assert all("LinearFunction" in str(node.name()) for node in _linear_nodes(out))
    ref = _plain_mlp(mlp, x)
    assert torch.equal(out, ref)  # the forward is F.linear itself
    g = torch.randn_like(out)
    params = [x, *mlp.parameters()]
    for a, b in zip(torch.autograd.grad(out, params, g), torch.autograd.grad(ref, params, g), strict=True):
        torch.testing.assert_close(a, b)


def test_transposed_products_only_for_unaligned_rows() -> None:
    aligned = mlp_module._transposed_is_aligned
    # The DLRM benchmark's backward GEMMs (fp32, batch 2048): [m, k] @ [k, n].
    assert aligned(2048, 512, 415, 4)  # dX of 415 -> 512: rows of 415 floats
    assert aligned(512, 2048, 415, 4)  # dW of 415 -> 512
    assert aligned(512, 2048, 13, 4)  # dW of 13 -> 512
    assert not aligned(2048, 256, 512, 4)  # dX of 512 -> 256: rows already aligned
    assert not aligned(256, 2048, 512, 4)
    assert not aligned(1, 2048, 256, 4)  # the transposed rows (1 float) would not be aligned either
    assert not aligned(16, 16, 8, 4)  # too small to pay for the copy
    assert not aligned(2048, 512, 416, 2)  # 416 halves = 832 bytes = 13 whole lines in fp16
    assert aligned(2048, 512, 415, 2)


def test_perceptron_backward_takes_both_transposed_products(monkeypatch: pytest.MonkeyPatch) -> None:
    decisions: list[tuple[int, int, int, bool]] = []
    real = mlp_module._transposed_is_aligned

    def spy(m: int, k: int, n: int, element_size: int) -> bool:
        decisions.append((m, k, n, real(m, k, n, element_size)))
        return decisions[-1][-1]

    monkeypatch.setattr(mlp_module, "_transposed_is_aligned", spy)
    layer = Perceptron(415, 512)
    x = torch.randn(2048, 415, requires_grad=True)
    g = torch.randn(2048, 512)
    layer(x).backward(g)
    assert sorted(decisions) == [(512, 2048, 415, True), (2048, 512, 415, True)]
    dx, dw = x.grad, layer.linear.weight.grad
    assert dx.is_contiguous() and dw.is_contiguous()
    mask = (layer.linear(x) > 0).to(g.dtype)
    torch.testing.assert_close(dx, (g * mask) @ layer.linear.weight)
    torch.testing.assert_close(dw, (g * mask).t() @ x.detach())


def test_perceptron_second_derivatives_and_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mlp_module, "_MIN_TRANSPOSED_MACS", 0)
    torch.manual_seed(3)
    mlp = MLP(5, [16, 3], activation="tanh").double()
    x = torch.randn(16, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(mlp, (x,))
    assert torch.autograd.gradgradcheck(mlp, (x,))
    seen: list[tuple[int, ...]] = []
    mlp._mlp[0].linear.register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    mlp(x)
    assert seen == [(16, 16)]  # the nn.Linear module is still called (hooks run)


def test_perceptron_non_fast_paths_agree() -> None:
    torch.manual_seed(4)
    mlp = MLP(6, [5, 3])
    x = torch.randn(4, 6)
    with torch.no_grad():
        plain = _plain_mlp(mlp, x)
        assert torch.equal(mlp(x), plain)
    assert torch.equal(mlp(x), plain)  # parameters need grad, the input does not: fast path
    x3 = torch.randn(2, 4, 6)  # 3-D inputs keep nn.Linear's own autograd
    torch.testing.assert_close(mlp(x3), _plain_mlp(mlp, x3))
    torch.testing.assert_close(torch.jit.script(mlp)(x), plain)
    torch.testing.assert_close(torch.fx.symbolic_trace(mlp)(x), plain)
    quantized = torch.ao.quantization.quantize_dynamic(MLP(6, [5, 3]), {nn.Linear}, dtype=torch.qint8)
    assert type(quantized._mlp[0].linear) is not nn.Linear  # swapped modules are left alone
    assert quantized(x).shape == (4, 3)
