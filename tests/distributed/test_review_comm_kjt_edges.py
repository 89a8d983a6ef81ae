"""KJTAllToAll (and the pooled / sequence all-to-alls after it) on edge inputs, against a hand-made
split and concatenation: all-empty bags, a rank with batch 0, a rank that receives no key, weighted
features, int32 / int64 lengths and ids, ids near 2**63, variable-batch KJTs (``stride_per_key_per_rank``),
awaitables waited twice and out of order, and ranks whose ``key_splits`` differ (a KJTAllToAllError on
every rank, not a hang). Every rank builds every rank's input from the same seeds, so each checks its
own output in the body.
"""

from __future__ import annotations

import pytest
import torch

from tests.multiprocess import run_ranks

BIG = 2**63 - 10


def _splits(case: str, ws: int) -> list[int]:
    if case == "edges":
        return [3, 0] if ws == 2 else [2, 0, 1]  # a rank that receives no key
    return [1, 2] if ws == 2 else [1, 1, 1]


def _strides(case: str, rank: int, ws: int, num_keys: int) -> list[int]:
    """Each key's batch on ``rank``: fixed (``edges``: the last rank has batch 0), else per key."""
    if case == "edges":
        return [0 if rank == ws - 1 else 2] * num_keys
    if case == "small_ids":
        return [rank + 1] * num_keys
    if case == "vbe_one" and rank != 0:
        return [2] * num_keys  # only rank 0 is variable-batch
    return [(rank + k) % 3 + (1 if k == 0 else 0) for k in range(num_keys)]  # some key has batch 0 somewhere


def _bags(case: str, rank: int, ws: int) -> tuple[list[str], list[list[list[tuple[int, float]]]]]:
    """keys and bags[key][sample] = [(id, weight), ...]."""
    num_keys = sum(_splits(case, ws))
    g = torch.Generator().manual_seed(1000 * len(case) + 10 * rank + ws)
    bags = []
    for k, stride in enumerate(_strides(case, rank, ws, num_keys)):
        per_key = []
        for _ in range(stride):
            n = 0 if (case == "edges" and k == 1) else int(torch.randint(0, 4, (1,), generator=g))  # key 1: all empty
            ids = (torch.randint(0, 1000, (n,), generator=g) + (BIG if case == "edges" else 0)).tolist()
            per_key.append([(i, float(torch.rand((), generator=g))) for i in ids])
        bags.append(per_key)
    return [f"f{k}" for k in range(num_keys)], bags


def _dtypes(case: str) -> tuple[torch.dtype, torch.dtype, bool]:
    """(lengths dtype, ids dtype, weighted)."""
    return {"edges": (torch.int32, torch.int64, True), "small_ids": (torch.int64, torch.int32, False),
            "vbe": (torch.int32, torch.int64, True), "vbe_one": (torch.int64, torch.int64, False)}[case]  # fmt: skip


def _kjt(case: str, rank: int, ws: int):  # noqa: ANN202
    from lightrec.sparse import KeyedJaggedTensor

    keys, bags = _bags(case, rank, ws)
    ldt, vdt, weighted = _dtypes(case)
    strides = [len(b) for b in bags]
    lengths = torch.tensor([len(bag) for b in bags for bag in b], dtype=ldt)
    values = torch.tensor([i for b in bags for bag in b for i, _ in bag], dtype=vdt)
    weights = torch.tensor([w for b in bags for bag in b for _, w in bag]) if weighted else None
    if case.startswith("vbe") and len(set(strides)) > 1:
        return KeyedJaggedTensor(keys, values, weights, lengths=lengths, stride_per_key_per_rank=[[s] for s in strides])
    return KeyedJaggedTensor(keys, values, weights, lengths=lengths, stride=strides[0] if strides else 0)


