"""KJT all-to-all (and row-wise bucketize + all-to-all) on real gloo ranks vs a one-process reference.

One launch per world size (shared with ``test_comm_dense``) runs every case; inputs are
regenerated in the parent from the same seeds, and the expected output of each rank is built by
plain Python from all ranks' inputs.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.test_comm_dense import rank_results

# (key_splits, batch size per rank, weighted, lengths dtype, row-wise bucketize rows or None)
CASES: dict[int, list[tuple]] = {
    1: [([2], [3], True, torch.int64, None), ([2], [2], False, torch.int32, [4, 1])],
    2: [
        ([2, 1], [3, 3], False, torch.int64, None),
        ([1, 2], [2, 4], True, torch.int32, None),  # uneven batches
        ([3, 0], [1, 0], True, torch.int64, None),  # a rank with no keys and one with no samples
        ([2, 2], [3, 1], True, torch.int64, [5, 1]),  # row-wise: bucketized, table smaller than W
    ],
    3: [
        ([1, 2, 1], [2, 2, 2], False, torch.int64, None),
        ([2, 0, 2], [1, 3, 0], True, torch.int32, None),
        ([2, 2, 2], [2, 1, 3], False, torch.int64, [7, 2]),  # row-wise, uneven last block
    ],
}


def _bags(case: int, rank: int, num_keys: int, batch: int, rows: list[int] | None) -> list[list[list[tuple]]]:
    """bags[key][sample] = [(id, weight), ...], deterministic per (case, rank)."""
    g = torch.Generator().manual_seed(100 * case + rank)
    out = []
    for k in range(num_keys):
        per_key = []
        for _ in range(batch):
            n = int(torch.randint(0, 4, (1,), generator=g))
            hi = rows[k] if rows is not None else 50
            ids = torch.randint(0, hi, (n,), generator=g).tolist()
            ws = torch.rand(n, generator=g).tolist()
            per_key.append(list(zip(ids, ws, strict=True)))
        out.append(per_key)
    return out


def _kjt(bags, weighted: bool, dtype: torch.dtype, batch: int):  # noqa: ANN001, ANN202
    from lightrec.sparse import KeyedJaggedTensor

    lengths = torch.tensor([len(bag) for per_key in bags for bag in per_key], dtype=dtype)
    values = torch.tensor([i for per_key in bags for bag in per_key for i, _ in bag], dtype=torch.int64)
    weights = torch.tensor([w for per_key in bags for bag in per_key for _, w in bag], dtype=torch.float32)
    keys = [f"f{k}" for k in range(len(bags))]
    return KeyedJaggedTensor(keys, values, weights if weighted else None, lengths=lengths, stride=batch)


def _table(kjt) -> torch.Tensor:  # noqa: ANN001
    """A fake embedding lookup: row of (key k, id i) is [100 k + i, -(k + 1) i] for each value."""
    key_ids = torch.tensor([int(k[1:]) for k in kjt.keys()], dtype=torch.float64)
    per_key = (
        kjt.lengths().view(len(kjt.keys()), -1).sum(1)
        if kjt.keys() and kjt.stride()
        else torch.zeros(len(kjt.keys()), dtype=torch.int64)
    )
    key = torch.repeat_interleave(key_ids, per_key.long())
    ids = kjt.values().to(torch.float64)
    return torch.stack([100 * key + ids, -(key + 1) * ids], dim=1)


def _sequence_round_trip(kjt, out, tensors_aw, rank: int, case: int) -> dict:  # noqa: ANN001
    """Rows looked up on the owner come back in input order; backward is the adjoint."""
    from lightrec.distributed.comm import SequenceEmbeddingsAllToAll

    seq = SequenceEmbeddingsAllToAll()
    rows = seq(_table(out), tensors_aw).wait()
    g = torch.Generator().manual_seed(7 * case + rank)
    x = torch.randn(out.values().numel(), 2, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(kjt.values().numel(), 2, generator=g, dtype=torch.float64)
    moved = seq(x, tensors_aw)
    inner = (moved * y).sum()  # LazyAwaitable resolves on use
    inner.backward()
    return {
        "rows_ok": torch.equal(rows, _table(kjt)),
        "ip_out": inner.item(),
        "ip_in": (x * x.grad).sum().item(),
    }


def run_kjt_cases(rank: int, world_size: int) -> dict:
    from lightrec.distributed.comm import (
        KJTAllToAll,
        KJTAllToAllError,
        bucketize_kjt_row_wise,
        row_wise_block_size,
    )

    results = []
    for i, (splits, batches, weighted, dtype, rows) in enumerate(CASES[world_size]):
        num_keys = len(rows) if rows is not None else sum(splits)
        bags = _bags(i, rank, num_keys, batches[rank], rows)
        kjt = _kjt(bags, weighted, dtype, batches[rank])
        if rows is not None:
            sizes = [row_wise_block_size(n, world_size) for n in rows]
            kjt = bucketize_kjt_row_wise(kjt, world_size, sizes, num_rows=rows).kjt
        tensors_aw = KJTAllToAll(None, splits)(kjt).wait()
        out = tensors_aw.wait()
        results.append({
            "keys": out.keys(), "stride": out.stride(), "lengths": out.lengths(), "values": out.values(),
            "weights": out.weights_or_none(), "batch_size_per_rank": tensors_aw.batch_size_per_rank,
            "values_per_rank": tensors_aw.values_per_rank, "value_index": tensors_aw.value_index,
            "sequence": _sequence_round_trip(kjt, out, tensors_aw, rank, i),
        })  # fmt: skip
    # Ranks that disagree about weights all get the same clear error (and no tensor all-to-all).
    bags = _bags(99, rank, 2, 2, None)
    kjt = _kjt(bags, rank == 0, torch.int64, 2)
    try:
        KJTAllToAll(None, [1] * (world_size - 1) + [2 - world_size + 1])(kjt).wait()
        error = None
    except KJTAllToAllError as exc:
        error = str(exc)
    return {"cases": results, "error": error}


def _expected(world_size: int, case: int, me: int) -> dict:
    """Plain-Python output of rank ``me``: its keys, all ranks' samples in rank order."""
    from lightrec.distributed.comm.bucketize import row_wise_block_bounds

    splits, batches, weighted, _, rows = CASES[world_size][case]
    all_bags = []
    for r in range(world_size):
        num_keys = len(rows) if rows is not None else sum(splits)
        bags = _bags(case, r, num_keys, batches[r], rows)
        if rows is not None:  # bucketize by hand: keys repeated per rank, ids rebased
            bounds = [row_wise_block_bounds(n, world_size) for n in rows]
            owner = [[max(q for q in range(world_size) if b[q] <= i) for i in range(n)] for b, n in zip(bounds, rows, strict=True)]  # fmt: skip
            bags = [
                [[(i - bounds[k][q], w) for i, w in bag if owner[k][i] == q] for bag in bags[k]]
                for q in range(world_size) for k in range(len(rows))
            ]  # fmt: skip
        all_bags.append(bags)
    start = sum(splits[:me])
    my_keys = list(range(start, start + splits[me]))
    key_names = [f"f{k % len(rows)}" if rows is not None else f"f{k}" for k in my_keys]
    lengths, values, weights = [], [], []
    for k in my_keys:
        for r in range(world_size):
            for bag in all_bags[r][k]:
                lengths.append(len(bag))
                values += [i for i, _ in bag]
                weights += [w for _, w in bag]
    # Source-major receive order, to check value_index.
    received = [i for r in range(world_size) for k in my_keys for bag in all_bags[r][k] for i, _ in bag]
    per_rank = [sum(len(bag) for k in my_keys for bag in all_bags[r][k]) for r in range(world_size)]
    return {"keys": key_names, "stride": sum(batches), "lengths": lengths, "values": values,
            "weights": weights if weighted else None, "received": received, "values_per_rank": per_rank}  # fmt: skip


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_kjt_all_to_all_matches_reference(world_size: int) -> None:
    got = [r["kjt"] for r in rank_results(world_size)]
    for case in range(len(CASES[world_size])):
        dtype = CASES[world_size][case][3]
        for me in range(world_size):
            g, want = got[me]["cases"][case], _expected(world_size, case, me)
            ctx = f"case {case} rank {me}"
            assert g["keys"] == want["keys"], ctx
            assert g["stride"] == want["stride"], ctx
            assert g["batch_size_per_rank"] == CASES[world_size][case][1], ctx
            assert g["values_per_rank"] == want["values_per_rank"], ctx
            assert g["lengths"].dtype == dtype, ctx
            assert g["lengths"].tolist() == want["lengths"], ctx
            assert g["values"].tolist() == want["values"], ctx
            if want["weights"] is None:
                assert g["weights"] is None, ctx
            else:
                assert g["weights"].tolist() == pytest.approx(want["weights"]), ctx
            received = torch.tensor(want["received"], dtype=torch.int64)
            index = g["value_index"]
            reordered = received if index is None else received[index]
            assert reordered.tolist() == want["values"], ctx
            assert g["sequence"]["rows_ok"], ctx
        # <A x, y> summed over ranks equals <x, A^T y>: the backward is the forward's adjoint.
        ip_out = sum(got[r]["cases"][case]["sequence"]["ip_out"] for r in range(world_size))
        ip_in = sum(got[r]["cases"][case]["sequence"]["ip_in"] for r in range(world_size))
        assert ip_out == pytest.approx(ip_in, rel=1e-9, abs=1e-9)
    for me in range(world_size):
        if world_size == 1:  # a single rank cannot disagree with itself
            assert got[me]["error"] is None
        else:
            assert got[me]["error"] is not None and "ranks [0] sent weighted" in got[me]["error"]


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("lengths_dtype", [torch.int32, torch.int64])
def test_host_segment_permute_equals_the_device_one(weighted: bool, lengths_dtype: torch.dtype) -> None:
    """The cut-and-concatenate permute (batches on the host) against the index-gather one (accelerators):
    uneven segments, empty ones and empty bags, key-major order from source-major."""
    from lightrec.distributed.comm._jagged import permute_segments, permute_segments_on_host

    g = torch.Generator().manual_seed(7)
    sizes = [3, 0, 2, 4, 1, 0]  # bags of (source, key) segments, source-major: 2 sources x 3 keys
    lengths = torch.randint(0, 4, (sum(sizes),), generator=g).to(lengths_dtype)
    values = torch.randint(0, 100, (int(lengths.sum()),), generator=g)
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    order = [s * 3 + k for k in range(3) for s in range(2)]
    want = permute_segments(lengths, values, weights, sizes, order)
    got = permute_segments_on_host(lengths, values, weights, sizes, order)
    assert got[0].dtype == lengths_dtype and torch.equal(got[0], want[0])
    assert torch.equal(got[1], want[1])
    assert (got[2] is None) == (want[2] is None) and (got[2] is None or torch.equal(got[2], want[2]))
    assert torch.equal(got[3].value_index(), want[3])
