"""The native CPU fused update (``lightrec.kernels.cpu_update``) against the stock-op update.

The stock-op rule (``sparse_update.apply_sparse_update``) is the reference: de-duplicated rows,
summed gradients, one update per row. Batches draw their ids from a few rows, so every batch has
duplicate ids; each case runs several steps so optimizer state carries over.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lightrec._native import native_ops
from lightrec.kernels import BatchedEmbeddingBag, FusedOptimizerSpec
from lightrec.kernels.cpu_update import native_fused_update, native_update_available, new_scratch
from lightrec.kernels.sparse_update import apply_sparse_update
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import EmbOptimType, WeightDecayMode
from tests.kernels.reference import random_batch

pytestmark = pytest.mark.skipif(
    native_ops() is None,
    reason="the native ops could not be built here (a NativeUnavailableWarning says why)",
)

KINDS = [EmbOptimType.SGD, EmbOptimType.ADAGRAD, EmbOptimType.ROWWISE_ADAGRAD, EmbOptimType.ADAM]
DECAYS = [WeightDecayMode.NONE, WeightDecayMode.L2, WeightDecayMode.DECOUPLED]


def _spec(kind: EmbOptimType, decay: WeightDecayMode) -> FusedOptimizerSpec:
    wd = 0.0 if decay == WeightDecayMode.NONE else 0.05
    return FusedOptimizerSpec(kind, learning_rate=0.1, eps=1e-6, weight_decay=wd, weight_decay_mode=decay)


def _states(spec: FusedOptimizerSpec, rows: int, dim: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    shape = (rows,) if spec.optimizer == EmbOptimType.ROWWISE_ADAGRAD else (rows, dim)
    return {name: torch.rand(shape, dtype=dtype) for name in spec.state_names}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bags", ["per_id", "pooled"])
@pytest.mark.parametrize("dedupe", ["scratch", "table"])
def test_native_update_equals_stock_update_with_duplicate_ids(
    kind: EmbOptimType, decay: WeightDecayMode, dtype: torch.dtype, bags: str, dedupe: str
) -> None:
    gen = torch.Generator().manual_seed(7)
    rows, dim, n = 40, 12, 300
    spec = _spec(kind, decay)
    weight = torch.randn(rows, dim, generator=gen, dtype=dtype)
    states = _states(spec, rows, dim, dtype)
    ref_weight, ref_states = weight.clone(), {k: v.clone() for k, v in states.items()}
    scratch = new_scratch(rows)
    for step in range(1, 4):
        ids = torch.randint(0, 9, (n,), generator=gen)  # 9 distinct rows: many duplicates
        step_t = torch.tensor(step)
        if bags == "per_id":
            grad = torch.randn(n, dim, generator=gen, dtype=dtype)
            bag_of_id, scale, contrib = None, None, grad
            native_grad = grad.view(1, n, dim)
        else:  # ids pooled into 4 x 25 bags of a strided [F, B, D] gradient view, with per-id factors
            out_grad = torch.randn(25, 4, dim, generator=gen, dtype=dtype)
            native_grad = out_grad.transpose(0, 1)  # [4, 25, D], not contiguous
            bag_of_id = torch.randint(0, 100, (n,), generator=gen)
            scale = torch.rand(n, generator=gen, dtype=dtype)
            contrib = native_grad.reshape(100, dim).index_select(0, bag_of_id) * scale.unsqueeze(1)
        native_fused_update(spec, 0.1, step_t, weight, states, scratch, ids, native_grad, bag_of_id, scale, dedupe)
        apply_sparse_update(spec, 0.1, step_t, ref_weight, ref_states, ids, contrib)
        assert torch.equal(scratch, torch.full((rows,), -1, dtype=torch.int32))  # left clean
    tol = {} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(weight, ref_weight, **tol)
    for name in states:
        torch.testing.assert_close(states[name], ref_states[name], **tol)
    untouched = torch.arange(9, rows)
    assert torch.equal(weight[untouched], ref_weight[untouched])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN, PoolingType.NONE])
@pytest.mark.parametrize("one_per_bag", [False, True])
def test_torch_kernel_trains_the_same_with_and_without_native_update(
    kind: EmbOptimType, pooling: PoolingType, one_per_bag: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole lookups (forward, backward, update): the native path equals the stock-op path."""
    tables, ftm = [(30, 8), (20, 8)], [0, 1, 0]
    spec = _spec(kind, WeightDecayMode.L2)
    modules = []
    for native in (True, False):
        monkeypatch.setenv("LIGHTREC_CPU_UPDATE_NATIVE", "1" if native else "0")
        torch.manual_seed(0)
        if pooling == PoolingType.NONE:
            from lightrec.kernels import BatchedEmbedding

            m: torch.nn.Module = BatchedEmbedding(tables, ftm, spec, kernel_backend="torch")
        else:
            m = BatchedEmbeddingBag(tables, ftm, pooling, spec, kernel_backend="torch")
        assert m._backend.native_update is native  # type: ignore[union-attr]
        modules.append(m)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        b = random_batch(gen, [30, 20, 30], ftm, batch=6, weighted=pooling != PoolingType.NONE,
                         one_per_bag=one_per_bag)  # fmt: skip
        outs = []
        for m in modules:
            if pooling == PoolingType.NONE:
                out = m(b.indices, b.offsets)
            else:
                out = m(b.indices, b.offsets, b.weights)
            (out * torch.arange(out.numel(), dtype=out.dtype).view_as(out).sin()).sum().backward()
            outs.append(out.detach())
        torch.testing.assert_close(outs[0], outs[1])
    for a, b_ in zip(modules[0].split_embedding_weights(), modules[1].split_embedding_weights()):
        torch.testing.assert_close(a, b_)


