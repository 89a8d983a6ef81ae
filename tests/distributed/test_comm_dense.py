"""Pooled all-to-all, reduce-scatter and all-gather on real gloo ranks, forward and backward.

Each launch runs every case of one world size; the parent process recomputes each case on one
process with plain PyTorch (the concatenated inputs) and compares outputs and input gradients.
``rank_results`` is the single launch per world size shared with ``test_comm_kjt`` (process
start-up dominates the cost of these tests).
"""

from __future__ import annotations

import functools
import io

import pytest
import torch

from tests.multiprocess import run_ranks


def _pack(obj: object) -> bytes:
    """Serialize a rank's result to bytes: tensors put on the result queue directly are shared
    through memory that may vanish when the rank exits before the parent reads them."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _unpack(data: bytes) -> object:
    return torch.load(io.BytesIO(data), weights_only=False)


# (kind, batch_size_per_rank, dims): dims is dim_sum_per_rank for "a2a", the row width otherwise.
CASES: dict[int, list[tuple[str, list[int], list[int] | int]]] = {
    1: [("a2a", [3], [4]), ("rs", [2], 3), ("rs_native", [2], 3), ("ag", [2], 2)],  # the tutorial's world
    2: [
        ("a2a", [3, 3], [4, 2]),
        ("a2a", [3, 1], [4, 2]),
        ("a2a", [2, 0], [0, 5]),  # a rank with no samples and a rank with no features
        ("rs", [2, 2], 3),  # even: all_to_all + sum on CPU
        ("rs_native", [2, 2], 3),  # even, forced onto reduce_scatter_single (the NCCL path)
        ("rs", [4, 1], 3),  # uneven: all_to_all + sum
        ("ag", [2, 2], 3),
        ("ag", [1, 3], 2),
        ("a2a_hot", [3, 2], [4, 2]),  # column_order + grad_scale + defer_input_grad (the TW/CW output dist)
    ],
    3: [
        ("a2a", [2, 2, 2], [1, 3, 2]),
        ("a2a", [2, 0, 3], [3, 0, 2]),
        ("rs", [2, 2, 2], 4),
        ("rs_native", [2, 2, 2], 4),
        ("ag_native_rs", [2, 2, 2], 3),  # backward reduce-scatter on the native path
        ("rs", [1, 0, 3], 4),
        ("ag", [3, 1, 2], 2),
        ("ag", [0, 2, 1], 3),
        ("a2a_hot", [2, 1, 3], [1, 3, 2]),  # the middle rank sends to itself through the collective
    ],
}


def _tensor(case: int, what: str, rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * case + 10 * rank + {"x": 1, "g": 2}[what])
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _shapes(kind: str, batches: list[int], dims, rank: int):  # noqa: ANN001, ANN202
    """(input shape, output shape) on ``rank``."""
    total = sum(batches)
    if kind.startswith("a2a"):
        return (total, dims[rank]), (batches[rank], sum(dims))
    if kind.startswith("rs"):
        return (total, dims), (batches[rank], dims)
    return (batches[rank], dims), (total, dims)


HOT_GRAD_SCALE = 0.5


def _column_order(dims: list[int]) -> list[int]:
    """A fixed shuffle of the output columns (runs of several widths and strides)."""
    return torch.randperm(sum(dims), generator=torch.Generator().manual_seed(sum(dims))).tolist()


def _run_all(rank: int, world_size: int) -> bytes:
    from tests.distributed.test_comm_kjt import run_kjt_cases

    return _pack(
        {
            "dense": _run_cases(rank, world_size),
            "kjt": run_kjt_cases(rank, world_size),
            "errors": _bad_calls(world_size),
        }
    )


def _bad_calls(world_size: int) -> dict[str, str]:
    """Messages of the errors raised for bad arguments (all raise before any communication)."""
    from lightrec.distributed.comm import (
        KJTAllToAll,
        PooledEmbeddingsAllGather,
        PooledEmbeddingsAllToAll,
        PooledEmbeddingsReduceScatter,
    )
    from lightrec.sparse import KeyedJaggedTensor

    kjt = KeyedJaggedTensor(["a"], torch.tensor([1]), lengths=torch.tensor([1]))
    calls = {
        "dims": lambda: PooledEmbeddingsAllToAll(None, [1]),
        "width": lambda: PooledEmbeddingsAllToAll(None, [2] * world_size)(torch.zeros(4, 3)),
        "sum": lambda: PooledEmbeddingsReduceScatter()(torch.zeros(5, 2), [1] * world_size),
        "even": lambda: PooledEmbeddingsReduceScatter()(torch.zeros(world_size + 1, 2)),
        "own": lambda: PooledEmbeddingsAllGather()(torch.zeros(3, 2), [1] * world_size),
        "keys": lambda: KJTAllToAll(None, [2] * world_size)(kjt),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = "no error"
        except ValueError as exc:
            out[name] = str(exc)
    return out


@functools.cache
def rank_results(world_size: int) -> list[dict]:
    """Every rank's results of every comm case for ``world_size`` (launched once per session)."""
    return [_unpack(r) for r in run_ranks(_run_all, world_size)]


