"""torchrec call shapes of ``lightrec.optim`` (review).

* ``RowWiseAdagrad`` takes torchrec's arguments in torchrec's order
  ``(params, lr, lr_decay, weight_decay, initial_accumulator_value, eps, *, maximize)``. Before it
  took ``(params, lr, eps, weight_decay)``: ``apply_optimizer_in_backward(RowWiseAdagrad, ps,
  {"lr": 0.1, "lr_decay": 0.0})`` raised ``TypeError`` and a positional ``lr_decay`` became ``eps``.
* ``KeyedOptimizerWrapper(..., pass_params_dict=True)`` hands the factory the name -> parameter
  mapping (before: ``TypeError``).
* Two optimizers applied in backward to one parameter both step with its gradient, as in torch's
  ``_apply_optimizer_in_backward`` (before: the first one's hook freed the gradient, the second
  never stepped).
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.optim import _apply_optimizer_in_backward

from lightrec.optim import (
    EmbOptimType,
    FusedOptimizerSpec,
    KeyedOptimizerWrapper,
    RowWiseAdagrad,
    apply_optimizer_in_backward,
    fused_spec_from_parameter,
)


def _reference_rowwise_adagrad(
    w: torch.Tensor,
    grads: list[torch.Tensor],
    *,
    lr: float,
    eps: float,
    weight_decay: float = 0.0,
    initial_accumulator_value: float = 0.0,
    maximize: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise Adagrad written out row by row: the final weights and accumulator."""
    w = w.clone()
    acc = [initial_accumulator_value] * w.shape[0]
    for grad in grads:
        for r in range(w.shape[0]):
            g = (-grad[r] if maximize else grad[r]) + weight_decay * w[r]
            acc[r] += float((g * g).sum()) / g.numel()
            w[r] = w[r] - lr * g / (acc[r] ** 0.5 + eps)
    return w, torch.tensor(acc, dtype=w.dtype)


def _grads(n: int, shape: tuple[int, int]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(n)]


def test_rowwise_adagrad_positional_arguments_follow_torchrec_order() -> None:
    p = torch.nn.Parameter(torch.zeros(2, 3))
    opt = RowWiseAdagrad([p], 0.1, 0.0, 0.5, 0.25, 1e-6)
    group = opt.param_groups[0]
    assert (group["lr"], group["lr_decay"], group["weight_decay"]) == (0.1, 0.0, 0.5)
    assert (group["initial_accumulator_value"], group["eps"], group["maximize"]) == (0.25, 1e-6, False)
    with pytest.raises(TypeError):
        RowWiseAdagrad([p], 0.1, 0.0, 0.5, 0.25, 1e-6, True)  # type: ignore[call-arg]  # maximize is keyword-only


def test_rowwise_adagrad_defaults_are_torchrec_defaults() -> None:
    opt = RowWiseAdagrad([torch.nn.Parameter(torch.zeros(2, 3))])
    assert opt.defaults == {
        "lr": 1e-2,
        "lr_decay": 0.0,
        "weight_decay": 0.0,
        "initial_accumulator_value": 0.0,
        "eps": 1e-10,
        "maximize": False,
    }


def test_apply_optimizer_in_backward_takes_rowwise_adagrad_with_torchrec_kwargs() -> None:
    p = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64))
    start = p.detach().clone()
    kwargs = {"lr": 0.1, "lr_decay": 0.0, "weight_decay": 0.0, "initial_accumulator_value": 0.0, "eps": 1e-8}
    apply_optimizer_in_backward(RowWiseAdagrad, [p], kwargs)
    grads = _grads(3, (4, 3))
    for g in grads:
        (p * g).sum().backward()
    expected, _ = _reference_rowwise_adagrad(start, grads, lr=0.1, eps=1e-8)
    torch.testing.assert_close(p.detach(), expected, rtol=1e-12, atol=1e-12)
    assert fused_spec_from_parameter(p) == FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, 0.1, eps=1e-8)


@pytest.mark.parametrize(
    ("weight_decay", "initial_accumulator_value", "maximize"),
    [(0.0, 0.3, False), (0.0, 0.0, True), (0.05, 0.1, True)],
)
def test_rowwise_adagrad_maximize_and_initial_accumulator_match_reference(
    weight_decay: float, initial_accumulator_value: float, maximize: bool
) -> None:
    p = torch.nn.Parameter(torch.randn(5, 4, dtype=torch.float64))
    start = p.detach().clone()
    opt = RowWiseAdagrad(
        [p],
        lr=0.2,
        weight_decay=weight_decay,
        initial_accumulator_value=initial_accumulator_value,
        eps=1e-8,
        maximize=maximize,
    )
    torch.testing.assert_close(opt.state[p]["sum"], torch.full((5,), initial_accumulator_value, dtype=torch.float64))
    grads = _grads(4, (5, 4))
    for g in grads:
        p.grad = g.clone()
        opt.step()
    w, acc = _reference_rowwise_adagrad(
        start,
        grads,
        lr=0.2,
        eps=1e-8,
        weight_decay=weight_decay,
        initial_accumulator_value=initial_accumulator_value,
        maximize=maximize,
    )
    torch.testing.assert_close(p.detach(), w, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(opt.state[p]["sum"], acc, rtol=1e-12, atol=1e-12)


def test_rowwise_adagrad_refuses_lr_decay_naming_it() -> None:
    p = torch.nn.Parameter(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"lr_decay=0\.5"):
        RowWiseAdagrad([p], lr=0.1, lr_decay=0.5)
    with pytest.raises(ValueError, match="lr_decay"):
        RowWiseAdagrad([p], lr=0.1, lr_decay=-1.0)
    opt = RowWiseAdagrad([p], lr=0.1)
    with pytest.raises(ValueError, match=r"lr_decay=0\.1"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2, 3))], "lr_decay": 0.1})
    with pytest.raises(ValueError, match="initial_accumulator_value"):
        RowWiseAdagrad([p], initial_accumulator_value=-1.0)


