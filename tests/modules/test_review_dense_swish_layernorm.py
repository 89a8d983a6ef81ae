"""torchrec's ``torchrec.modules.activation.SwishLayerNorm`` at lightrec's path: formula, keys, MLP."""

from __future__ import annotations

import torch

from lightrec.modules.activation import SwishLayerNorm
from lightrec.modules.mlp import MLP


def test_swish_layernorm_is_x_times_sigmoid_of_layernorm() -> None:
    torch.manual_seed(0)
    module = SwishLayerNorm(6)
    with torch.no_grad():
        module.norm[0].weight.uniform_(0.5, 1.5)
        module.norm[0].bias.uniform_(-0.2, 0.2)
    x = torch.randn(3, 4, 6)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    normed = (x - mean) / torch.sqrt(var + 1e-5) * module.norm[0].weight + module.norm[0].bias
    torch.testing.assert_close(module(x), x * torch.sigmoid(normed))
    assert set(module.state_dict()) == {"norm.0.weight", "norm.0.bias"}


def test_trailing_shape_and_torchscript() -> None:
    module = SwishLayerNorm([4, 6])
    x = torch.randn(2, 4, 6)
    torch.testing.assert_close(torch.jit.script(module)(x), module(x))
    assert module.norm[0].normalized_shape == (4, 6)


def test_mlp_swish_layernorm_layers_are_swish_layernorm_with_torchrecs_keys() -> None:
    mlp = MLP(5, [8, 3], activation="swish_layernorm")
    assert all(isinstance(layer._activation_fn, SwishLayerNorm) for layer in mlp._mlp)
    assert "_mlp.0._activation_fn.norm.0.weight" in mlp.state_dict()
    assert mlp(torch.randn(2, 5)).shape == (2, 3)
