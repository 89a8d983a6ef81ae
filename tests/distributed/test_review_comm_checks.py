"""Collectives whose ranks disagree about their inputs: every rank raises a typed error naming the argument
(no silent mix-up, no hang), and an awaitable waited again after its error re-raises that error.

* ``PooledEmbeddingsAllToAll`` built with different ``dim_sum_per_rank`` (or called with different
  ``batch_size_per_rank``) on the ranks, over the shared-memory transport.
* ``KJTAllToAll`` on KJTs with the same number of keys but different key names or order.
* ``KJTAllToAllSplitsAwaitable.wait()`` a second time after its first wait raised.
"""

from __future__ import annotations

import pytest
import torch

from tests.multiprocess import run_ranks


def _pooled_body(rank: int, world_size: int, case: str) -> dict:
    from lightrec.distributed.comm import PooledEmbeddingsAllToAll

    dims = [2, 3] if rank == 0 or case != "dims" else [2, 4]
    batches = [2, 2] if rank == 0 or case != "batches" else [1, 3]
    a2a = PooledEmbeddingsAllToAll(None, dims)
    x = torch.arange(sum(batches) * dims[rank], dtype=torch.float32).view(sum(batches), dims[rank]) + 100 * rank
    try:
        out = a2a(x, batch_size_per_rank=batches).wait()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return {"error": f"{type(exc).__name__}: {exc}", "value_error": isinstance(exc, ValueError)}
    return {"error": None, "shape": tuple(out.shape)}


