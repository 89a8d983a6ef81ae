"""Edge cases of the torch kernel's lookup and fused update against plain PyTorch references.

The references here are written out independently of lightrec: ``F.embedding_bag`` / ``F.embedding``
per feature on ordinary leaf tensors (dense autograd gradients, duplicates summed by autograd) and
``torch.optim`` optimizers stepped on those leaves. Every id of a table occurs in each batch, so a
dense ``torch.optim`` step touches the same rows as the fused (row-sparse) one.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightrec.kernels import BatchedEmbedding, BatchedEmbeddingBag, EmbOptimType, FusedOptimizerSpec
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import WeightDecayMode
from lightrec.sparse import SparseValueError

# Two tables of different dims (two dim groups), table 0 read by features 0 and 2; B = 2.
_TABLES = [(4, 4), (3, 8)]
_FTM = [0, 1, 0]
_BATCH = 2
# Every row of both tables occurs (table 0 several times, from two features); bag (f1, s0) is empty.
_INDICES = [1, 0, 1, 2, 3, 0, 2, 1, 2, 2, 3, 0]
_OFFSETS = [0, 3, 5, 5, 8, 10, 12]
_WIDTH = 4 + 8 + 4


def _reference_pool(
    weights: list[torch.Tensor], indices: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None, mode: str
) -> torch.Tensor:
    """``[B, sum D]``: one ``F.embedding_bag`` per feature; a weighted mean is the weighted sum over the bag's length."""
    outs = []
    for f, t in enumerate(_FTM):
        lo, hi = int(offsets[f * _BATCH]), int(offsets[(f + 1) * _BATCH])
        offs = offsets[f * _BATCH : (f + 1) * _BATCH + 1].long() - lo
        w = psw[lo:hi].to(weights[t].dtype) if psw is not None else None
        ids = indices[lo:hi].long()
        if mode == "mean" and w is not None:
            out = F.embedding_bag(ids, weights[t], offs, mode="sum", per_sample_weights=w, include_last_offset=True)
            out = out / (offs[1:] - offs[:-1]).clamp(min=1).unsqueeze(1).to(out.dtype)
        else:
            out = F.embedding_bag(ids, weights[t], offs, mode=mode, per_sample_weights=w, include_last_offset=True)
        outs.append(out)
    return torch.cat(outs, dim=1)


