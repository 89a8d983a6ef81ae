"""KeyedOptimizer, KeyedOptimizerWrapper, CombinedOptimizer, in-backward markers, specs."""

from __future__ import annotations

import copy

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.optim import (
    CombinedOptimizer,
    EmbOptimType,
    FusedOptimizerSpec,
    KeyedOptimizer,
    KeyedOptimizerWrapper,
    RowWiseAdagrad,
    WeightDecayMode,
    apply_optimizer_in_backward,
    fused_spec_from_parameter,
    in_backward_optimizer_filter,
    optimizer_class_to_spec,
)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(5, 4, generator=gen)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def _adam(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.05)


def test_wrapper_keys_state_by_name_and_matches_plain_optimizer() -> None:
    model, plain_model = _model(0), _model(0)
    keyed = KeyedOptimizerWrapper(dict(model.named_parameters()), _adam)
    plain = torch.optim.Adam(plain_model.parameters(), lr=0.05)
    assert _train(model, keyed, 3, 1) == _train(plain_model, plain, 3, 1)
    sd = keyed.state_dict()
    assert set(sd["state"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert sd["param_groups"][0]["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    torch.testing.assert_close(
        sd["state"]["0.weight"]["exp_avg"], plain.state[plain_model[0].weight]["exp_avg"]
    )


def test_state_round_trip_continues_identically() -> None:
    model_a = _model(0)
    opt_a = KeyedOptimizerWrapper(dict(model_a.named_parameters()), _adam)
    _train(model_a, opt_a, 2, 1)
    model_b = _model(5)
    model_b.load_state_dict(model_a.state_dict())
    opt_b = KeyedOptimizerWrapper(dict(model_b.named_parameters()), _adam)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    assert _train(model_a, opt_a, 3, 2) == _train(model_b, opt_b, 3, 2)


def test_init_state_materialises_without_moving_weights() -> None:
    model = _model(0)
    before = copy.deepcopy(model.state_dict())
    opt = KeyedOptimizerWrapper(dict(model.named_parameters()), _adam)
    assert opt.state_dict()["state"] == {}
    opt.init_state()
    state = opt.state_dict()["state"]
    assert set(state) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert float(state["0.weight"]["step"]) == 0.0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    assert all(p.grad is None for p in model.parameters())
    # the next real step matches a fresh Adam
    fresh_model = _model(0)
    fresh = torch.optim.Adam(fresh_model.parameters(), lr=0.05)
    assert _train(model, opt, 2, 3) == _train(fresh_model, fresh, 2, 3)


def test_load_state_dict_names_what_is_missing() -> None:
    model = _model(0)
    opt = KeyedOptimizerWrapper(dict(model.named_parameters()), _adam)
    opt.init_state()
    sd = opt.state_dict()
    del sd["state"]["2.bias"]
    with pytest.raises(KeyError, match="2.bias"):
        opt.load_state_dict(sd)


def _tensor_state(opt: KeyedOptimizer) -> dict[str, dict[str, torch.Tensor]]:
    return {n: {k: v.clone() for k, v in opt.state[p].items() if isinstance(v, torch.Tensor)}
            for n, p in opt.params.items() if p in opt.state}  # fmt: skip


def _same_state(a: dict[str, dict[str, torch.Tensor]], b: dict[str, dict[str, torch.Tensor]]) -> bool:
    return a.keys() == b.keys() and all(
        a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]) for n in a
    )


def test_load_state_dict_checks_every_shape_before_copying_any() -> None:
    # The mismatch is in the LAST parameter: nothing before it may be copied.
    model = _model(0)
    opt = KeyedOptimizerWrapper(dict(model.named_parameters()), _adam)
    opt.init_state()
    sd = copy.deepcopy(opt.state_dict())
    for state in sd["state"].values():
        state["exp_avg"].fill_(3.0)
    sd["state"]["2.bias"]["exp_avg"] = torch.zeros(2)
    sd["param_groups"][0]["lr"] = 123.0
    before = _tensor_state(opt)
    with pytest.raises(ValueError, match=r"2\.bias\.exp_avg: shape \(2,\) in the checkpoint, \(1,\) here.*nothing"):
        opt.load_state_dict(sd)
    assert _same_state(before, _tensor_state(opt))
    assert opt.param_groups[0]["lr"] == 0.05


