"""Dense blocks against their published formulas, written out in plain torch here, and the
typed error of an MLP / Perceptron fed a wrong input width (it used to be matmul's RuntimeError,
naming no argument)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightrec.modules._dense_checks import DenseShapeError
from lightrec.modules.crossnet import CrossNet, LowRankCrossNet, LowRankMixtureCrossNet, VectorCrossNet
from lightrec.modules.deepfm import FactorizationMachine
from lightrec.modules.interaction import InteractionArch
from lightrec.modules.mlp import MLP, Perceptron

N, B = 6, 4


def _randomize(module: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def test_cross_nets_match_the_dcn_formulas() -> None:
    x = torch.randn(B, N, generator=torch.Generator().manual_seed(0))
    full, low, vec = CrossNet(N, 2), LowRankCrossNet(N, 2, low_rank=3), VectorCrossNet(N, 2)
    for i, m in enumerate((full, low, vec)):
        _randomize(m, i)
    sd = {k: v.detach() for k, v in full.state_dict().items()}
    xl = x
    for layer in range(2):  # x_{l+1} = x_0 * (W_l x_l + b_l) + x_l, W [N, N], b [N, 1]
        xl = x * (xl @ sd[f"kernels.{layer}"].T + sd[f"bias.{layer}"][:, 0]) + xl
    torch.testing.assert_close(full(x), xl)
    sd = {k: v.detach() for k, v in low.state_dict().items()}
    xl = x
    for layer in range(2):  # x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l, W [N, r], V [r, N]
        xl = x * ((sd[f"W_kernels.{layer}"] @ (sd[f"V_kernels.{layer}"] @ xl.T)).T + sd[f"bias.{layer}"][:, 0]) + xl
    torch.testing.assert_close(low(x), xl)
    sd = {k: v.detach() for k, v in vec.state_dict().items()}
    xl = x
    for layer in range(2):  # DCN v1: x_{l+1} = x_0 (x_l . w_l) + b_l + x_l
        xl = x * (xl @ sd[f"kernels.{layer}"]) + sd[f"bias.{layer}"][:, 0] + xl
    torch.testing.assert_close(vec(x), xl)


@pytest.mark.parametrize("experts", [1, 3])
def test_mixture_cross_net_matches_the_gated_expert_formula(experts: int) -> None:
    x = torch.randn(B, N, generator=torch.Generator().manual_seed(1))
    m = LowRankMixtureCrossNet(N, 2, num_experts=experts, low_rank=2, activation=torch.tanh)
    _randomize(m, 5)
    sd = {k: v.detach() for k, v in m.state_dict().items()}
    expected_keys = {f"{p}_kernels.{layer}" for p in "UVC" for layer in range(2)} | {f"bias.{layer}" for layer in range(2)}
    expected_keys |= {f"gates.{i}.weight" for i in range(experts)} if experts > 1 else set()
    assert set(sd) == expected_keys
    xl = x
    for layer in range(2):
        outs = []
        for i in range(experts):  # E_i = x_0 * (U a(C a(V x_l)) + b)
            h = torch.tanh(xl @ sd[f"V_kernels.{layer}"][i].T)
            h = torch.tanh(h @ sd[f"C_kernels.{layer}"][i].T)
            outs.append(x * (h @ sd[f"U_kernels.{layer}"][i].T + sd[f"bias.{layer}"][:, 0]))
        if experts == 1:
            xl = outs[0] + xl
        else:
            gates = torch.softmax(torch.cat([xl @ sd[f"gates.{i}.weight"].T for i in range(experts)], 1), 1)
            xl = sum(outs[i] * gates[:, i : i + 1] for i in range(experts)) + xl
    torch.testing.assert_close(m(x), xl)


def test_fm_and_dot_interaction_match_the_formulas() -> None:
    g = torch.Generator().manual_seed(2)
    embs = [torch.randn(B, 3, generator=g), torch.randn(B, 2, 3, generator=g)]
    flat = torch.cat([e.flatten(1) for e in embs], 1)
    pairs = sum(flat[:, i] * flat[:, j] for i in range(flat.shape[1]) for j in range(i + 1, flat.shape[1]))
    torch.testing.assert_close(FactorizationMachine()(embs), pairs.unsqueeze(1))
    dense, sparse = torch.randn(B, 5, generator=g), torch.randn(B, 3, 5, generator=g)
    vecs = [dense] + [sparse[:, f] for f in range(3)]
    dots = [(vecs[i] * vecs[j]).sum(1) for i in range(4) for j in range(i + 1, 4)]  # (0,1),(0,2),..,(2,3)
    torch.testing.assert_close(InteractionArch(3)(dense, sparse), torch.cat([dense, torch.stack(dots, 1)], 1))


@pytest.mark.parametrize(
    ("module", "shape", "name"),
    [
        (lambda: MLP(6, [4, 3]), (5, 7), "MLP input"),
        (lambda: MLP(6, [4, 3]), (2, 5, 4), "MLP input"),
        (lambda: Perceptron(6, 3), (5, 2), "Perceptron input"),
    ],
)
def test_mlp_wrong_input_width_names_in_size(module, shape, name) -> None:  # noqa: ANN001
    with pytest.raises(DenseShapeError, match=rf"{name} must have shape \[\*, 6\].*got \[{', '.join(map(str, shape))}\]"):
        module()(torch.randn(*shape))


def test_mlp_width_check_survives_script_fx_and_export() -> None:
    mlp = MLP(6, [4, 3])
    x = torch.randn(2, 3, 6)  # [*, in_size] inputs keep working
    ref = torch.relu(torch.relu(x @ mlp._mlp[0]._linear.weight.T + mlp._mlp[0]._linear.bias) @ mlp._mlp[1]._linear.weight.T
                     + mlp._mlp[1]._linear.bias)  # fmt: skip
    traced = torch.fx.symbolic_trace(mlp)
    for run in (mlp, torch.jit.script(mlp), traced, torch.jit.script(traced), torch.export.export(mlp, (x,)).module()):
        torch.testing.assert_close(run(x), ref)
    with pytest.raises(DenseShapeError, match="MLP input"):
        traced(torch.randn(2, 5))
    with pytest.raises(torch.jit.Error, match="DenseShapeError"):
        torch.jit.script(mlp)(torch.randn(2, 5))
