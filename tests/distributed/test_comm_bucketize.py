"""Row-wise bucketization against a plain-Python reference, and fbgemm against the torch path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrec._fbgemm import has_fbgemm_op
from lightrec.distributed.comm import bucketize as bz
from lightrec.distributed.comm.bucketize import (
    IdOutOfRangeError,
    bucketize_kjt_row_wise,
    row_wise_block_bounds,
    row_wise_block_size,
)
from lightrec.sparse import KeyedJaggedTensor


def _reference(bags, world_size, bounds):  # noqa: ANN001, ANN202
    """bags[t][b] = list of (id, weight); returns bucket-major lengths, values, weights, permute."""
    num_keys, batch = len(bags), len(bags[0]) if bags else 0
    buckets = [[[[] for _ in range(batch)] for _ in range(num_keys)] for _ in range(world_size)]
    flat_pos = 0
    for t in range(num_keys):
        for b in range(batch):
            for i, w in bags[t][b]:
                r = max(rr for rr in range(world_size) if bounds[t][rr] <= i)
                buckets[r][t][b].append((i - bounds[t][r], w, flat_pos))
                flat_pos += 1
    lengths, values, weights, order = [], [], [], []
    for r in range(world_size):
        for t in range(num_keys):
            for b in range(batch):
                lengths.append(len(buckets[r][t][b]))
                for local, w, pos in buckets[r][t][b]:
                    values.append(local)
                    weights.append(w)
                    order.append(pos)
    permute = [0] * len(order)
    for out_pos, in_pos in enumerate(order):
        permute[in_pos] = out_pos
    return lengths, values, weights, permute


_DTYPES = st.tuples(st.sampled_from([torch.int32, torch.int64]), st.sampled_from([torch.int32, torch.int64]))


@st.composite
def _cases(draw):  # noqa: ANN001, ANN202
    world_size = draw(st.integers(1, 4))
    num_keys = draw(st.integers(1, 3))
    batch = draw(st.integers(0, 4))
    rows = [draw(st.integers(1, 9)) for _ in range(num_keys)]  # often fewer rows than ranks
    custom = draw(st.booleans())
    bounds = []
    for n in rows:
        if custom:
            inner = sorted(
                draw(st.lists(st.integers(0, n), min_size=world_size - 1, max_size=world_size - 1))
            )
            bounds.append([0, *inner, n])
        else:
            bounds.append(row_wise_block_bounds(n, world_size))
    bags = [
        [[(draw(st.integers(0, n - 1)), draw(st.floats(-2, 2, width=32))) for _ in range(draw(st.integers(0, 3)))]
         for _ in range(batch)]
        for n in rows
    ]  # fmt: skip
    return world_size, rows, bounds, custom, bags, draw(st.booleans()), draw(_DTYPES)


def _kjt(bags, weighted, dtypes):  # noqa: ANN001, ANN202
    keys = [f"f{t}" for t in range(len(bags))]
    lengths = torch.tensor([len(bag) for per_key in bags for bag in per_key], dtype=dtypes[0])
    values = torch.tensor([i for per_key in bags for bag in per_key for i, _ in bag], dtype=dtypes[1])
    weights = torch.tensor([w for per_key in bags for bag in per_key for _, w in bag], dtype=torch.float32)
    return KeyedJaggedTensor(
        keys, values, weights if weighted else None, lengths=lengths, stride=len(bags[0])
    )


@settings(max_examples=150, deadline=None)
@given(_cases())
def test_bucketize_matches_python_reference(case) -> None:  # noqa: ANN001
    world_size, rows, bounds, custom, bags, weighted, dtype = case
    kjt = _kjt(bags, weighted, dtype)
    block_sizes = [row_wise_block_size(n, world_size) for n in rows]
    out = bucketize_kjt_row_wise(
        kjt, world_size, block_sizes, block_bounds=bounds if custom else None,
        num_rows=rows, output_permute=True,
    )  # fmt: skip
    lengths, values, weights, permute = _reference(bags, world_size, bounds)
    assert out.kjt.keys() == kjt.keys() * world_size
    assert out.kjt.stride() == kjt.stride()
    assert out.kjt.lengths().tolist() == lengths
    assert out.kjt.lengths().dtype == dtype[0]
    assert out.kjt.values().dtype == dtype[1]
    assert out.kjt.values().tolist() == values
    assert out.unbucketize_permute.tolist() == permute
    if weighted:
        assert out.kjt.weights().tolist() == pytest.approx(weights)
    else:
        assert out.kjt.weights_or_none() is None
    # The permutation puts per-id outputs back in input order.
    restored = out.kjt.values()[out.unbucketize_permute]
    want = [i - bounds[t][max(r for r in range(world_size) if bounds[t][r] <= i)]
            for t in range(len(bags)) for bag in bags[t] for i, _ in bag]  # fmt: skip
    assert restored.tolist() == want


@pytest.mark.skipif(not has_fbgemm_op("block_bucketize_sparse_features"), reason="fbgemm op unavailable")
@settings(max_examples=100, deadline=None)
@given(_cases(), st.booleans(), st.booleans())
def test_torch_path_equals_fbgemm(case, wrap_ids, sequence) -> None:  # noqa: ANN001
    world_size, rows, bounds, custom, bags, weighted, dtype = case
    kjt = _kjt(bags, weighted, dtype)
    values = kjt.values()
    block_sizes = [row_wise_block_size(n, world_size) for n in rows]
    if wrap_ids and not custom:
        # Ids past W * block_size: both paths wrap them cyclically.
        values = values + 3 * world_size * max(block_sizes)
    use_bounds = bounds if custom else None
    lengths, weights = kjt.lengths(), kjt.weights_or_none()
    want = bz._bucketize_fbgemm(lengths, values, weights, world_size, block_sizes, use_bounds, sequence)
    got = bz._bucketize_torch(
        lengths, values, weights, len(rows), kjt.stride(), world_size, block_sizes, use_bounds, sequence
    )
    for w, g in zip(want, got, strict=True):
        if w is None:
            assert g is None
        else:
            assert w.dtype == g.dtype
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_ids_out_of_range_and_bad_arguments_raise() -> None:
    kjt = KeyedJaggedTensor(["a", "b"], torch.tensor([1, 7, 0]), lengths=torch.tensor([1, 1, 1, 0]))
    with pytest.raises(IdOutOfRangeError, match=r"'a' has id 7.*\[0, 5\)"):
        bucketize_kjt_row_wise(kjt, 2, [3, 3], num_rows=[5, 5])
    neg = KeyedJaggedTensor(["a"], torch.tensor([-1]), lengths=torch.tensor([1]))
    with pytest.raises(IdOutOfRangeError, match="id -1"):
        bucketize_kjt_row_wise(neg, 2, [3], num_rows=[5])
    with pytest.raises(ValueError, match="block_sizes"):
        bucketize_kjt_row_wise(kjt, 2, [3])
    with pytest.raises(ValueError, match="block_bounds for key 'a'"):
        bucketize_kjt_row_wise(kjt, 2, [3, 3], block_bounds=[[0, 4, 2], [0, 1, 2]])


def test_default_blocks_uneven_and_smaller_than_world() -> None:
    assert row_wise_block_bounds(10, 4) == [0, 3, 6, 9, 10]
    assert row_wise_block_bounds(2, 3) == [0, 1, 2, 2]  # the last rank owns no row
    assert row_wise_block_bounds(9, 3) == [0, 3, 6, 9]