def test_out_of_range_id_raises_and_leaves_the_scratch_clean() -> None:
    spec = _spec(EmbOptimType.ROWWISE_ADAGRAD, WeightDecayMode.NONE)
    weight, states, scratch = torch.zeros(5, 4), _states(spec, 5, 4, torch.float32), new_scratch(5)
    with pytest.raises(RuntimeError, match="id 7 at position 2 is outside"):
        native_fused_update(spec, 0.1, torch.tensor(1), weight, states, scratch, torch.tensor([1, 2, 7]),
                            torch.ones(1, 3, 4), None, None)  # fmt: skip
    assert torch.equal(scratch, torch.full((5,), -1, dtype=torch.int32))
    assert torch.equal(weight, torch.zeros(5, 4))


def test_out_of_range_id_with_the_id_table_raises_and_changes_nothing() -> None:
    spec = _spec(EmbOptimType.ROWWISE_ADAGRAD, WeightDecayMode.NONE)
    weight, states, scratch = torch.zeros(5, 4), _states(spec, 5, 4, torch.float32), new_scratch(5)
    before = states["momentum1"].clone()
    for bad in (-1, 5):
        with pytest.raises(RuntimeError, match=f"id {bad} at position 1 is outside"):
            native_fused_update(spec, 0.1, torch.tensor(1), weight, states, scratch, torch.tensor([1, bad, 2]),
                                torch.ones(1, 3, 4), None, None, "table")  # fmt: skip
    assert torch.equal(weight, torch.zeros(5, 4)) and torch.equal(states["momentum1"], before)
    # the per-thread table is cleared by the next call: a good batch after the failures is exact
    native_fused_update(spec, 0.1, torch.tensor(1), weight, states, scratch, torch.tensor([1, 1, 2]),
                        torch.ones(1, 3, 4), None, None, "table")  # fmt: skip
    ref_w, ref_s = torch.zeros(5, 4), {"momentum1": before.clone()}
    apply_sparse_update(spec, 0.1, torch.tensor(1), ref_w, ref_s, torch.tensor([1, 1, 2]), torch.ones(3, 4))
    torch.testing.assert_close(weight, ref_w)