def test_rowwise_adagrad_loads_a_torchrec_shaped_accumulator() -> None:
    p = torch.nn.Parameter(torch.randn(3, 2, dtype=torch.float64))
    start = p.detach().clone()
    opt = RowWiseAdagrad([p], lr=0.1, eps=1e-8)
    saved_sum = torch.tensor([[0.5], [1.0], [2.0]], dtype=torch.float64)  # torchrec keeps [rows, 1]
    opt.load_state_dict(
        {
            "state": {0: {"step": torch.tensor(3.0), "sum": saved_sum.clone()}},
            "param_groups": [
                {"lr": 0.1, "lr_decay": 0.0, "weight_decay": 0.0, "initial_accumulator_value": 0.0,
                 "eps": 1e-8, "maximize": False, "params": [0]}
            ],
        }
    )  # fmt: skip
    assert opt.state[p]["sum"].shape == (3,)
    g = _grads(1, (3, 2))
    p.grad = g[0].clone()
    opt.step()
    acc = saved_sum.view(-1) + g[0].square().mean(dim=1)
    torch.testing.assert_close(p.detach(), start - 0.1 * g[0] / (acc.sqrt() + 1e-8)[:, None])
    assert opt.state_dict()["state"][0]["sum"].shape == (3,)


def test_rowwise_adagrad_loads_a_state_dict_saved_without_torchrec_arguments() -> None:
    p = torch.nn.Parameter(torch.randn(3, 2))
    opt = RowWiseAdagrad([p], lr=0.1)
    # the layout lightrec saved before it took torchrec's arguments
    opt.load_state_dict(
        {"state": {0: {"sum": torch.ones(3)}}, "param_groups": [{"lr": 0.1, "eps": 1e-10, "weight_decay": 0.0,
                                                                 "params": [0]}]}
    )  # fmt: skip
    p.grad = torch.ones(3, 2)
    opt.step()
    assert opt.param_groups[0]["maximize"] is False
    torch.testing.assert_close(opt.state[p]["sum"], torch.full((3,), 2.0))


def test_keyed_optimizer_wrapper_pass_params_dict_hands_the_factory_the_mapping() -> None:
    params = {"a.weight": torch.nn.Parameter(torch.ones(2)), "b.bias": torch.nn.Parameter(torch.ones(3))}
    seen: list[object] = []

    def by_name(named: object) -> torch.optim.Optimizer:
        seen.append(named)
        assert isinstance(named, dict)
        return torch.optim.SGD(
            [{"params": [named["a.weight"]], "lr": 1.0}, {"params": [named["b.bias"]], "lr": 0.5}]
        )

    opt = KeyedOptimizerWrapper(params, by_name, pass_params_dict=True)
    assert seen == [params]
    for p in params.values():
        p.grad = torch.ones_like(p)
    opt.step()
    torch.testing.assert_close(params["a.weight"].detach(), torch.zeros(2))
    torch.testing.assert_close(params["b.bias"].detach(), torch.full((3,), 0.5))
    assert [g["params"] for g in opt.state_dict()["param_groups"]] == [["a.weight"], ["b.bias"]]

    listed: list[object] = []

    def from_list(ps: list[torch.Tensor]) -> torch.optim.Optimizer:
        listed.append(ps)
        return torch.optim.SGD(ps, lr=0.1)

    KeyedOptimizerWrapper(params, from_list)
    assert listed == [list(params.values())]  # the default stays a list
    with pytest.raises(TypeError, match="pass_params_dict"):
        KeyedOptimizerWrapper(params, lambda ps: torch.optim.SGD(ps, lr=0.1), pass_params_dict=1)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "optimizers",
    [
        [(torch.optim.SGD, {"lr": 1.0}), (torch.optim.SGD, {"lr": 1.0})],
        [(torch.optim.SGD, {"lr": 0.5}), (torch.optim.Adagrad, {"lr": 0.1})],
    ],
)
def test_every_in_backward_optimizer_of_a_parameter_steps_with_its_gradient(
    optimizers: list[tuple[type[torch.optim.Optimizer], dict[str, float]]],
) -> None:
    ours = torch.nn.Parameter(torch.arange(4, dtype=torch.float64))
    theirs = torch.nn.Parameter(torch.arange(4, dtype=torch.float64))
    for cls, kwargs in optimizers:
        apply_optimizer_in_backward(cls, [ours], kwargs)
        _apply_optimizer_in_backward(cls, [theirs], kwargs)
    scale = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    for _ in range(2):
        (ours * scale).square().sum().backward()
        (theirs * scale).square().sum().backward()
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-12, atol=1e-12)
    assert ours.grad is None