def _run_cases(rank: int, world_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from lightrec.distributed.comm import (
        PooledEmbeddingsAllGather,
        PooledEmbeddingsAllToAll,
        PooledEmbeddingsReduceScatter,
        _primitives,
    )

    results = []
    for i, (kind, batches, dims) in enumerate(CASES[world_size]):
        # "*native*" cases run reduce-scatters on gloo's reduce_scatter_single (NCCL's path).
        _primitives.CPU_NATIVE_REDUCE_SCATTER = "native" in kind
        in_shape, out_shape = _shapes(kind, batches, dims, rank)
        x = _tensor(i, "x", rank, in_shape).requires_grad_()
        if kind == "a2a":
            aw = PooledEmbeddingsAllToAll(None, dims)(x, batches)
        elif kind == "a2a_hot":
            a2a = PooledEmbeddingsAllToAll(
                None, dims, column_order=_column_order(dims), grad_scale=HOT_GRAD_SCALE, defer_input_grad=True
            )
            aw = a2a(x, batches)
        elif kind.startswith("rs"):
            aw = PooledEmbeddingsReduceScatter()(x, batches)
        else:
            aw = PooledEmbeddingsAllGather()(x, None if i % 2 else batches)
        g = _tensor(i, "g", rank, out_shape)
        # Alternate between an explicit wait and letting the LazyAwaitable resolve on use.
        out = aw.wait() if i % 2 == 0 else aw
        loss = (out * g).sum()
        loss.backward()
        results.append((aw.wait().detach(), x.grad))
    _primitives.CPU_NATIVE_REDUCE_SCATTER = False
    return results


def _reference(kind: str, batches: list[int], dims, case: int, world_size: int):  # noqa: ANN001, ANN202
    """Per-rank (output, input grad) computed on one process from the concatenated inputs."""
    xs = [
        _tensor(case, "x", r, _shapes(kind, batches, dims, r)[0]).requires_grad_() for r in range(world_size)
    ]
    gs = [_tensor(case, "g", s, _shapes(kind, batches, dims, s)[1]) for s in range(world_size)]
    if kind.startswith("a2a"):
        full = torch.cat(xs, dim=1)  # [B_total, sum D]: every feature for the global batch
        if kind == "a2a_hot":  # column c of the rank blocks lands in output column order[c]
            full = full[:, torch.tensor(_column_order(dims)).argsort()] * HOT_GRAD_SCALE
        outs = list(full.split(batches, dim=0))
    elif kind.startswith("rs"):
        outs = list(torch.stack(xs).sum(0).split(batches, dim=0))
    else:
        outs = [torch.cat(xs, dim=0)] * world_size
    sum((o * g).sum() for o, g in zip(outs, gs, strict=True)).backward()
    if kind == "a2a_hot":  # the forward is unscaled; only the gradient sent back is scaled
        outs = [o / HOT_GRAD_SCALE for o in outs]
    return [(o.detach(), x.grad) for o, x in zip(outs, xs, strict=True)]


@pytest.mark.parametrize("world_size", [1, 2, pytest.param(3, marks=pytest.mark.slow)])  # 3 ranks: slow suite (CI budget)
def test_dense_collectives_match_single_process(world_size: int) -> None:
    got = [r["dense"] for r in rank_results(world_size)]
    for i, (kind, batches, dims) in enumerate(CASES[world_size]):
        want = _reference(kind, batches, dims, i, world_size)
        for rank in range(world_size):
            out, grad = got[rank][i]
            ref_out, ref_grad = want[rank]
            ctx = f"case {i} {kind} batches={batches} dims={dims} rank={rank}"
            assert out.shape == ref_out.shape, ctx
            torch.testing.assert_close(out, ref_out, msg=ctx)
            torch.testing.assert_close(grad, ref_grad, msg=ctx)


def test_bad_arguments_raise_clear_errors() -> None:
    errors = rank_results(2)[0]["errors"]
    assert "dim_sum_per_rank must list 2" in errors["dims"]
    assert "local_embs must be [B_total, 2] on rank 0" in errors["width"]
    assert "sums to 2 but the input has 5 rows" in errors["sum"]
    assert "does not split evenly over 2 ranks" in errors["even"]
    assert "batch_size_per_rank[0]=1 but this rank's input has 3 rows" in errors["own"]
    assert "expects KJTs with 4 keys, got 1" in errors["keys"]