def test_combined_optimizer_checks_every_child_before_loading_any() -> None:
    # The mismatch is in the SECOND child: the first must not be loaded either.
    model = _model(0)
    params = dict(model.named_parameters())
    first = KeyedOptimizerWrapper({n: p for n, p in params.items() if n.startswith("0.")}, _adam)
    second = KeyedOptimizerWrapper({n: p for n, p in params.items() if n.startswith("2.")}, _adam)
    combined = CombinedOptimizer([("a", first), ("b", second)])
    combined.init_state()
    sd = copy.deepcopy(combined.state_dict())
    for state in sd["state"].values():
        state["exp_avg"].fill_(3.0)
    sd["param_groups"][0]["lr"] = 123.0
    sd["state"]["b.2.weight"]["exp_avg_sq"] = torch.zeros(7)
    before = _tensor_state(first), _tensor_state(second)
    with pytest.raises(ValueError, match=r"2\.weight\.exp_avg_sq"):
        combined.load_state_dict(sd)
    assert _same_state(before[0], _tensor_state(first)) and _same_state(before[1], _tensor_state(second))
    assert first.param_groups[0]["lr"] == 0.05
    # a missing entry in the second child is reported before the first is loaded, too
    sd = copy.deepcopy(combined.state_dict())
    for state in sd["state"].values():
        state["exp_avg"].fill_(3.0)
    del sd["state"]["b.2.bias"]
    with pytest.raises(KeyError, match="2.bias"):
        combined.load_state_dict(sd)
    assert _same_state(before[0], _tensor_state(first))


def test_combined_optimizer_prefixes_groups_and_scheduler() -> None:
    model = _model(0)
    first = KeyedOptimizerWrapper(
        {"w": model[0].weight, "b": model[0].bias}, lambda ps: torch.optim.SGD(ps, lr=0.1)
    )
    second = KeyedOptimizerWrapper(dict(model[2].named_parameters()), _adam)
    combined = CombinedOptimizer([("first", first), second])
    assert set(combined.params) == {"first.w", "first.b", "weight", "bias"}
    scheduler = torch.optim.lr_scheduler.ExponentialLR(combined, gamma=0.5)
    _train(model, combined, 2, 4)
    scheduler.step()
    assert first.param_groups[0]["lr"] == pytest.approx(0.05)
    assert second.param_groups[0]["lr"] == pytest.approx(0.025)
    sd = combined.state_dict()
    assert "weight" in sd["state"] and "first.w" not in sd["state"]  # plain SGD keeps no state
    assert [g["params"] for g in sd["param_groups"]] == [["first.w", "first.b"], ["weight", "bias"]]
    assert combined.state[model[2].weight]["exp_avg"] is second.state[model[2].weight]["exp_avg"]
    # round trip into a freshly built combined optimizer
    model_b = _model(1)
    model_b.load_state_dict(model.state_dict())
    fb = KeyedOptimizerWrapper(
        {"w": model_b[0].weight, "b": model_b[0].bias}, lambda ps: torch.optim.SGD(ps, lr=0.1)
    )
    sb = KeyedOptimizerWrapper(dict(model_b[2].named_parameters()), _adam)
    combined_b = CombinedOptimizer([("first", fb), sb])
    combined_b.load_state_dict(copy.deepcopy(sd))
    assert fb.param_groups[0]["lr"] == pytest.approx(0.05)
    assert _train(model, combined, 2, 5) == _train(model_b, combined_b, 2, 5)
    with pytest.raises(TypeError, match="KeyedOptimizerWrapper"):
        CombinedOptimizer([torch.optim.SGD(model.parameters(), lr=0.1)])  # type: ignore[list-item]


def test_keyed_optimizer_base_checks_groups() -> None:
    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="belong to no param group"):
        KeyedOptimizer({"p": p, "q": q}, {}, [{"params": [p], "lr": 0.1}])
    opt = KeyedOptimizer({"p": p}, {}, [{"params": [p], "lr": 0.1}])
    assert opt.step(lambda: 3.0) == 3.0  # no update, closure evaluated


def test_rowwise_adagrad_matches_hand_written_rule() -> None:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 3))
    ref = w.detach().clone()
    acc = torch.zeros(5)
    opt = RowWiseAdagrad([w], lr=0.1, eps=1e-8, weight_decay=0.01)
    for i in range(3):
        g = torch.randn(5, 3)
        g[i] = 0.0  # a row without gradient still decays (dense L2) but keeps its learning rate
        w.grad = g.clone()
        opt.step()
        g = g + 0.01 * ref
        acc += (g * g).mean(dim=1)
        ref -= 0.1 * g / (acc.sqrt() + 1e-8)[:, None]
    torch.testing.assert_close(w.detach(), ref)
    torch.testing.assert_close(opt.state[w]["sum"], acc)


