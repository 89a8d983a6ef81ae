"""BatchedEmbeddingBag / BatchedEmbedding against plain-PyTorch references, on both backends."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from lightrec._fbgemm import fbgemm_available
from lightrec.kernels import (
    BatchedEmbedding,
    BatchedEmbeddingBag,
    EmbOptimType,
    FusedOptimizerSpec,
    fbgemm_supports,
)
from lightrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from lightrec.modules.feature_checks import EmbeddingIdError
from lightrec.optim import CombinedOptimizer
from lightrec.sparse import SparseValueError
from tests.kernels.reference import LAYOUTS, ReferenceOptimizer, pooled_reference, random_batch, touched_rows

BACKENDS = [
    "torch",
    pytest.param("fbgemm", marks=pytest.mark.skipif(not fbgemm_available(), reason="fbgemm absent")),
]

# (our kind, reference kind, weight decay, mode)
OPTIMIZER_CASES = [
    (EmbOptimType.SGD, "sgd", 0.0, "none"),
    (EmbOptimType.SGD, "sgd", 0.1, "l2"),
    (EmbOptimType.ADAGRAD, "adagrad", 0.0, "none"),
    (EmbOptimType.ADAGRAD, "adagrad", 0.1, "decoupled"),
    (EmbOptimType.ROWWISE_ADAGRAD, "rowwise_adagrad", 0.0, "none"),
    (EmbOptimType.ROWWISE_ADAGRAD, "rowwise_adagrad", 0.1, "l2"),
    (EmbOptimType.ROWWISE_ADAGRAD, "rowwise_adagrad", 0.1, "decoupled"),
    (EmbOptimType.ADAM, "adam", 0.0, "none"),
    (EmbOptimType.ADAM, "adam", 0.1, "l2"),
    (EmbOptimType.ADAM, "adam", 0.1, "decoupled"),
    # torchrec's LAMB / LarsSGD / PartialRowWise* (weight decay is part of their rule; mode unused)
    (EmbOptimType.LAMB, "lamb", 0.0, "none"),
    (EmbOptimType.LAMB, "lamb", 0.1, "l2"),
    (EmbOptimType.PARTIAL_ROWWISE_LAMB, "partial_rowwise_lamb", 0.1, "l2"),
    (EmbOptimType.PARTIAL_ROWWISE_ADAM, "partial_rowwise_adam", 0.0, "none"),
    (EmbOptimType.PARTIAL_ROWWISE_ADAM, "partial_rowwise_adam", 0.1, "l2"),
    (EmbOptimType.LARS_SGD, "lars_sgd", 0.0, "none"),
    (EmbOptimType.LARS_SGD, "lars_sgd", 0.1, "l2"),
]


def _spec(kind: EmbOptimType, wd: float, mode: str, lr: float = 0.1) -> FusedOptimizerSpec:
    return FusedOptimizerSpec(
        kind, learning_rate=lr, eps=1e-6, weight_decay=wd, weight_decay_mode=mode or "l2"
    )


def _build(
    layout: str, backend: str, spec: FusedOptimizerSpec | None, pooling=PoolingType.SUM, device: str = "cpu"
) -> BatchedEmbeddingBag:
    tables, ftm = LAYOUTS[layout]
    if backend == "fbgemm":
        reason = fbgemm_supports(spec, torch.device(device), [d for _, d in tables], pooling, ftm)
        if reason:
            pytest.skip(reason)
    torch.manual_seed(0)
    return BatchedEmbeddingBag(tables, ftm, pooling, optimizer=spec, kernel_backend=backend, device=device)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_output_matches_embedding_bag(
    backend: str, layout: str, pooling: PoolingType, weighted: bool, device: torch.device
) -> None:
    spec = _spec(EmbOptimType.SGD, 0.0, "none")
    module = _build(layout, backend, spec, pooling, device.type)
    tables, ftm = LAYOUTS[layout]
    b = random_batch(
        torch.Generator().manual_seed(1), [r for r, _ in tables], ftm, batch=6, weighted=weighted
    )
    weights = b.weights.to(device) if b.weights is not None else None
    out = module(b.indices.to(device), b.offsets.to(device), weights)
    ref = pooled_reference(
        [w.detach().cpu() for w in module.split_embedding_weights()], ftm, b, pooling.value.lower()
    )
    assert out.shape == (6, sum(tables[t][1] for t in ftm)) and out.device.type == device.type
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-6)


def test_matches_nn_embedding_bag_module() -> None:
    bag = torch.nn.EmbeddingBag(20, 8, mode="sum", include_last_offset=True)
    module = BatchedEmbeddingBag([(20, 8)], kernel_backend="torch")
    with torch.no_grad():
        module.split_embedding_weights()[0].copy_(bag.weight)
    b = random_batch(torch.Generator().manual_seed(3), [20], [0], batch=7, weighted=False)
    torch.testing.assert_close(module(b.indices, b.offsets), bag(b.indices, b.offsets))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", OPTIMIZER_CASES, ids=lambda c: f"{c[1]}-{c[3]}")
def test_fused_optimizer_matches_reference(backend: str, layout: str, case: tuple, device: torch.device) -> None:
    """On CPU, and with ``-m gpu`` on CUDA (where fbgemm also runs Adam, LAMB, LARS and the partial
    row-wise rules), against the plain-PyTorch reference stepped on CPU."""
    kind, ref_kind, wd, mode = case
    spec = _spec(kind, wd, mode)
    pooling = PoolingType.MEAN if layout == "mixed_shared" else PoolingType.SUM
    module = _build(layout, backend, spec, pooling, device.type)
    tables, ftm = LAYOUTS[layout]
    ref_w = [w.detach().cpu().clone().requires_grad_(True) for w in module.split_embedding_weights()]
    ref_opt = ReferenceOptimizer(ref_kind, ref_w, lr=0.1, eps=1e-6, wd=wd, wd_mode=mode)
    gen = torch.Generator().manual_seed(2)
    # CUDA reduces in another order (atomics): a looser bound there, the exact one on CPU.
    tol = {"rtol": 1e-5, "atol": 1e-6} if device.type == "cpu" else {"rtol": 1e-4, "atol": 1e-5}
    for _ in range(4):
        b = random_batch(gen, [r for r, _ in tables], ftm, batch=5, weighted=(layout == "uniform_shared"))
        grad_scale = torch.randn(5, sum(tables[t][1] for t in ftm), generator=gen)
        weights = b.weights.to(device) if b.weights is not None else None
        (module(b.indices.to(device), b.offsets.to(device), weights) * grad_scale.to(device)).sum().backward()
        ref_out = pooled_reference(ref_w, ftm, b, pooling.value.lower())
        (ref_out * grad_scale).sum().backward()
        ref_opt.step(ref_w, touched_rows(ftm, len(tables), b))
    for w, r in zip(module.split_embedding_weights(), ref_w, strict=True):
        torch.testing.assert_close(w.cpu(), r.detach(), **tol)
    state = module.fused_optimizer.state_dict()["state"]
    for name, ref_state in zip(module.table_names, ref_opt.state, strict=True):
        for key, value in ref_state.items():
            torch.testing.assert_close(state[f"weights.{name}"][key].cpu(), value, rtol=tol["rtol"], atol=tol["atol"] / 10)
    if ref_kind in ("adam", "lamb", "partial_rowwise_lamb", "partial_rowwise_adam"):
        assert float(state[f"weights.{module.table_names[0]}"]["step"]) == 4


@pytest.mark.parametrize("kind", [EmbOptimType.SGD, EmbOptimType.ADAGRAD])
def test_fused_matches_torch_optim_without_weight_decay(kind: EmbOptimType) -> None:
    """SGD / Adagrad without decay: dense torch.optim gives the same rows (untouched rows get 0 grads)."""
    module = _build("uniform_shared", "torch", FusedOptimizerSpec(kind, learning_rate=0.05, eps=1e-10))
    tables, ftm = LAYOUTS["uniform_shared"]
    ref_w = [w.detach().clone().requires_grad_(True) for w in module.split_embedding_weights()]
    opt = (
        torch.optim.SGD(ref_w, lr=0.05)
        if kind == EmbOptimType.SGD
        else torch.optim.Adagrad(ref_w, lr=0.05, eps=1e-10)
    )
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        b = random_batch(gen, [r for r, _ in tables], ftm, batch=4, weighted=False)
        module(b.indices, b.offsets).square().sum().backward()
        opt.zero_grad()
        pooled_reference(ref_w, ftm, b, "sum").square().sum().backward()
        opt.step()
    for w, r in zip(module.split_embedding_weights(), ref_w, strict=True):
        torch.testing.assert_close(w, r.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm absent")
@pytest.mark.parametrize("kind", [EmbOptimType.SGD, EmbOptimType.ADAGRAD, EmbOptimType.ROWWISE_ADAGRAD])
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_backends_agree_after_training(kind: EmbOptimType, pooling: PoolingType) -> None:
    """Weighted bags, both poolings (fbgemm's own weighted-MEAN backward drops 1/len; we route around it)."""
    spec = FusedOptimizerSpec(kind, learning_rate=0.2)
    a, b_mod = _build("uniform", "torch", spec, pooling), _build("uniform", "fbgemm", spec, pooling)
    tables, ftm = LAYOUTS["uniform"]
    gen = torch.Generator().manual_seed(7)
    for _ in range(5):
        b = random_batch(gen, [r for r, _ in tables], ftm, batch=8, weighted=True)
        out_a, out_b = a(b.indices, b.offsets, b.weights), b_mod(b.indices, b.offsets, b.weights)
        torch.testing.assert_close(out_a, out_b, rtol=1e-5, atol=1e-6)
        out_a.sum().backward()
        out_b.sum().backward()
    for wa, wb in zip(a.split_embedding_weights(), b_mod.split_embedding_weights(), strict=True):
        torch.testing.assert_close(wa, wb, rtol=1e-5, atol=1e-6)


def test_non_fused_mode_gives_dense_grads_like_embedding_bag() -> None:
    module = _build("mixed_shared", "torch", None, PoolingType.MEAN)
    tables, ftm = LAYOUTS["mixed_shared"]
    ref_w = [w.detach().clone().requires_grad_(True) for w in module.split_embedding_weights()]
    b = random_batch(torch.Generator().manual_seed(9), [r for r, _ in tables], ftm, batch=4, weighted=False)
    scale = torch.randn(4, sum(tables[t][1] for t in ftm))
    (module(b.indices, b.offsets) * scale).sum().backward()
    (pooled_reference(ref_w, ftm, b, "mean") * scale).sum().backward()
    names = [n for n, _ in module.named_parameters()]
    assert names == [f"weights.{n}" for n in module.table_names]
    for p, r in zip(module.parameters(), ref_w, strict=True):
        torch.testing.assert_close(p.grad, r.grad)
    torch.optim.SGD(module.parameters(), lr=1.0).step()  # dense optimizer writes through to the storage
    out_after = module(b.indices, b.offsets)
    ref_after = pooled_reference([(r - r.grad).detach() for r in ref_w], ftm, b, "mean")
    torch.testing.assert_close(out_after, ref_after)


@pytest.mark.parametrize("backend", BACKENDS)
def test_learning_rate_change_at_run_time(backend: str) -> None:
    spec = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.5, eps=1e-6)
    module = _build("uniform", backend, spec)
    tables, ftm = LAYOUTS["uniform"]
    ref_w = [w.detach().clone().requires_grad_(True) for w in module.split_embedding_weights()]
    ref_opt = ReferenceOptimizer("rowwise_adagrad", ref_w, lr=0.5, eps=1e-6, wd=0.0, wd_mode="none")
    combined = CombinedOptimizer([module.fused_optimizer])
    scheduler = torch.optim.lr_scheduler.StepLR(combined, step_size=1, gamma=0.1)
    gen = torch.Generator().manual_seed(11)
    for _ in range(3):
        b = random_batch(gen, [r for r, _ in tables], ftm, batch=4, weighted=False)
        module(b.indices, b.offsets).sum().backward()
        pooled_reference(ref_w, ftm, b, "sum").sum().backward()
        ref_opt.step(ref_w, touched_rows(ftm, len(tables), b))
        combined.step()
        scheduler.step()
        ref_opt.lr *= 0.1
    assert module.fused_optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-3)
    for w, r in zip(module.split_embedding_weights(), ref_w, strict=True):
        torch.testing.assert_close(w, r.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", [EmbOptimType.ROWWISE_ADAGRAD, EmbOptimType.ADAGRAD, EmbOptimType.ADAM])
def test_state_round_trip_continues_bit_identically(backend: str, kind: EmbOptimType) -> None:
    spec = FusedOptimizerSpec(kind, learning_rate=0.1)
    first = _build("uniform", backend, spec)
    tables, ftm = LAYOUTS["uniform"]
    gen = torch.Generator().manual_seed(13)
    batches = [random_batch(gen, [r for r, _ in tables], ftm, batch=4, weighted=False) for _ in range(5)]
    for b in batches[:2]:
        first(b.indices, b.offsets).sum().backward()
    module_sd = copy.deepcopy(first.state_dict())
    optim_sd = copy.deepcopy(first.fused_optimizer.state_dict())
    torch.manual_seed(99)  # the new module starts from different weights and empty state
    second = BatchedEmbeddingBag(tables, ftm, optimizer=spec, kernel_backend=backend)
    second.load_state_dict(module_sd)
    second.fused_optimizer.load_state_dict(optim_sd)
    for b in batches[2:]:
        out1, out2 = first(b.indices, b.offsets), second(b.indices, b.offsets)
        assert torch.equal(out1, out2)
        out1.sum().backward()
        out2.sum().backward()
    for w1, w2 in zip(first.split_embedding_weights(), second.split_embedding_weights(), strict=True):
        assert torch.equal(w1, w2)
    s1, s2 = first.fused_optimizer.state_dict()["state"], second.fused_optimizer.state_dict()["state"]
    for name in s1:
        for key in s1[name]:
            assert torch.equal(torch.as_tensor(s1[name][key]), torch.as_tensor(s2[name][key]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_id_names_table_and_id(backend: str) -> None:
    module = _build("uniform", backend, FusedOptimizerSpec(EmbOptimType.SGD))
    # features f0 (t0, 20 rows), f1 (t1, 30 rows), f2 (t2, 25 rows); B=1
    with pytest.raises(EmbeddingIdError, match=r"id 27 .*table 't2' with 25 rows"):
        module(torch.tensor([1, 29, 27]), torch.tensor([0, 1, 2, 3]))
    with pytest.raises(EmbeddingIdError, match=r"id -1 .*table 't0'"):
        module(torch.tensor([-1, 2, 3]), torch.tensor([0, 1, 2, 3]))
    with pytest.raises(SparseValueError, match=r"feature 1 \(table 't1'\) has a negative length: -1 ids for sample 0"):
        module(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 1, 3]))
    with pytest.raises(ValueError, match="T\\*B \\+ 1"):
        module(torch.tensor([1, 2]), torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_unpooled_lookup_and_fused_update(backend: str) -> None:
    spec = FusedOptimizerSpec(EmbOptimType.ADAGRAD, learning_rate=0.1, eps=1e-6)
    # fbgemm's CPU Adagrad is exact only when no table is shared (see fbgemm_backend)
    tables, ftm = [(20, 8), (30, 8)], ([0, 1] if backend == "fbgemm" else [0, 1, 0])
    torch.manual_seed(0)
    module = BatchedEmbedding(tables, ftm, optimizer=spec, kernel_backend=backend)
    ref_w = [w.detach().clone().requires_grad_(True) for w in module.split_embedding_weights()]
    ref_opt = ReferenceOptimizer("adagrad", ref_w, lr=0.1, eps=1e-6, wd=0.0, wd_mode="none")
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        b = random_batch(gen, [20, 30], ftm, batch=3, weighted=False)
        out = module(b.indices, b.offsets)
        parts = []
        for f, t in enumerate(ftm):
            lo, hi = int(b.offsets[f * 3]), int(b.offsets[(f + 1) * 3])
            parts.append(F.embedding(b.indices[lo:hi], ref_w[t]))
        ref = torch.cat(parts)
        torch.testing.assert_close(out, ref.detach())
        scale = torch.randn(out.shape, generator=gen)
        (out * scale).sum().backward()
        (ref * scale).sum().backward()
        ref_opt.step(ref_w, touched_rows(ftm, 2, b))
    assert module.backend_name == backend
    for w, r in zip(module.split_embedding_weights(), ref_w, strict=True):
        torch.testing.assert_close(w, r.detach(), rtol=1e-5, atol=1e-6)


def test_backend_selection_and_repr() -> None:
    sgd = FusedOptimizerSpec(EmbOptimType.SGD)
    auto = BatchedEmbeddingBag([(10, 8)], optimizer=sgd)
    assert auto.backend_name == ("fbgemm" if fbgemm_available() else "torch")
    assert f"kernel_backend='{auto.backend_name}'" in repr(auto)
    # Adam has no CPU fbgemm kernel; non-fused lookups need fbgemm's CUDA-only OptimType.NONE.
    assert (
        BatchedEmbeddingBag([(10, 8)], optimizer=FusedOptimizerSpec(EmbOptimType.ADAM)).backend_name
        == "torch"
    )
    assert BatchedEmbeddingBag([(10, 8)]).backend_name == "torch"
    with pytest.raises(ValueError, match="kernel_backend='fbgemm' cannot serve"):
        BatchedEmbeddingBag([(10, 8)], optimizer=FusedOptimizerSpec(EmbOptimType.ADAM), kernel_backend="fbgemm")
    with pytest.raises(ValueError, match="backend must be one of"):
        BatchedEmbeddingBag([(10, 8)], kernel_backend="cuda")


def test_configs_initialise_weights_and_names() -> None:
    configs = [
        EmbeddingBagConfig(
            num_embeddings=10, embedding_dim=4, name="a", feature_names=["fa"], init_fn=lambda w: w.fill_(0.5)
        ),
        EmbeddingBagConfig(num_embeddings=12, embedding_dim=4, name="b", feature_names=["fb"]),
    ]
    module = BatchedEmbeddingBag(configs, optimizer={"optimizer": "sgd", "learning_rate": 0.1})
    a, b = module.split_embedding_weights()
    assert torch.equal(a, torch.full((10, 4), 0.5))
    assert b.abs().max() <= configs[1].get_weight_init_max()
    assert list(module.state_dict()) == ["weights.a", "weights.b"]
    assert all(hasattr(p, "_in_backward_optimizers") for p in module.parameters())


def test_torch_backend_moves_with_module_and_keeps_aliasing() -> None:
    module = BatchedEmbeddingBag(
        [(10, 4), (6, 4)], optimizer=FusedOptimizerSpec(EmbOptimType.ADAGRAD), kernel_backend="torch"
    )
    module.double()
    w = module.split_embedding_weights()[1]
    assert w.dtype == torch.float64
    out = module(torch.tensor([3, 2]), torch.tensor([0, 1, 2]))
    out.sum().backward()
    assert out.dtype == torch.float64
    # the update landed in the parameter the module exposes (and the optimizer state follows the move)
    assert module.fused_optimizer.state[w]["momentum1"].dtype == torch.float64
    assert float(module.fused_optimizer.state[w]["momentum1"][2].sum()) == pytest.approx(4.0)


def _train_like_the_reference(backend: str, kind: EmbOptimType | None, pooling: PoolingType, lr: float, seed: int,
                              atol: float, batch: int, **batch_kwargs: Any) -> None:  # fmt: skip
    """Three steps of a "uniform" module against the plain-PyTorch reference: the forward, then the fused
    update (``kind``) or, unfused (None), the gradients autograd gives; the weights at the end."""
    spec = None if kind is None else FusedOptimizerSpec(kind, learning_rate=lr, eps=1e-6)
    module = _build("uniform", backend, spec, pooling)
    tables, ftm = LAYOUTS["uniform"]
    ref_w = [w.detach().clone().requires_grad_(True) for w in module.split_embedding_weights()]
    ref_opt = ReferenceOptimizer(kind.name.lower() if kind else "sgd", ref_w, lr=lr, eps=1e-6, wd=0.0, wd_mode="none")
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        b = random_batch(gen, [r for r, _ in tables], ftm, batch=batch, weighted=True, **batch_kwargs)
        out = module(b.indices, b.offsets, b.weights)
        ref = pooled_reference(ref_w, ftm, b, pooling.value.lower())
        torch.testing.assert_close(out, ref.detach(), rtol=1e-5, atol=atol)
        scale = torch.randn(out.shape, generator=gen)
        (out * scale).sum().backward()
        (ref * scale).sum().backward()
        if kind is None:  # non-fused: dense gradients as autograd gives them; nothing is updated
            for p, r in zip(module.parameters(), ref_w, strict=True):
                torch.testing.assert_close(p.grad, r.grad)
                p.grad, r.grad = None, None
        else:
            ref_opt.step(ref_w, touched_rows(ftm, len(tables), b))
    for w, r in zip(module.split_embedding_weights(), ref_w, strict=True):
        torch.testing.assert_close(w, r.detach(), rtol=1e-5, atol=atol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", [None, EmbOptimType.SGD, EmbOptimType.ROWWISE_ADAGRAD])
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_one_id_per_bag_batches(backend: str, kind: EmbOptimType | None, pooling: PoolingType) -> None:
    """The torch backend gathers rows directly when every bag has one id; same numbers as the general path."""
    if backend == "fbgemm" and kind is None:
        pytest.skip("non-fused lookups use the torch backend")
    _train_like_the_reference(backend, kind, pooling, lr=0.1, seed=21, atol=1e-6, batch=6, one_per_bag=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", [EmbOptimType.SGD, EmbOptimType.ROWWISE_ADAGRAD])
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_long_bags_train_like_the_reference(backend: str, kind: EmbOptimType, pooling: PoolingType) -> None:
    """Bags of ~32-40 ids (the long-bag case the CPU kernel choice measures): both kernels' forward and
    fused update equal the plain-PyTorch reference, with every row hit many times per step."""
    _train_like_the_reference(backend, kind, pooling, lr=0.05, seed=40, atol=1e-5, batch=4, max_len=80)  # mean 40 ids


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_cuda_lookup_trains_like_cpu(backend: str) -> None:
    """Opt-in (-m gpu): the same lookup and fused update on CUDA as on CPU."""
    spec = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.1)
    tables, ftm = LAYOUTS["uniform"]
    cpu = BatchedEmbeddingBag(tables, ftm, optimizer=spec, kernel_backend="torch")
    gpu = BatchedEmbeddingBag(tables, ftm, optimizer=spec, kernel_backend=backend, device="cuda")
    gpu.load_state_dict(cpu.state_dict())
    gen = torch.Generator().manual_seed(17)
    for _ in range(3):
        b = random_batch(gen, [r for r, _ in tables], ftm, batch=8, weighted=True)
        out_c = cpu(b.indices, b.offsets, b.weights)
        out_g = gpu(b.indices.cuda(), b.offsets.cuda(), b.weights.cuda())
        torch.testing.assert_close(out_g.cpu(), out_c, rtol=1e-5, atol=1e-6)
        out_c.sum().backward()
        out_g.sum().backward()
    for wc, wg in zip(cpu.split_embedding_weights(), gpu.split_embedding_weights(), strict=True):
        torch.testing.assert_close(wg.cpu(), wc, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.NONE])
def test_empty_batch_output_has_the_weights_dtype(pooling: PoolingType) -> None:
    """A rank with no samples sends what the others send: the tables' dtype, not float32 (the
    empty-batch path is shared by every backend)."""
    if pooling == PoolingType.NONE:
        module = BatchedEmbedding([(10, 4)], kernel_backend="torch").double()
    else:
        module = BatchedEmbeddingBag([(10, 4), (6, 4)], kernel_backend="torch").double()
    out = module(torch.zeros(0, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    assert out.dtype == torch.float64 and out.shape == ((0, 8) if pooling == PoolingType.SUM else (0, 4))
    out.sum().backward()


def test_adam_step_counts_past_float32_precision() -> None:
    """Adam's ``t`` is an int64 (fbgemm's ``iter``): a float32 counter would stop at 2^24 (the Triton
    twin is in ``test_triton_edge_cases``)."""
    spec = FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=0.1)
    module = BatchedEmbeddingBag([(10, 4)], optimizer=spec, kernel_backend="torch")
    step = module.fused_optimizer.state_dict()["state"]["weights.t0"]["step"]
    assert step.dtype == torch.int64
    step.fill_(2**24)
    module(torch.tensor([1, 2]), torch.tensor([0, 1, 2])).sum().backward()
    assert int(step) == 2**24 + 1


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm absent")
@pytest.mark.parametrize("kind", [EmbOptimType.ADAGRAD, EmbOptimType.ROWWISE_ADAGRAD])
def test_fbgemm_host_storage_is_on_huge_pages_and_trains_the_same(kind: EmbOptimType) -> None:
    """fbgemm's ``weights_host`` / ``momentum1_host`` (>= 2 MiB) live in lightrec's huge-page buffers
    (``preallocated_host_buffers``): aligned to 2 MiB on Linux, and training through the TBE (forward
    and fused backward), the views of ``split_embedding_weights`` and the optimizer state all use that
    storage -- the torch kernel, trained the same way, ends with the same tables and state."""
    import sys

    from lightrec._host_memory import HUGE_PAGE_BYTES

    tables, ftm = [(6000, 64), (5000, 64)], [0, 1]  # 2.8 MB of weights: one huge page and more
    spec = FusedOptimizerSpec(kind, learning_rate=0.1, eps=1e-6)
    torch.manual_seed(3)
    fb = BatchedEmbeddingBag(tables, ftm, optimizer=spec, kernel_backend="fbgemm")
    tbe = fb._backend.tbe
    moved = [tbe.weights_host] + ([tbe.momentum1_host] if kind == EmbOptimType.ADAGRAD else [])
    if sys.platform.startswith("linux"):
        assert all(t.data_ptr() % HUGE_PAGE_BYTES == 0 for t in moved)
    assert isinstance(tbe.weights_host, torch.nn.Parameter)  # the same kind of holder as fbgemm built
    ref = BatchedEmbeddingBag(tables, ftm, optimizer=spec, kernel_backend="torch")
    with torch.no_grad():
        for w_ref, w_fb in zip(ref.split_embedding_weights(), fb.split_embedding_weights(), strict=True):
            w_ref.copy_(w_fb)
    gen = torch.Generator().manual_seed(11)
    for _ in range(4):
        ids = torch.cat([torch.randint(0, tables[t][0], (16,), generator=gen) for t in ftm])
        offsets = torch.arange(0, ids.numel() + 1, 2)  # 8 bags of 2 ids per feature
        grad = torch.randn(8, 2 * 64, generator=gen)
        out_fb, out_ref = fb(ids, offsets), ref(ids, offsets)
        torch.testing.assert_close(out_fb, out_ref, rtol=1e-5, atol=1e-6)
        (out_fb * grad).sum().backward()
        (out_ref * grad).sum().backward()
    for w_fb, w_ref in zip(fb.split_embedding_weights(), ref.split_embedding_weights(), strict=True):
        assert w_fb.untyped_storage().data_ptr() == tbe.weights_host.untyped_storage().data_ptr()
        torch.testing.assert_close(w_fb, w_ref, rtol=1e-5, atol=1e-6)
    state_fb, state_ref = fb.fused_optimizer.state_dict()["state"], ref.fused_optimizer.state_dict()["state"]
    for key in state_ref:
        torch.testing.assert_close(state_fb[key]["momentum1"], state_ref[key]["momentum1"], rtol=1e-5, atol=1e-7)


_P, _K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
# (name, kind, default) in signature order; pooling is BatchedEmbeddingBag's third positional
BATCHED_SIGNATURES: dict[type, list[tuple[str, object, object]]] = {
    BatchedEmbeddingBag: [
        ("tables", _P, inspect.Parameter.empty), ("feature_table_map", _P, None), ("pooling", _P, PoolingType.SUM),
        ("optimizer", _P, None), ("kernel_backend", _P, "auto"), ("device", _P, None),
        ("optimizer_param_names", _P, None), ("id_check", _P, "auto"), ("tiering", _K, None), ("backend", _K, None),
    ],
    BatchedEmbedding: [
        ("tables", _P, inspect.Parameter.empty), ("feature_table_map", _P, None),
        ("optimizer", _P, None), ("kernel_backend", _P, "auto"), ("device", _P, None),
        ("optimizer_param_names", _P, None), ("id_check", _P, "auto"), ("tiering", _K, None), ("backend", _K, None),
    ],
}


@pytest.mark.parametrize("cls", list(BATCHED_SIGNATURES), ids=lambda c: c.__name__)
def test_constructor_signature_is_unchanged(cls: type) -> None:
    params = inspect.signature(cls).parameters.values()
    assert [(p.name, p.kind, p.default) for p in params] == BATCHED_SIGNATURES[cls]


def test_positional_calls_reach_the_right_parameters() -> None:
    spec = _spec(EmbOptimType.SGD, 0.0, "none")
    bag = BatchedEmbeddingBag([(10, 4), (6, 4)], [0, 1, 1], PoolingType.MEAN, spec, "torch", "cpu", ["a", "b"], "sync")
    seq = BatchedEmbedding([(10, 4), (6, 4)], [0, 1, 1], spec, "torch", "cpu", ["a", "b"], "sync")
    for module, pooling in ((bag, PoolingType.MEAN), (seq, PoolingType.NONE)):
        assert module.feature_table_map == [0, 1, 1] and module.pooling == pooling
        assert module.backend_name == "torch" and module.id_check == "sync"
        assert list(module.fused_optimizer.params) == ["a", "b"]
