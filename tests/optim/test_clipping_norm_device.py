"""Global gradient clipping's norm lives on the parameters' device, also on a rank without gradients.

NCCL refuses CPU tensors, so a rank whose sharded parameters got no gradient this step (its part of
the norm is zero) must still hand a tensor on the parameters' device to ``all_reduce``. CPU CI has
no GPU; the ``meta`` device stands in for "not the CPU" here.
"""

from __future__ import annotations

import torch

from lightrec.optim.clipping import GradientClipping, GradientClippingOptimizer
from lightrec.optim.keyed import KeyedOptimizerWrapper


def _clipper(device: str, with_grad: bool) -> GradientClippingOptimizer:
    params = {"w": torch.nn.Parameter(torch.ones(3, 2, device=device))}
    if with_grad:
        params["w"].grad = torch.full((3, 2), 2.0, device=device)
    wrapped = KeyedOptimizerWrapper(params, lambda ps: torch.optim.SGD(ps, lr=0.1))
    return GradientClippingOptimizer(wrapped, GradientClipping.NORM, max_gradient=1.0)


def test_norm_of_no_gradients_is_on_the_parameters_device() -> None:
    norm = _clipper("meta", with_grad=False).clip_grad_norm_()
    assert norm.device.type == "meta"
    assert norm.shape == ()


def test_norm_with_gradients_on_cpu_is_unchanged() -> None:
    clipper = _clipper("cpu", with_grad=True)
    norm = clipper.clip_grad_norm_()
    assert norm.device.type == "cpu"
    torch.testing.assert_close(norm, torch.tensor(2.0 * 6**0.5), rtol=0, atol=1e-6)
    grad = clipper.params["w"].grad
    assert grad is not None
    torch.testing.assert_close(grad.norm(), torch.tensor(1.0), rtol=0, atol=1e-5)
