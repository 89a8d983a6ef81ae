"""Batch-dimension reduce-scatter / all-gather over the shared-memory transport whose ranks disagree about
their inputs: every receiving rank raises a typed ``ValueError`` naming ``batch_size_per_rank`` and the rows'
shape/dtype, instead of returning a prefix of its peer's chunk (wrong rows, wrong shape) silently.

The ranks of these collectives do not exchange their geometry; the shared-memory exchange carries a check
word of it (``ShmTransport.start(check=...)``) and every read takes the peer's whole chunk.
"""

from __future__ import annotations

import pytest
import torch

from tests.multiprocess import run_ranks

# case -> (rank 0's, rank 1's) (batch_size_per_rank, row shape, dtype)
_CASES = {
    "rs_batches": ("rs", ([2, 2], (3,), torch.float32), ([1, 3], (3,), torch.float32)),
    "rs_dim": ("rs", ([2, 2], (3,), torch.float32), ([2, 2], (4,), torch.float32)),
    "rs_dtype": ("rs", ([2, 2], (2,), torch.float64), ([2, 2], (4,), torch.float32)),  # same bytes per row
    "ag_batches": ("ag", ([2, 2], (3,), torch.float32), ([2, 1], (3,), torch.float32)),
    "ag_dim": ("ag", ([2, 2], (3,), torch.float32), ([2, 2], (4,), torch.float32)),
}


def _input(kind: str, batches: list[int], rest: tuple[int, ...], dtype: torch.dtype, rank: int) -> torch.Tensor:
    rows = sum(batches) if kind == "rs" else batches[rank]
    n = rows * int(torch.tensor(rest).prod())
    return (torch.arange(n, dtype=dtype) + 100 * rank).view(rows, *rest)


def _mismatch_body(rank: int, world_size: int, case: str) -> dict:
    from lightrec.distributed.comm.reduce_scatter import (
        PooledEmbeddingsAllGather,
        PooledEmbeddingsReduceScatter,
    )

    kind, *per_rank = _CASES[case]
    batches, rest, dtype = per_rank[rank]
    x = _input(kind, batches, rest, dtype, rank)
    collective = PooledEmbeddingsReduceScatter(None) if kind == "rs" else PooledEmbeddingsAllGather(None)
    try:
        out = collective(x, batch_size_per_rank=batches).wait()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return {"error": f"{type(exc).__name__}: {exc}", "value_error": isinstance(exc, ValueError)}
    return {"error": None, "shape": tuple(out.shape)}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_batch_collectives_ranks_disagreeing_raise_on_every_rank_over_shm(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIGHTREC_SHM", "1")
    results = run_ranks(_mismatch_body, world_size=2, args=(case,), timeout=60)
    _, *per_rank = _CASES[case]
    for rank, r in enumerate(results):
        assert r["error"] is not None, (rank, r)  # before: a prefix of the peer's chunk, silently
        assert r["value_error"], r["error"]
        assert r["error"].startswith("BatchExchangeMismatchError"), r["error"]
        batches, rest, dtype = per_rank[rank]
        assert f"batch_size_per_rank={batches}" in r["error"], r["error"]
        assert f"shape[1:]={rest}" in r["error"] and f"dtype={dtype}" in r["error"], r["error"]
        assert "Pass the same batch_size_per_rank on every rank" in r["error"], r["error"]


def _agree_body(rank: int, world_size: int, kind: str) -> dict:
    from lightrec.distributed.comm.reduce_scatter import (
        PooledEmbeddingsAllGather,
        PooledEmbeddingsReduceScatter,
    )

    batches = [1, 3]
    x = _input(kind, batches, (2, 3), torch.float64, rank).requires_grad_()
    collective = PooledEmbeddingsReduceScatter(None) if kind == "rs" else PooledEmbeddingsAllGather(None)
    out = collective(x, batch_size_per_rank=batches).wait()
    out.backward(torch.full_like(out, float(rank + 1)))
    assert x.grad is not None
    return {"out": out.detach(), "grad": x.grad}


@pytest.mark.parametrize("shm", ["1", "0"])
@pytest.mark.parametrize("kind", ["rs", "ag"])
def test_batch_collectives_ranks_agreeing_match_a_plain_reference(
    kind: str, shm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIGHTREC_SHM", shm)
    results = run_ranks(_agree_body, world_size=2, args=(kind,), timeout=60)
    batches, starts = [1, 3], [0, 1]
    inputs = [_input(kind, batches, (2, 3), torch.float64, r) for r in range(2)]
    for me in range(2):
        rows = slice(starts[me], starts[me] + batches[me])
        if kind == "rs":
            expected = inputs[0][rows] + inputs[1][rows]
            # every rank's partial for a sample gets that sample's owner's gradient
            expected_grad = torch.cat([torch.full((batches[s], 2, 3), float(s + 1), dtype=torch.float64) for s in range(2)])
        else:
            expected = torch.cat(inputs)
            expected_grad = torch.full((batches[me], 2, 3), 1.0 + 2.0, dtype=torch.float64)
        torch.testing.assert_close(results[me]["out"], expected, rtol=0, atol=0)
        torch.testing.assert_close(results[me]["grad"], expected_grad, rtol=0, atol=0)