def _expected(case: str, me: int, ws: int) -> dict:
    """What rank ``me`` receives: its keys, each key's bags of every source in rank order; and for each
    received value its (source rank, index in that source's values)."""
    splits = _splits(case, ws)
    start = sum(splits[:me])
    mine = range(start, start + splits[me])
    per_src = [_bags(case, s, ws)[1] for s in range(ws)]
    lengths, values, weights, origin, strides = [], [], [], [], []
    for k in mine:
        strides.append([len(per_src[s][k]) for s in range(ws)])
        for s in range(ws):
            before = sum(len(bag) for kk in range(k) for bag in per_src[s][kk])
            for bag in per_src[s][k]:
                lengths.append(len(bag))
                for i, w in bag:
                    values.append(i)
                    weights.append(w)
                    origin.append((s, before))
                    before += 1
    return {"keys": [f"f{k}" for k in mine], "lengths": lengths, "values": values, "weights": weights,
            "origin": origin, "strides": strides}  # fmt: skip


def _check_kjt(case: str, out, rank: int, ws: int) -> None:  # noqa: ANN001
    want = _expected(case, rank, ws)
    ldt, vdt, weighted = _dtypes(case)
    ctx = f"{case} rank {rank}"
    assert out.keys() == want["keys"], ctx
    assert out.lengths().dtype == ldt and out.values().dtype == vdt, ctx
    assert out.lengths().tolist() == want["lengths"], ctx
    assert out.values().tolist() == want["values"], ctx
    if weighted:
        assert out.weights().tolist() == want["weights"], ctx
    else:
        assert out.weights_or_none() is None, ctx
    if case.startswith("vbe") and want["keys"]:
        assert out.stride_per_key_per_rank() == want["strides"], ctx
    else:
        assert out.stride() == sum(len(_bags(case, s, ws)[1][0]) for s in range(ws)), ctx
    out.validate()


def _kjt_body(rank: int, ws: int) -> dict:
    from lightrec.distributed.comm import KJTAllToAll, KJTAllToAllError

    for case in ("edges", "small_ids", "vbe", "vbe_one"):
        tensors = KJTAllToAll(None, _splits(case, ws))(_kjt(case, rank, ws)).wait()
        _check_kjt(case, tensors.wait(), rank, ws)

    # Two calls in flight; stage 2 of each started in call order, then the outputs waited for in
    # reverse order, each twice: the same KJT object, the right one.
    a2a_a, a2a_b = KJTAllToAll(None, _splits("edges", ws)), KJTAllToAll(None, _splits("vbe", ws))
    splits_a, splits_b = a2a_a(_kjt("edges", rank, ws)), a2a_b(_kjt("vbe", rank, ws))
    tensors_a = splits_a.wait()
    tensors_b = splits_b.wait()
    assert splits_a.wait() is tensors_a
    out_b = tensors_b.wait()
    out_a = tensors_a.wait()
    assert tensors_b.wait() is out_b and tensors_a.wait() is out_a
    _check_kjt("edges", out_a, rank, ws)
    _check_kjt("vbe", out_b, rank, ws)

    # Ranks disagreeing about key_splits: every rank raises naming the ranks, none waits for the others.
    splits = _splits("small_ids", ws) if rank != 0 else ([2, 1] if ws == 2 else [2, 0, 1])
    try:
        KJTAllToAll(None, splits)(_kjt("small_ids", rank, ws)).wait()
        error = None
    except KJTAllToAllError as exc:
        error = str(exc)
    # The group still works after the error (every rank stopped at the same point).
    _check_kjt("edges", KJTAllToAll(None, _splits("edges", ws))(_kjt("edges", rank, ws)).wait().wait(), rank, ws)
    return {"error": error}


def _check_errors(results: list[dict], ws: int) -> None:
    for rank, r in enumerate(results):
        assert r["error"] is not None and "key_splits" in r["error"], rank
        others = "[1]" if ws == 2 else "[1, 2]"
        assert f"the ranks disagree about key_splits: ranks [0] vs ranks {others} (rank {rank} has key_splits=" in r["error"]


def test_kjt_all_to_all_edges_and_variable_batch_on_two_ranks() -> None:
    _check_errors(run_ranks(_kjt_body, 2), 2)