@pytest.mark.parametrize("case", ["dims", "batches"])
def test_pooled_all_to_all_ranks_disagreeing_raise_on_every_rank_over_shm(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIGHTREC_SHM", "1")
    results = run_ranks(_pooled_body, world_size=2, args=(case,), timeout=60)
    for rank, r in enumerate(results):
        assert r["error"] is not None, (rank, r)
        assert r["value_error"], r["error"]
        assert "PooledEmbeddingsAllToAllError" in r["error"], r["error"]
        assert "dim_sum_per_rank" in r["error"] and "batch_size_per_rank" in r["error"], r["error"]
        dims = [2, 3] if rank == 0 or case != "dims" else [2, 4]
        batches = [2, 2] if rank == 0 or case != "batches" else [1, 3]
        assert f"dim_sum_per_rank={dims}" in r["error"] and f"batch_size_per_rank={batches}" in r["error"], r["error"]
        assert "the same" in r["error"], r["error"]  # the fix


def _pooled_agree_body(rank: int, world_size: int) -> dict:
    from lightrec.distributed.comm import PooledEmbeddingsAllToAll

    dims, batches = [2, 3], [1, 3]
    a2a = PooledEmbeddingsAllToAll(None, dims)
    x = (torch.arange(4 * dims[rank], dtype=torch.float32).view(4, dims[rank]) + 100 * rank).requires_grad_()
    out = a2a(x, batch_size_per_rank=batches).wait()
    out.backward(torch.ones_like(out) * (rank + 1))
    assert x.grad is not None
    return {"out": out.detach(), "grad": x.grad}


@pytest.mark.parametrize("shm", ["1", "0"])
def test_pooled_all_to_all_ranks_agreeing_match_a_hand_computation(shm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTREC_SHM", shm)
    results = run_ranks(_pooled_agree_body, world_size=2, timeout=60)
    dims, batches = [2, 3], [1, 3]
    inputs = [torch.arange(4 * d, dtype=torch.float32).view(4, d) + 100 * r for r, d in enumerate(dims)]
    starts = [0, 1]
    for me in range(2):
        rows = slice(starts[me], starts[me] + batches[me])
        expected = torch.cat([inputs[r][rows] for r in range(2)], dim=1)
        torch.testing.assert_close(results[me]["out"], expected, rtol=0, atol=0)
        # d out_s / d x_me: rank s's gradient (s + 1) on the rows of its samples.
        expected_grad = torch.cat([torch.full((batches[s], dims[me]), float(s + 1)) for s in range(2)])
        torch.testing.assert_close(results[me]["grad"], expected_grad, rtol=0, atol=0)


def _kjt_keys_body(rank: int, world_size: int, shm: str) -> dict:
    from lightrec.distributed.comm import KJTAllToAll, KJTAllToAllError
    from lightrec.sparse import KeyedJaggedTensor

    keys = ["f0", "f1", "f2"] if rank == 0 else ["f0", "f2", "f1"]  # same count, another order
    kjt = KeyedJaggedTensor(keys, torch.arange(6), lengths=torch.tensor([1, 1, 1, 1, 1, 1]), stride=2)
    splits = KJTAllToAll(None, [2, 1])(kjt)
    out: dict = {"first": None, "second": None}
    try:
        splits.wait()
    except KJTAllToAllError as exc:
        out["first"] = str(exc)
    # Waiting again after the error: the same error, not an internal one.
    try:
        splits.wait()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        out["second"] = f"{type(exc).__name__}: {exc}"
    return out


@pytest.mark.parametrize("shm", ["1", "0"])
def test_kjt_all_to_all_different_key_names_raise_on_every_rank(shm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTREC_SHM", shm)
    results = run_ranks(_kjt_keys_body, world_size=2, args=(shm,), timeout=60)
    for rank, r in enumerate(results):
        assert r["first"] is not None, (rank, r)
        keys = ["f0", "f1", "f2"] if rank == 0 else ["f0", "f2", "f1"]
        assert "keys" in r["first"] and str(keys) in r["first"], r["first"]
        assert "ranks [0] vs ranks [1]" in r["first"], r["first"]
        assert r["second"] is not None and "started twice" not in r["second"], r["second"]
        assert r["second"] == f"KJTAllToAllError: {r['first']}", r["second"]


def _kjt_agree_body(rank: int, world_size: int) -> dict:
    from lightrec.distributed.comm import KJTAllToAll
    from lightrec.sparse import KeyedJaggedTensor

    kjt = KeyedJaggedTensor(["f0", "f1", "f2"], torch.arange(6) + 10 * rank, lengths=torch.ones(6, dtype=torch.int64), stride=2)
    out = KJTAllToAll(None, [2, 1])(kjt).wait().wait()
    return {"keys": out.keys(), "values": out.values(), "lengths": out.lengths()}


def test_kjt_all_to_all_same_keys_still_exchange() -> None:
    results = run_ranks(_kjt_agree_body, world_size=2, timeout=60)
    # rank 0 gets f0, f1 (samples of rank 0 then rank 1); rank 1 gets f2.
    assert results[0]["keys"] == ["f0", "f1"] and results[1]["keys"] == ["f2"]
    assert results[0]["values"].tolist() == [0, 1, 10, 11, 2, 3, 12, 13]
    assert results[1]["values"].tolist() == [4, 5, 14, 15]
    assert results[0]["lengths"].tolist() == [1] * 8 and results[1]["lengths"].tolist() == [1] * 4


def test_awaitable_waited_again_after_its_error_reraises_it() -> None:
    from lightrec.distributed.comm import Awaitable

    class Boom(Awaitable[int]):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def _wait_impl(self) -> int:
            self.calls += 1
            raise KeyError(f"boom {self.calls}")

    a = Boom()
    with pytest.raises(KeyError, match="boom 1"):
        a.wait()
    with pytest.raises(KeyError, match="boom 1"):  # the first error again; the work is not re-run
        a.wait()
    assert a.calls == 1 and not a.is_resolved


def _kjt_splits_twice_body(rank: int, world_size: int) -> dict:
    from lightrec.distributed.comm import KJTAllToAll
    from lightrec.sparse import KeyedJaggedTensor

    kjt = KeyedJaggedTensor(["f0", "f1", "f2"], torch.arange(6), lengths=torch.ones(6, dtype=torch.int64), stride=2)
    splits = KJTAllToAll(None, [2, 1] if rank == 0 else [1, 2])(kjt)  # ranks disagree: stage 2 raises
    errors = []
    for _ in range(2):
        try:
            splits.wait()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            errors.append(f"{type(exc).__name__}: {exc}")
    return {"errors": errors}


def test_kjt_all_to_all_second_wait_after_a_stage_two_error_reraises_it() -> None:
    for r in run_ranks(_kjt_splits_twice_body, world_size=2, timeout=60):
        first, second = r["errors"]
        assert first.startswith("KJTAllToAllError: ") and "key_splits" in first, first
        assert second == first, second
