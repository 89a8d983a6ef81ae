"""Round-trip properties of KeyedJaggedTensor transforms on random jagged data (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, _ops
from tests.devices import DEVICES
from tests.sparse.strategies import kjt_as_lists, kjts

SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(kjts())
def test_to_dict_then_from_jt_dict_is_identity(kjt: KeyedJaggedTensor) -> None:
    rebuilt = KeyedJaggedTensor.from_jt_dict(kjt.to_dict()) if kjt.stride() > 0 else kjt
    assert kjt_as_lists(rebuilt) == kjt_as_lists(kjt)
    assert rebuilt.keys() == kjt.keys()


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(kjts(), st.data())
def test_split_then_concat_is_identity(device: str, kjt: KeyedJaggedTensor, data) -> None:
    kjt = kjt.to(torch.device(device))
    num_keys = len(kjt.keys())
    cuts = sorted(data.draw(st.lists(st.integers(0, num_keys), max_size=3)))
    bounds = [0, *cuts, num_keys]
    segments = [b - a for a, b in zip(bounds, bounds[1:])]
    parts = kjt.split(segments)
    assert [len(p.keys()) for p in parts] == segments
    expected = kjt_as_lists(kjt)
    for part in parts:
        assert part.stride() == kjt.stride()
        assert kjt_as_lists(part) == {k: expected[k] for k in part.keys()}
    assert kjt_as_lists(KeyedJaggedTensor.concat(parts)) == expected


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(kjts(), st.data())
def test_permute_moves_whole_keys(device: str, kjt: KeyedJaggedTensor, data) -> None:
    kjt = kjt.to(torch.device(device))
    num_keys = len(kjt.keys())
    order = data.draw(st.lists(st.integers(0, num_keys - 1), min_size=1, max_size=num_keys + 2))
    permuted = kjt.permute(order)
    expected = kjt_as_lists(kjt)
    keys = kjt.keys()
    assert permuted.keys() == [keys[i] for i in order]
    # compare per output position (keys may repeat, so compare by position not by dict)
    lengths = permuted.lengths().view(len(order), -1) if kjt.stride() else None
    assert permuted.length_per_key() == [kjt.length_per_key()[i] for i in order]
    pos = 0
    values = permuted.values().tolist()
    for j, src in enumerate(order):
        rows = expected[keys[src]]
        for s, row in enumerate(rows):
            n = int(lengths[j, s]) if lengths is not None else 0
            got = values[pos : pos + n]
            want = [r[0] if isinstance(r, tuple) else r for r in row]
            assert got == want
            pos += n


@SETTINGS
@given(kjts())
def test_permute_then_inverse_is_identity(kjt: KeyedJaggedTensor) -> None:
    n = len(kjt.keys())
    order = list(range(n))[::-1]
    back = kjt.permute(order).permute(order)
    assert kjt_as_lists(back) == kjt_as_lists(kjt)


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(kjts(weighted=True), st.data())
def test_torch_and_fbgemm_permute_agree(device: str, kjt: KeyedJaggedTensor, data) -> None:
    kjt = kjt.to(torch.device(device))
    n = len(kjt.keys())
    order = torch.tensor(data.draw(st.permutations(list(range(n)))), dtype=torch.int32, device=device)
    lengths2d = kjt.lengths().view(n, -1)
    ref = _ops._permute_2d_sparse_torch(order, lengths2d, kjt.values(), kjt.weights())
    got = _ops.permute_2d_sparse(order, lengths2d, kjt.values(), kjt.weights())
    for a, b in zip(ref, got):
        assert torch.equal(a, b)


@SETTINGS
@given(st.lists(st.lists(st.integers(0, 50), max_size=5), min_size=1, max_size=6), st.integers(0, 6))
def test_jagged_dense_round_trips(rows: list[list[int]], pad_to: int) -> None:
    jt = JaggedTensor.from_dense([torch.tensor(r, dtype=torch.int64) for r in rows])
    assert [t.tolist() for t in jt.to_dense()] == rows
    padded = jt.to_padded_dense(padding_value=-1)
    longest = max(len(r) for r in rows)
    assert padded.shape == (len(rows), longest)
    for r, row in zip(padded.tolist(), rows):
        assert r == row + [-1] * (longest - len(row))
    back = JaggedTensor.from_dense_lengths(padded, jt.lengths())
    assert back.values().tolist() == sum(rows, [])
    truncated = jt.to_padded_dense(desired_length=pad_to)
    assert truncated.shape == (len(rows), pad_to)
    for r, row in zip(truncated.tolist(), rows):
        assert r == (row + [0] * pad_to)[:pad_to]


@pytest.mark.parametrize("device", DEVICES)
@SETTINGS
@given(kjts())
def test_offsets_and_lengths_agree(device: str, kjt: KeyedJaggedTensor) -> None:
    kjt = kjt.to(torch.device(device))
    offsets = kjt.offsets()
    from_offsets = KeyedJaggedTensor(
        keys=kjt.keys(), values=kjt.values(), offsets=offsets, stride=kjt.stride()
    )
    assert torch.equal(from_offsets.lengths(), kjt.lengths())
    assert offsets[0] == 0 and offsets[-1] == kjt.values().numel()
    assert kjt.offset_per_key()[-1] == kjt.values().numel()
    from_offsets.validate()