def test_apply_optimizer_in_backward_steps_in_hook_and_marks() -> None:
    model, ref_model = _model(0), _model(0)
    first_layer = list(model[0].parameters())
    apply_optimizer_in_backward(torch.optim.SGD, first_layer, {"lr": 0.5})
    rest = dict(in_backward_optimizer_filter(model.named_parameters()))
    assert set(rest) == {"2.weight", "2.bias"}
    assert set(dict(in_backward_optimizer_filter(model.named_parameters(), include=True))) == {
        "0.weight",
        "0.bias",
    }
    dense = torch.optim.SGD(rest.values(), lr=0.5)
    ref = torch.optim.SGD(ref_model.parameters(), lr=0.5)
    assert _train(model, dense, 3, 6) == _train(ref_model, ref, 3, 6)
    assert model[0].weight.grad is None  # the hook stepped and freed the gradient
    spec = fused_spec_from_parameter(model[0].weight)
    assert spec == FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=0.5)
    assert fused_spec_from_parameter(model[2].weight) is None


@pytest.mark.parametrize(
    ("cls", "kwargs", "expected"),
    [
        (torch.optim.SGD, {"lr": 0.3, "weight_decay": 0.1}, FusedOptimizerSpec("sgd", 0.3, weight_decay=0.1)),
        (torch.optim.Adagrad, {"lr": 0.2}, FusedOptimizerSpec(EmbOptimType.ADAGRAD, 0.2, eps=1e-10)),
        (
            RowWiseAdagrad,
            {"lr": 0.02, "eps": 1e-3},
            FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, 0.02, eps=1e-3),
        ),
        (
            torch.optim.Adam,
            {"lr": 1e-3, "betas": (0.8, 0.9)},
            FusedOptimizerSpec("adam", 1e-3, beta1=0.8, beta2=0.9),
        ),
        (
            torch.optim.AdamW,
            {"lr": 1e-3, "weight_decay": 0.1},
            FusedOptimizerSpec("adam", 1e-3, weight_decay=0.1, weight_decay_mode=WeightDecayMode.DECOUPLED),
        ),
    ],
)
def test_optimizer_class_to_spec(cls: type, kwargs: dict, expected: FusedOptimizerSpec) -> None:
    assert optimizer_class_to_spec(cls, kwargs) == expected


def test_spec_errors_and_fused_params() -> None:
    with pytest.raises(ValueError, match="cannot be fused"):
        optimizer_class_to_spec(torch.optim.RMSprop, {"lr": 0.1})
    with pytest.raises(ValueError, match="lr_decay"):
        optimizer_class_to_spec(torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.1})
    with pytest.raises(ValueError, match="not a fused embedding optimizer"):
        FusedOptimizerSpec("rmsprop")
    with pytest.raises(KeyError, match="'optimizer' entry"):
        FusedOptimizerSpec.from_fused_params({"learning_rate": 0.1})
    with pytest.raises(KeyError, match="momentum"):
        FusedOptimizerSpec.from_fused_params({"optimizer": "sgd", "momentum": 0.9})
    spec = FusedOptimizerSpec.from_fused_params(
        {
            "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            "learning_rate": 0.02,
            "eps": 0.002,
            "stochastic_rounding": True,
            "bounds_check_mode": 3,  # torchrec's sharders copy it (and enforce_hbm) from ParameterConstraints
            "enforce_hbm": False,
        }
    )
    assert spec.optimizer is EmbOptimType.ROWWISE_ADAGRAD and spec.learning_rate == 0.02 and spec.eps == 0.002
    assert FusedOptimizerSpec.from_fused_params(spec.to_fused_params()) == spec


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm absent")
def test_fbgemm_enum_members_map_by_name() -> None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType as FbgemmOptim

    assert EmbOptimType.coerce(FbgemmOptim.EXACT_ROWWISE_ADAGRAD) is EmbOptimType.ROWWISE_ADAGRAD
    assert EmbOptimType.coerce(FbgemmOptim.EXACT_SGD) is EmbOptimType.SGD
    assert EmbOptimType.coerce(FbgemmOptim.ADAM) is EmbOptimType.ADAM
    assert EmbOptimType.coerce(FbgemmOptim.LAMB) is EmbOptimType.LAMB
    assert EmbOptimType.coerce(FbgemmOptim.PARTIAL_ROWWISE_ADAM) is EmbOptimType.PARTIAL_ROWWISE_ADAM
    with pytest.raises(ValueError):
        EmbOptimType.coerce(FbgemmOptim.SHAMPOO)