@pytest.mark.slow
@pytest.mark.parametrize("shm", ["1", "0"])
def test_kjt_all_to_all_edges_and_variable_batch_on_three_ranks(shm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTREC_SHM", shm)
    _check_errors(run_ranks(_kjt_body, 3), 3)


def _dense_body(rank: int, ws: int) -> dict:
    """Pooled all-to-all / reduce-scatter and the sequence all-to-all, forward and gradients, against a
    hand computation from every rank's inputs (a rank with batch 0, a rank with no columns)."""
    from lightrec.distributed.comm import (
        KJTAllToAll,
        PooledEmbeddingsAllToAll,
        PooledEmbeddingsReduceScatter,
        SequenceEmbeddingsAllToAll,
    )

    batches = [2, 0] if ws == 2 else [2, 0, 1]
    dims = [3, 0] if ws == 2 else [2, 0, 3]
    total = sum(batches)

    def t(what: str, r: int, shape: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((what, r, ws)) % 2**31)
        return torch.randn(shape, generator=g, dtype=torch.float64)

    rows = [sum(batches[:s]) for s in range(ws)]
    # all-to-all: out_s = [x_0 | x_1 | ...][rows of s]; x_r.grad = the r-th column block of every g_s, stacked.
    x = t("x", rank, (total, dims[rank])).requires_grad_()
    out = PooledEmbeddingsAllToAll(None, dims)(x, batches)
    g = t("g", rank, (batches[rank], sum(dims)))
    (out * g).sum().backward()
    full = torch.cat([t("x", r, (total, dims[r])) for r in range(ws)], dim=1)
    col = sum(dims[:rank])
    grad = torch.cat([t("g", s, (batches[s], sum(dims)))[:, col : col + dims[rank]] for s in range(ws)])
    assert torch.equal(out.wait(), full[rows[rank] : rows[rank] + batches[rank]])
    assert x.grad is not None and torch.equal(x.grad, grad)

    # reduce-scatter: out_s = sum_r x_r[rows of s] in rank order; x_r.grad = every g_s stacked.
    x = t("p", rank, (total, 2)).requires_grad_()
    out = PooledEmbeddingsReduceScatter()(x, batches)
    (out * t("q", rank, (batches[rank], 2))).sum().backward()
    want = t("p", 0, (total, 2))
    for r in range(1, ws):
        want = want + t("p", r, (total, 2))
    assert torch.equal(out.wait(), want[rows[rank] : rows[rank] + batches[rank]])
    assert x.grad is not None and torch.equal(x.grad, torch.cat([t("q", s, (batches[s], 2)) for s in range(ws)]))

    # sequence: every received id's row goes back to its source, in its input order; the gradient of the
    # owner's row j is the source's output gradient at that id's position.
    for case in ("edges", "vbe"):
        tensors = KJTAllToAll(None, _splits(case, ws))(_kjt(case, rank, ws)).wait()
        received = tensors.wait()
        embs = t("e" + case, rank, (received.values().numel(), 2)).requires_grad_()
        back = SequenceEmbeddingsAllToAll()(embs, tensors)
        n_in = _kjt(case, rank, ws).values().numel()
        gy = t("y" + case, rank, (n_in, 2))
        (back * gy).sum().backward()
        want_rows = torch.zeros(n_in, 2, dtype=torch.float64)
        for owner in range(ws):
            owner_embs = t("e" + case, owner, (len(_expected(case, owner, ws)["values"]), 2))
            for j, (s, i) in enumerate(_expected(case, owner, ws)["origin"]):
                if s == rank:
                    want_rows[i] = owner_embs[j]
        assert torch.equal(back.wait(), want_rows), case
        want_grad = torch.stack([t("y" + case, s, (len(_kjt(case, s, ws).values()), 2))[i]
                                 for s, i in _expected(case, rank, ws)["origin"]]) if embs.numel() else embs.detach()  # fmt: skip
        assert embs.grad is not None and torch.equal(embs.grad, want_grad.view_as(embs)), case
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_pooled_and_sequence_gradients_equal_a_hand_computation(world_size: int) -> None:
    run_ranks(_dense_body, world_size)