@pytest.mark.parametrize("rows, n", [(40, 300), (200_000, 3000)])  # auto: the scratch, then the table
@pytest.mark.parametrize("kind", [EmbOptimType.SGD, EmbOptimType.ROWWISE_ADAGRAD, EmbOptimType.ADAM])
def test_every_dedupe_mode_gives_the_same_bits(rows: int, n: int, kind: EmbOptimType) -> None:
    """The two ways of de-duplicating (and auto's pick between them) give bit-identical rows: the
    unique rows come out in first-occurrence order either way, so every sum runs in the same order.
    The larger case draws distinct-heavy ids from a wide range (long probe runs in the table)."""
    gen = torch.Generator().manual_seed(5)
    spec = _spec(kind, WeightDecayMode.NONE)
    weight0 = torch.randn(rows, 8, generator=gen)
    states0 = _states(spec, rows, 8, torch.float32)
    batches = [(torch.randint(0, rows, (n,), generator=gen), torch.randn(1, n, 8, generator=gen)) for _ in range(3)]
    results = []
    for mode in ("auto", "scratch", "table"):
        weight, states, scratch = weight0.clone(), {k: v.clone() for k, v in states0.items()}, new_scratch(rows)
        for step, (ids, grad) in enumerate(batches, start=1):
            native_fused_update(spec, 0.1, torch.tensor(step), weight, states, scratch, ids, grad, None, None, mode)
        assert torch.equal(scratch, torch.full((rows,), -1, dtype=torch.int32))
        results.append((weight, states))
    for weight, states in results[1:]:
        assert torch.equal(weight, results[0][0])
        assert all(torch.equal(states[k], results[0][1][k]) for k in states)
    ref_w, ref_s = weight0.clone(), {k: v.clone() for k, v in states0.items()}
    for step, (ids, grad) in enumerate(batches, start=1):
        apply_sparse_update(spec, 0.1, torch.tensor(step), ref_w, ref_s, ids, grad[0])
    torch.testing.assert_close(results[0][0], ref_w)


def test_a_bag_outside_the_gradient_is_refused_before_any_update() -> None:
    spec = _spec(EmbOptimType.SGD, WeightDecayMode.NONE)
    weight = torch.zeros(5, 4)
    grad = torch.ones(4, 25, 4).transpose(0, 1)  # [25, 4, D] strided: 100 bags
    with pytest.raises(RuntimeError, match="bag_of_id\\[1\\] = 100 is outside the gradient's 100 bags"):
        native_fused_update(spec, 0.1, torch.tensor(1), weight, {}, new_scratch(5), torch.tensor([1, 2]), grad,
                            torch.tensor([99, 100]), None)  # fmt: skip
    assert torch.equal(weight, torch.zeros(5, 4))


@pytest.mark.parametrize("kind", [EmbOptimType.ROWWISE_ADAGRAD, EmbOptimType.ADAM])
def test_two_threads_give_the_bits_of_one(kind: EmbOptimType) -> None:
    """Enough touched rows (> 2 x 16384) that the update runs on two threads: each row is still summed
    and updated once, so the result is bit-identical to one thread's."""
    gen = torch.Generator().manual_seed(9)
    spec = _spec(kind, WeightDecayMode.NONE)
    rows, n = 60_000, 80_000
    weight0, states0 = torch.randn(rows, 4, generator=gen), _states(spec, rows, 4, torch.float32)
    ids, grad = torch.randint(0, rows, (n,), generator=gen), torch.randn(1, n, 4, generator=gen)
    results = []
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            weight, states = weight0.clone(), {k: v.clone() for k, v in states0.items()}
            native_fused_update(spec, 0.1, torch.tensor(1), weight, states, new_scratch(rows), ids, grad, None, None)
            results.append((weight, states))
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(results[0][1][k], results[1][1][k]) for k in results[0][1])
    ref_w, ref_s = weight0.clone(), {k: v.clone() for k, v in states0.items()}
    apply_sparse_update(spec, 0.1, torch.tensor(1), ref_w, ref_s, ids, grad[0])
    torch.testing.assert_close(results[1][0], ref_w)


def test_unknown_dedupe_mode_is_refused() -> None:
    spec = _spec(EmbOptimType.SGD, WeightDecayMode.NONE)
    with pytest.raises(ValueError, match="dedupe='sorted' is not one of"):
        native_fused_update(spec, 0.1, torch.tensor(1), torch.zeros(5, 4), {}, new_scratch(5), torch.tensor([1]),
                            torch.ones(1, 1, 4), None, None, "sorted")  # fmt: skip


def test_native_update_only_serves_cpu_float_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert native_update_available(torch.device("cpu"), torch.float32)
    assert not native_update_available(torch.device("cpu"), torch.float16)
    assert not native_update_available(torch.device("meta"), torch.float32)
    monkeypatch.setenv("LIGHTREC_CPU_UPDATE_NATIVE", "0")
    assert not native_update_available(torch.device("cpu"), torch.float32)