def _module(pooling: PoolingType, spec: FusedOptimizerSpec | None, dtype: torch.dtype = torch.float32) -> BatchedEmbeddingBag:
    torch.manual_seed(0)
    return BatchedEmbeddingBag(_TABLES, _FTM, pooling, optimizer=spec, kernel_backend="torch").to(dtype)


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
@pytest.mark.parametrize(
    "table_dtype,weight_dtype",
    [(torch.float32, torch.float64), (torch.float16, torch.float32), (torch.bfloat16, torch.float32)],
)
def test_dense_grads_with_per_sample_weights_of_another_dtype(
    pooling: PoolingType, table_dtype: torch.dtype, weight_dtype: torch.dtype
) -> None:
    """Without a fused optimizer, weighted MEAN pooling with weights of another dtype than the table
    (float64 on float32, float32 on float16) gave index_add_'s "self (Float) and source (Double) must
    have the same scalar type" in backward; the gradients must be the reference's."""
    module = _module(pooling, None, table_dtype)
    indices, offsets = torch.tensor(_INDICES), torch.tensor(_OFFSETS)
    psw = torch.linspace(0.5, 2.0, len(_INDICES), dtype=weight_dtype)
    grad = torch.randn(_BATCH, _WIDTH, generator=torch.Generator().manual_seed(1))
    out = module(indices, offsets, psw)
    (out.double() * grad.double()).sum().backward()

    ref_w = [w.detach().double().requires_grad_(True) for w in module.split_embedding_weights()]
    ref = _reference_pool(ref_w, indices, offsets, psw.double(), pooling.value.lower())
    (ref * grad.double()).sum().backward()
    tol = 1e-5 if table_dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), ref.detach(), rtol=tol, atol=tol)
    for p, r in zip(module.weights.values(), ref_w, strict=True):
        assert p.grad is not None and p.grad.dtype == table_dtype
        torch.testing.assert_close(p.grad.double(), r.grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", [EmbOptimType.SGD, EmbOptimType.ROWWISE_ADAGRAD, EmbOptimType.ADAM])
@pytest.mark.parametrize("table_dtype", [torch.float16, torch.bfloat16])
def test_fused_half_table_weighted_mean_with_float32_weights(kind: EmbOptimType, table_dtype: torch.dtype) -> None:
    """A float16 / bfloat16 table ("16-true") fed float32 per-id weights from the data loader, MEAN
    pooled: the fused update failed in backward (index_add_ of float32 contributions into the half
    table); it must train like a float32 reference rounded to the table's dtype after every step."""
    spec = FusedOptimizerSpec(kind, learning_rate=0.05, eps=1e-6)
    module = _module(PoolingType.MEAN, spec, table_dtype)
    indices, offsets = torch.tensor(_INDICES), torch.tensor(_OFFSETS)
    ref_w = [w.detach().float().clone().requires_grad_(True) for w in module.split_embedding_weights()]
    ref_opt = _torch_optimizer(kind, ref_w, 0.05, 1e-6)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        psw = torch.rand(len(_INDICES), generator=gen) + 0.5
        grad = torch.randn(_BATCH, _WIDTH, generator=gen)
        (module(indices, offsets, psw).float() * grad).sum().backward()
        (_reference_pool(ref_w, indices, offsets, psw, "mean") * grad).sum().backward()
        ref_opt.step()
        ref_opt.zero_grad()
        with torch.no_grad():  # the table holds the rounded rows
            for r in ref_w:
                r.copy_(r.to(table_dtype).float())
    for w, r in zip(module.split_embedding_weights(), ref_w, strict=True):
        assert w.dtype == table_dtype
        torch.testing.assert_close(w.float(), r.detach(), rtol=1e-2, atol=1e-2)


def _torch_optimizer(
    kind: EmbOptimType, params: list[torch.Tensor], lr: float, eps: float
) -> torch.optim.Optimizer | _RowWiseAdagradReference:
    if kind == EmbOptimType.SGD:
        return torch.optim.SGD(params, lr=lr)
    if kind == EmbOptimType.ADAM:
        return torch.optim.Adam(params, lr=lr, eps=eps)
    return _RowWiseAdagradReference(params, lr, eps)


class _RowWiseAdagradReference:
    """fbgemm's exact row-wise Adagrad on dense gradients: ``m += mean(g*g)``, ``w -= lr * g / (sqrt(m) + eps)``."""

    def __init__(self, params: list[torch.Tensor], lr: float, eps: float) -> None:
        self.params = params
        self.param_groups: list[dict[str, float]] = [{"lr": lr, "eps": eps}]
        self.state = {p: {"momentum1": torch.zeros(p.shape[0], dtype=p.dtype)} for p in params}

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        for p in self.params:
            if p.grad is None:
                continue
            m = self.state[p]["momentum1"]
            m += p.grad.square().mean(dim=1)
            p -= group["lr"] * p.grad / (m.sqrt() + group["eps"]).unsqueeze(1)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


@pytest.mark.parametrize(
    "kind,wd,mode",
    [
        (EmbOptimType.ADAGRAD, 0.1, WeightDecayMode.L2),
        (EmbOptimType.ADAM, 0.1, WeightDecayMode.L2),
        (EmbOptimType.ADAM, 0.1, WeightDecayMode.DECOUPLED),
        (EmbOptimType.SGD, 0.1, WeightDecayMode.L2),
        (EmbOptimType.ROWWISE_ADAGRAD, 0.0, WeightDecayMode.NONE),
    ],
)
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_three_steps_with_lr_change_match_torch_optim(
    kind: EmbOptimType, wd: float, mode: WeightDecayMode, id_dtype: torch.dtype, pooling: PoolingType
) -> None:
    """Weights and optimizer state after 3 steps (duplicates, an empty bag, weighted bags, mixed dims,
    int32 or int64 ids and offsets, the learning rate changed between steps) equal torch.optim's
    (Adagrad / Adam with ``weight_decay``: L2; AdamW: decoupled) on dense gradients."""
    spec = FusedOptimizerSpec(kind, learning_rate=0.1, eps=1e-6, weight_decay=wd, weight_decay_mode=mode)
    module = _module(pooling, spec)
    ref_w = [w.detach().clone().requires_grad_(True) for w in module.split_embedding_weights()]
    ref_opt: torch.optim.Optimizer | _RowWiseAdagradReference
    if kind == EmbOptimType.ADAGRAD:
        ref_opt = torch.optim.Adagrad(ref_w, lr=0.1, eps=1e-6, weight_decay=wd)
    elif kind == EmbOptimType.ADAM and mode == WeightDecayMode.DECOUPLED:
        ref_opt = torch.optim.AdamW(ref_w, lr=0.1, eps=1e-6, weight_decay=wd)
    elif kind == EmbOptimType.ADAM:
        ref_opt = torch.optim.Adam(ref_w, lr=0.1, eps=1e-6, weight_decay=wd)
    elif kind == EmbOptimType.SGD:
        ref_opt = torch.optim.SGD(ref_w, lr=0.1, weight_decay=wd)
    else:
        ref_opt = _RowWiseAdagradReference(ref_w, 0.1, 1e-6)
    indices, offsets = torch.tensor(_INDICES, dtype=id_dtype), torch.tensor(_OFFSETS, dtype=id_dtype)
    gen = torch.Generator().manual_seed(3)
    for lr in (0.1, 0.03, 0.2):
        module.fused_optimizer.param_groups[0]["lr"] = lr
        for group in ref_opt.param_groups:
            group["lr"] = lr
        psw = torch.rand(len(_INDICES), generator=gen) + 0.5
        grad = torch.randn(_BATCH, _WIDTH, generator=gen)
        (module(indices, offsets, psw) * grad).sum().backward()
        (_reference_pool(ref_w, indices, offsets, psw, pooling.value.lower()) * grad).sum().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for w, r in zip(module.split_embedding_weights(), ref_w, strict=True):
        torch.testing.assert_close(w, r.detach(), rtol=1e-5, atol=1e-6)
    names = {
        EmbOptimType.ADAGRAD: {"momentum1": "sum"},
        EmbOptimType.ADAM: {"momentum1": "exp_avg", "momentum2": "exp_avg_sq"},
        EmbOptimType.ROWWISE_ADAGRAD: {"momentum1": "momentum1"},
        EmbOptimType.SGD: {},
    }[kind]
    state = module.fused_optimizer.state_dict()["state"]
    for table, r in zip(module.table_names, ref_w, strict=True):
        for ours, theirs in names.items():
            torch.testing.assert_close(state[f"weights.{table}"][ours], ref_opt.state[r][theirs], rtol=1e-5, atol=1e-7)
        if kind == EmbOptimType.ADAM:
            assert int(state[f"weights.{table}"]["step"]) == 3


def test_unpooled_lookup_with_a_shared_table_matches_embedding_and_adagrad() -> None:
    """BatchedEmbedding (one row per id; features 0 and 2 share table 0) after 3 steps equals
    ``F.embedding`` per feature with torch.optim.Adagrad, state included."""
    torch.manual_seed(0)
    spec = FusedOptimizerSpec(EmbOptimType.ADAGRAD, learning_rate=0.1, eps=1e-6)
    module = BatchedEmbedding([(4, 4), (3, 4)], _FTM, optimizer=spec, kernel_backend="torch")
    ref_w = [w.detach().clone().requires_grad_(True) for w in module.split_embedding_weights()]
    ref_opt = torch.optim.Adagrad(ref_w, lr=0.1, eps=1e-6)
    indices, offsets = torch.tensor(_INDICES), torch.tensor(_OFFSETS)
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        grad = torch.randn(len(_INDICES), 4, generator=gen)
        (module(indices, offsets) * grad).sum().backward()
        parts = []
        for f, t in enumerate(_FTM):
            lo, hi = _OFFSETS[f * _BATCH], _OFFSETS[(f + 1) * _BATCH]
            parts.append(F.embedding(indices[lo:hi], ref_w[t]))
        (torch.cat(parts) * grad).sum().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for w, r in zip(module.split_embedding_weights(), ref_w, strict=True):
        torch.testing.assert_close(w, r.detach(), rtol=1e-5, atol=1e-6)
    state = module.fused_optimizer.state_dict()["state"]
    for table, r in zip(module.table_names, ref_w, strict=True):
        torch.testing.assert_close(state[f"weights.{table}"]["momentum1"], ref_opt.state[r]["sum"])


@pytest.mark.parametrize("offsets", [[0, 2, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 3], [3, 3, 3, 3, 3, 3, 3]])
def test_offsets_past_empty_indices_are_refused(offsets: list[int]) -> None:
    """With no ids at all, offsets that are not all 0 point past the end of ``indices``: the check
    skipped them and the kernel read out of bounds (a segmentation fault or garbage rows)."""
    module = _module(PoolingType.SUM, FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=0.1))
    with pytest.raises((ValueError, SparseValueError), match="offsets must start at 0|negative length"):
        module(torch.zeros(0, dtype=torch.long), torch.tensor(offsets))


def test_ids_without_bags_are_refused() -> None:
    """A batch of 0 bags (offsets ``[0]``) with ids: the ids belong to no bag; an unpooled lookup returned
    ``[N, D]`` zeros for them instead of saying the offsets are wrong."""
    module = BatchedEmbedding([(4, 4)], kernel_backend="torch")
    with pytest.raises(ValueError, match=r"offsets must start at 0 and end at len\(indices\)=3"):
        module(torch.tensor([1, 2, 3]), torch.tensor([0]))


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_all_bags_empty_gives_zeros_and_no_update(pooling: PoolingType) -> None:
    module = _module(pooling, FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=0.1))
    before = [w.clone() for w in module.split_embedding_weights()]
    out = module(torch.zeros(0, dtype=torch.int32), torch.zeros(len(_FTM) * _BATCH + 1, dtype=torch.int32))
    assert out.shape == (_BATCH, _WIDTH) and not out.any()
    out.sum().backward()
    for b, w in zip(before, module.split_embedding_weights(), strict=True):
        assert torch.equal(b, w)