def test_a_failed_build_warns_once_and_falls_back() -> None:
    """No compiler: one NativeUnavailableWarning, then the stock-op update trains the table."""
    script = textwrap.dedent(
        """
        import warnings, torch
        from torch.utils import cpp_extension
        def broken(*args, **kwargs):
            raise RuntimeError("Ninja is required to load C++ extensions")
        cpp_extension.load = broken
        from lightrec.kernels import BatchedEmbeddingBag, FusedOptimizerSpec, EmbOptimType
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mods = [BatchedEmbeddingBag([(10, 4)], [0], optimizer=FusedOptimizerSpec(EmbOptimType.ADAGRAD),
                                        kernel_backend="torch") for _ in range(2)]
        messages = [str(w.message) for w in caught if "native CPU ops" in str(w.message)]
        assert len(messages) == 1, messages
        assert "Ninja is required" in messages[0] and "pip install ninja" in messages[0], messages
        m = mods[0]
        assert not m._backend.native_update
        before = m.split_embedding_weights()[0].clone()
        m(torch.tensor([1, 1]), torch.tensor([0, 1, 2])).sum().backward()
        assert not torch.equal(before, m.split_embedding_weights()[0])
        print("ok")
        """
    )
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "LIGHTREC_CPU_UPDATE_NATIVE": ""}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={**os.environ, **env}, timeout=120)  # fmt: skip
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


@pytest.mark.skipif("not __import__('lightrec._fbgemm', fromlist=['x']).fbgemm_available()")
def test_measuring_both_cpu_kernels_gives_times() -> None:
    from lightrec.kernels.cpu_kernel_choice import measure_cpu_kernels

    ms = measure_cpu_kernels(iterations=1)
    assert set(ms) == {"fbgemm", "torch"} and all(v > 0 for v in ms.values())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_gradient_parts_read_in_place_give_the_bits_of_one_gradient(kind: EmbOptimType, weighted: bool) -> None:
    """``grad_parts``: the id gradients as blocks where they lie (one strided, as a column block of a
    wider tensor; one empty) give the same rows and state, bit for bit, as the one gradient tensor."""
    gen = torch.Generator().manual_seed(8)
    spec = _spec(kind, WeightDecayMode.L2)
    weight0, states0 = torch.randn(30, 8, generator=gen), _states(spec, 30, 8, torch.float32)
    ids = torch.randint(0, 30, (50,), generator=gen)  # duplicates across the parts
    grad = torch.randn(50, 8, generator=gen)
    scale = torch.rand(50, generator=gen) + 0.5 if weighted else None
    wide = torch.zeros(32, 24)
    wide[:, 8:16] = grad[18:]
    parts = [(0, grad[:18].clone()), (18, wide[:, 8:16]), (50, torch.zeros(0, 8))]
    results = []
    for mode in ("whole", "parts"):
        weight, states = weight0.clone(), {k: v.clone() for k, v in states0.items()}
        for step in (1, 2):
            if mode == "whole":
                native_fused_update(spec, 0.1, torch.tensor(step), weight, states, new_scratch(30), ids,
                                    grad.view(1, 50, 8), None, scale)  # fmt: skip
            else:
                native_fused_update(spec, 0.1, torch.tensor(step), weight, states, new_scratch(30), ids, None, None,
                                    scale, grad_parts=parts)  # fmt: skip
        results.append((weight, states))
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(results[0][1][k], results[1][1][k]) for k in results[0][1])


def test_gradient_parts_that_leave_a_gap_are_refused() -> None:
    spec = _spec(EmbOptimType.SGD, WeightDecayMode.NONE)
    weight = torch.zeros(5, 4)
    with pytest.raises(RuntimeError, match="grad_parts must cover the 4 ids back to back from 0"):
        native_fused_update(spec, 0.1, torch.tensor(1), weight, {}, new_scratch(5), torch.tensor([1, 2, 3, 4]),
                            None, None, None, grad_parts=[(0, torch.ones(2, 4)), (3, torch.ones(1, 4))])  # fmt: skip
    with pytest.raises(ValueError, match="pass grad, or grad_parts"):
        native_fused_update(spec, 0.1, torch.tensor(1), weight, {}, new_scratch(5), torch.tensor([1]), None, None, None)
    assert torch.equal(weight, torch.zeros(5, 4))
