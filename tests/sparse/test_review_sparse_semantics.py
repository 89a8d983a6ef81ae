"""Review of ``lightrec.sparse`` against torchrec's semantics, with a plain-Python model of each batch.

Every expectation is computed from lists (``{key: [[ids of sample 0], ...]}``), never by the code
under test. The fixes they pin (wrong before):

* ``KeyedJaggedTensor.concat`` of the parts of a variable-batch ``split``/``permute`` repeated every
  inverse-indices row once per part (9 rows for 3 keys);
* ``stride()`` of a KJT built from empty offsets was -1; ``split`` took negative segments;
* ``JaggedTensor.to_dense``/``to_padded_dense``/``str`` crashed on offsets that do not start at 0
  (torchrec reads rows at the offsets), and ``validate()`` blamed the lengths for them;
* ``KeyedTensor.regroup`` with an empty group raised (torchrec gives a width-0 block);
* an empty Python list of lengths became float32 lengths;
* torchrec API missing: ``KeyedJaggedTensor.to(dtype=)``, ``to_dict(compute_offsets=)``,
  ``copy_``, ``size_in_bytes``, ``_key_indices``; ``from_jt_dict`` did not sync;
  ``empty_like(kjt, device)`` and ``pin_memory`` dropped the inverse indices;
* ``dist_init`` misread torchrec's per-sample ``recat`` (ranks of different batch sizes);
* ``validate()`` let inverse indices point past a key's batch (a device-side assert later).

No `from __future__ import annotations`: TorchScript must see real classes in the scripted helper.
"""

import random

import pytest
import torch

from lightrec.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor, SparseValueError
from lightrec.sparse.jagged_tensor import jt_is_equal, kjt_is_equal
from tests.devices import DEVICES

Rows = list[list[tuple[int, float]]]  # one list of (id, weight) per sample


# ------------------------------------------------------------------------------ the plain model
def _random_model(seed: int, num_keys: int, variable: bool) -> dict[str, Rows]:
    rng = random.Random(seed)
    batch = rng.randint(0, 4)
    model: dict[str, Rows] = {}
    for k in range(num_keys):
        b = rng.randint(0, 4) if variable else batch
        model[f"f{k}"] = [
            [(rng.randint(0, 99), float(rng.randint(0, 9))) for _ in range(rng.choice([0, 0, 1, 2, 3]))]
            for _ in range(b)
        ]
    return model


def _build(
    model: dict[str, Rows],
    variable: bool,
    weighted: bool = True,
    values_dtype: torch.dtype = torch.int64,
    lengths_dtype: torch.dtype = torch.int64,
    device: str = "cpu",
) -> KeyedJaggedTensor:
    keys = list(model)
    lengths = [len(row) for rows in model.values() for row in rows]
    ids = [i for rows in model.values() for row in rows for i, _ in row]
    weights = [w for rows in model.values() for row in rows for _, w in row]
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.tensor(ids, dtype=values_dtype, device=device),
        lengths=torch.tensor(lengths, dtype=lengths_dtype, device=device),
        weights=torch.tensor(weights, dtype=torch.float32, device=device) if weighted else None,
        stride_per_key_per_rank=[[len(rows)] for rows in model.values()] if variable else None,
        stride=None if variable else (len(next(iter(model.values()))) if model else 0),
    )


def _read(kjt: KeyedJaggedTensor) -> list[tuple[str, Rows]]:
    """The batch back as the plain model, key by key in order (keys may repeat)."""
    lengths = kjt.lengths().tolist()
    ids = kjt.values().tolist()
    w = kjt.weights_or_none()
    weights = w.tolist() if w is not None else [0.0] * len(ids)
    out: list[tuple[str, Rows]] = []
    pos = row = 0
    for key, batch in zip(kjt.keys(), kjt.stride_per_key()):
        rows: Rows = []
        for _ in range(batch):
            n = lengths[row]
            rows.append([(ids[i], weights[i]) for i in range(pos, pos + n)])
            pos += n
            row += 1
        out.append((key, rows))
    assert pos == len(ids) and row == len(lengths)
    return out


# ------------------------------------------------------------------------------ permute / split / concat
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variable", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_permute_with_repeated_and_dropped_keys_moves_whole_keys(device: str, variable: bool, seed: int) -> None:
    model = _random_model(seed, num_keys=4, variable=variable)
    kjt = _build(model, variable, values_dtype=torch.int32 if seed % 2 else torch.int64, device=device)
    keys = list(model)
    order = [random.Random(seed).randrange(len(keys)) for _ in range(5)]  # repeats, drops some
    permuted = kjt.permute(order)
    assert _read(permuted) == [(keys[i], model[keys[i]]) for i in order]
    assert permuted.values().dtype == kjt.values().dtype and permuted.lengths().dtype == kjt.lengths().dtype
    assert permuted.length_per_key() == [sum(len(r) for r in model[keys[i]]) for i in order]
    if variable:
        assert permuted.stride_per_key_per_rank() == [[len(model[keys[i]])] for i in order]


@pytest.mark.parametrize("variable", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_split_with_empty_segments_then_concat_gives_the_batch_back(variable: bool, seed: int) -> None:
    model = _random_model(seed, num_keys=3, variable=variable)
    kjt = _build(model, variable)
    parts = kjt.split([0, 2, 0, 1, 0])
    assert [p.keys() for p in parts] == [[], ["f0", "f1"], [], ["f2"], []]
    assert _read(parts[1]) == [(k, model[k]) for k in ["f0", "f1"]]
    assert _read(parts[3]) == [("f2", model["f2"])]
    for empty in parts[0::2]:
        assert empty.values().numel() == 0 and empty.lengths().numel() == 0 and empty.stride() == kjt.stride()
    assert kjt_is_equal(KeyedJaggedTensor.concat(parts), kjt)
    with pytest.raises(ValueError, match="a segment is a number of keys, got -1"):
        kjt.split([3, -1, 1])  # sums to the 3 keys, but used to give overlapping, wrong parts


def test_concat_of_a_variable_batch_split_keeps_one_inverse_row_per_key() -> None:
    """Each part carries the source's (keys, [F, B]); concat used to stack them all (9 rows for 3 keys)."""
    inverse = torch.tensor([[0, 1, 1], [0, 1, 2], [0, 0, 0]])
    kjt = KeyedJaggedTensor(
        keys=["u", "i", "c"], values=torch.arange(6), lengths=torch.tensor([2, 1, 1, 0, 2, 0]),
        stride_per_key_per_rank=[[2], [3], [1]], inverse_indices=(["u", "i", "c"], inverse),
    )  # fmt: skip
    back = KeyedJaggedTensor.concat(kjt.split([1, 2]))
    assert back.inverse_indices()[0] == ["u", "i", "c"] and torch.equal(back.inverse_indices()[1], inverse)
    swapped = KeyedJaggedTensor.concat([kjt.permute([2, 0]), kjt.permute([1])])
    assert swapped.keys() == ["c", "u", "i"] and swapped.inverse_indices()[0] == ["u", "i", "c"]
    assert torch.equal(swapped.to_fixed_batch().values(), KeyedJaggedTensor.concat(
        [kjt.to_fixed_batch().permute([2, 0]), kjt.to_fixed_batch().permute([1])]
    ).values())  # fmt: skip


def test_concat_refuses_what_torchrec_refuses() -> None:
    a = KeyedJaggedTensor(keys=["a"], values=torch.arange(3), lengths=torch.tensor([1, 2]))
    b = KeyedJaggedTensor(keys=["b"], values=torch.arange(3), lengths=torch.tensor([1, 2, 0]))
    vb = KeyedJaggedTensor(keys=["v"], values=torch.arange(1), lengths=torch.tensor([1]), stride_per_key_per_rank=[[1]])
    w = KeyedJaggedTensor(keys=["w"], values=torch.arange(1), lengths=torch.tensor([1, 0]), weights=torch.ones(1))
    for bad in ([a, b], [a, vb], [a, w], []):
        with pytest.raises(ValueError):
            KeyedJaggedTensor.concat(bad)
    # variable-batch KJTs of different batch sizes do concatenate (torchrec: per-key strides)
    vb2 = KeyedJaggedTensor(keys=["x"], values=torch.arange(2), lengths=torch.tensor([1, 0, 1]),
                            stride_per_key_per_rank=[[3]])  # fmt: skip
    both = KeyedJaggedTensor.concat([vb, vb2])
    assert both.stride_per_key_per_rank() == [[1], [3]] and both.stride() == 3
    assert _read(both) == [("v", [[(0, 0.0)]]), ("x", [[(0, 0.0)], [], [(1, 0.0)]])]


# ------------------------------------------------------------------------------ to_dict / getitem
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variable", [False, True])
def test_to_dict_matches_the_model_with_and_without_offsets(device: str, variable: bool) -> None:
    model = _random_model(3, num_keys=3, variable=variable)
    model["f1"] = [[] for _ in model["f1"]]  # a key without ids
    for compute_offsets in (True, False):
        kjt = _build(model, variable, lengths_dtype=torch.int32, device=device)
        jts = kjt.to_dict(compute_offsets=compute_offsets)
        assert list(jts) == list(model)
        for key, jt in jts.items():
            rows = model[key]
            assert [t.tolist() for t in jt.to_dense()] == [[i for i, _ in r] for r in rows]
            assert [t.tolist() for t in jt.to_dense_weights()] == [[w for _, w in r] for r in rows]
            assert jt.lengths().tolist() == [len(r) for r in rows] and jt.lengths().dtype == torch.int32
            expected_offsets = [sum(len(r) for r in rows[:b]) for b in range(len(rows) + 1)]
            if compute_offsets:  # torchrec's default: the JaggedTensors carry their offsets
                assert jt.offsets_or_none() is not None and jt.offsets_or_none().tolist() == expected_offsets
            else:
                assert jt.offsets_or_none() is None and jt.offsets().tolist() == expected_offsets
            assert jt_is_equal(kjt[key], jt)


def test_kjt_with_zero_keys_zero_batch_and_all_zero_lengths() -> None:
    empty = KeyedJaggedTensor.empty(is_weighted=True)
    assert empty.to_dict() == {} and empty.permute([]).keys() == [] and empty.split([0])[0].keys() == []
    assert empty.length_per_key() == [] and str(empty) == "KeyedJaggedTensor()\n"
    assert KeyedJaggedTensor.concat([empty, empty]).keys() == []
    no_batch = KeyedJaggedTensor(keys=["a", "b"], values=torch.empty(0, dtype=torch.long),
                                 lengths=torch.empty(0, dtype=torch.int32))  # fmt: skip
    assert no_batch.stride() == 0 and no_batch.length_per_key() == [0, 0]
    assert no_batch["b"].lengths().numel() == 0 and no_batch.permute([1, 0, 1]).keys() == ["b", "a", "b"]
    no_batch.validate()
    # built from empty offsets: no samples, not a batch of -1
    from_offsets = KeyedJaggedTensor(keys=["a"], values=torch.empty(0, dtype=torch.long),
                                     offsets=torch.empty(0, dtype=torch.long))  # fmt: skip
    assert from_offsets.stride() == 0 and from_offsets.length_per_key() == [0]
    zeros = KeyedJaggedTensor(keys=["a", "b"], values=torch.empty(0, dtype=torch.long), lengths=torch.zeros(6, dtype=torch.long))
    assert zeros.stride() == 3 and zeros.length_per_key() == [0, 0]
    assert zeros.permute([1, 1]).lengths().tolist() == [0] * 6 and zeros["a"].to_padded_dense().shape == (3, 0)
    assert zeros["a"].to_padded_dense(2, padding_value=-1).tolist() == [[-1, -1]] * 3


# ------------------------------------------------------------------------------ JaggedTensor dense forms
def test_to_padded_dense_truncates_pads_and_keeps_the_inner_dims() -> None:
    rows = [[1.0, 2.0], [], [3.0], [4.0, 5.0, 6.0, 7.0]]
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    jt = JaggedTensor(values=torch.tensor([v for r in rows for v in r]), lengths=lengths,
                      weights=torch.tensor([v / 10 for r in rows for v in r]))  # fmt: skip
    for length in (0, 2, 5, None):
        n = length if length is not None else 4
        expected = [(r + [9.0] * n)[:n] for r in rows]
        assert jt.to_padded_dense(length, padding_value=9.0).tolist() == expected
        got_w = jt.to_padded_dense_weights(length, padding_value=-1.0)
        assert got_w is not None
        torch.testing.assert_close(got_w, torch.tensor([([v / 10 for v in r] + [-1.0] * n)[:n] for r in rows]).view(4, n))
    embeddings = JaggedTensor(values=torch.arange(12.0).view(6, 2), lengths=torch.tensor([2, 0, 4]))
    assert embeddings.to_padded_dense(3, -1.0).tolist() == [
        [[0.0, 1.0], [2.0, 3.0], [-1.0, -1.0]],
        [[-1.0, -1.0]] * 3,
        [[4.0, 5.0], [6.0, 7.0], [8.0, 9.0]],
    ]
    assert JaggedTensor.empty().to_padded_dense().shape == (0, 0)
    assert JaggedTensor(values=torch.tensor([4, 5]), lengths=torch.tensor([2])).to_padded_dense(3).dtype == torch.int64


def test_rows_are_read_at_the_offsets_as_torchrec_does() -> None:
    """torchrec's to_dense / to_padded_dense / str read values[offsets[b]:offsets[b+1]]."""
    jt = JaggedTensor(values=torch.tensor([9, 9, 1, 2, 3]), offsets=torch.tensor([2, 4, 5]),
                      weights=torch.tensor([0.0, 0.0, 0.1, 0.2, 0.3]))  # fmt: skip
    assert [t.tolist() for t in jt.to_dense()] == [[1, 2], [3]]
    assert [t.tolist() for t in jt.to_dense_weights()] == [pytest.approx([0.1, 0.2]), pytest.approx([0.3])]
    assert jt.to_padded_dense(padding_value=-1).tolist() == [[1, 2], [3, -1]]
    assert "[[1, 2], [3]]" in str(jt)
    # ... but the layout the other types expect starts at 0, and validate() says so
    with pytest.raises(SparseValueError, match=r"offsets must start at 0, got offsets\[0\] = 2"):
        jt.validate()
    with pytest.raises(SparseValueError, match=r"offsets must start at 0, got offsets\[0\] = 2"):
        KeyedJaggedTensor(keys=["a"], values=torch.tensor([9, 9, 1, 2, 3]), offsets=torch.tensor([2, 4, 5]), validate=True)


# ------------------------------------------------------------------------------ KeyedTensor.regroup
def test_regroup_with_shared_duplicated_and_empty_groups_matches_columns() -> None:
    batch = 3
    a = torch.randn(batch, 1, requires_grad=True)
    b = torch.randn(batch, 2, requires_grad=True)
    c = torch.randn(batch, 3, requires_grad=True)
    a2 = torch.randn(batch, 1, requires_grad=True)  # a second block named "a": the last input wins
    kts = [KeyedTensor.from_tensor_list(["a", "b"], [a, b]), KeyedTensor(["c"], [3], c), KeyedTensor(["a"], [1], a2)]
    blocks = {"a": a2, "b": b, "c": c}
    groups = [["c", "a"], ["b", "a", "b"], [], ["a"]]
    out = KeyedTensor.regroup(kts, groups)
    assert [t.shape for t in out] == [(batch, 4), (batch, 5), (batch, 0), (batch, 1)]
    for got, group in zip(out, groups):
        expected = torch.cat([blocks[k] for k in group], dim=1) if group else torch.empty(batch, 0)
        torch.testing.assert_close(got, expected)
    named = KeyedTensor.regroup_as_dict(kts, groups, ["g0", "g1", "g2", "g3"])
    assert list(named) == ["g0", "g1", "g2", "g3"] and named["g2"].shape == (batch, 0)
    sum(t.sum() * (i + 1) for i, t in enumerate(out)).backward()
    # each use of a block adds its group's weight to the block's gradient
    torch.testing.assert_close(a2.grad, torch.full((batch, 1), 1.0 + 2.0 + 4.0))
    torch.testing.assert_close(b.grad, torch.full((batch, 2), 4.0))
    torch.testing.assert_close(c.grad, torch.full((batch, 3), 1.0))
    assert a.grad is None or torch.count_nonzero(a.grad) == 0
    only_empty = KeyedTensor.regroup(kts[:1], [[], []])
    assert [t.shape for t in only_empty] == [(batch, 0), (batch, 0)]
    with pytest.raises(KeyError):
        KeyedTensor.regroup(kts, [["nope"]])


# ------------------------------------------------------------------------------ dtypes, construction errors
def test_empty_python_lists_make_integer_lengths() -> None:
    """torch.tensor([]) is float32: an empty list of lengths/offsets used to become float lengths."""
    listed = KeyedJaggedTensor(keys=[], values=[], lengths=[])
    assert listed.lengths().dtype == torch.int64 and listed.offsets().tolist() == [0]
    assert JaggedTensor(values=[], offsets=[]).offsets().dtype == torch.int64
    listed.validate()


def test_int32_ids_with_int64_lengths_keep_their_dtypes_through_every_transform() -> None:
    kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.tensor([5, 6, 7], dtype=torch.int32),
                            lengths=torch.tensor([2, 0, 0, 1]), weights=torch.ones(3, dtype=torch.float16))  # fmt: skip
    for out in (kjt.permute([1, 0]), kjt.split([1, 1])[1], KeyedJaggedTensor.concat([kjt, kjt.permute([0])])):
        assert out.values().dtype == torch.int32 and out.lengths().dtype == torch.int64
        assert out.weights().dtype == torch.float16
    assert kjt["b"].values().dtype == torch.int32 and kjt.offsets().dtype == torch.int64
    assert kjt.permute([1, 0]).values().tolist() == [7, 5, 6]
    moved = kjt.to(torch.device("cpu"), dtype=torch.float32)  # torchrec's dtype: the weights only
    assert moved.weights().dtype == torch.float32 and moved.values().dtype == torch.int32


# ------------------------------------------------------------------------------ validate()
def test_validate_names_the_argument_of_each_inconsistency() -> None:
    def bad(match: str, **kwargs) -> None:
        with pytest.raises(SparseValueError, match=match):
            KeyedJaggedTensor(**kwargs, validate=True)

    bad(r"sum to 4 but values has 2", keys=["a"], values=torch.arange(2), lengths=torch.tensor([3, 1]))
    bad(r"1 values beyond the last feature 'a'", keys=["a"], values=torch.arange(5), lengths=torch.tensor([3, 1]))
    bad(r"feature 'b' has a negative length: -1 ids for sample 0", keys=["a", "b"], values=torch.arange(2),
        lengths=torch.tensor([2, 1, -1, 0]))  # fmt: skip
    bad(r"2 lengths, not divisible by its 3 keys", keys=["a", "b", "c"], values=torch.arange(4),
        lengths=torch.tensor([3, 1]))  # fmt: skip
    bad(r"stride=3", keys=["a"], values=torch.arange(4), lengths=torch.tensor([3, 1]), stride=3)
    bad(r"offsets \[0, 2, 4\] are not the running sum of lengths \[3, 1\]", keys=["a"], values=torch.arange(4),
        lengths=torch.tensor([3, 1]), offsets=torch.tensor([0, 2, 4]))  # fmt: skip
    bad(r"inverse_indices row of feature 'u' holds indices in \[0, 2\] but the feature has 2 bags",
        keys=["u"], values=torch.arange(3), lengths=torch.tensor([2, 1]), stride_per_key_per_rank=[[2]],
        inverse_indices=(["u"], torch.tensor([[0, 1, 2]])))  # fmt: skip
    with pytest.raises(SparseValueError, match="JaggedTensor: lengths must be non-negative"):
        JaggedTensor(values=torch.arange(2), lengths=torch.tensor([3, -1]), validate=True)


# ------------------------------------------------------------------------------ caches, copies, equality
def test_sync_unsync_from_jt_dict_and_equality() -> None:
    kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(4), lengths=torch.tensor([1, 1, 0, 2]))
    assert kjt.length_per_key_or_none() is None
    assert kjt.sync().length_per_key_or_none() == [2, 2] and kjt.offset_per_key_or_none() == [0, 2, 4]
    assert kjt.unsync().length_per_key_or_none() is None and kjt.offset_per_key_or_none() is None
    rebuilt = KeyedJaggedTensor.from_jt_dict(kjt.to_dict())  # synced, as torchrec's
    assert rebuilt.length_per_key_or_none() == [2, 2] and kjt_is_equal(rebuilt, kjt)
    from_offsets = KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(4), offsets=torch.tensor([0, 1, 2, 2, 4]))
    assert kjt_is_equal(kjt, from_offsets)
    other_stride = KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(4), lengths=torch.tensor([2, 2]))
    assert not kjt_is_equal(kjt, other_stride) and not kjt_is_equal(kjt, kjt.permute([1, 0]))
    weighted = KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(4), lengths=torch.tensor([1, 1, 0, 2]),
                                 weights=torch.ones(4))  # fmt: skip
    assert not kjt_is_equal(kjt, weighted) and not kjt_is_equal(kjt, "kjt")  # type: ignore[arg-type]
    assert jt_is_equal(kjt["b"], JaggedTensor(values=torch.tensor([2, 3]), offsets=torch.tensor([0, 0, 2])))


def test_empty_like_on_a_device_then_copy_gives_the_batch_back() -> None:
    src = KeyedJaggedTensor(
        keys=["u", "i"], values=torch.arange(5), lengths=torch.tensor([2, 1, 1, 0, 1]),
        weights=torch.rand(5), stride_per_key_per_rank=[[2], [3]],
        inverse_indices=(["u", "i"], torch.tensor([[0, 1, 1], [0, 1, 2]])),
    ).sync()  # fmt: skip
    dst = KeyedJaggedTensor.empty_like(src, torch.device("cpu"))
    assert dst.inverse_indices()[1].shape == (2, 3)  # torchrec allocates them too
    assert dst.copy_(src) is dst
    assert kjt_is_equal(dst, src) and torch.equal(dst.inverse_indices()[1], src.inverse_indices()[1])
    assert dst.stride_per_key_per_rank() == [[2], [3]] and dst["i"].values().tolist() == [3, 4]
    jt = JaggedTensor(values=torch.arange(3.0), lengths=torch.tensor([1, 2]), weights=torch.rand(3))
    assert jt_is_equal(JaggedTensor.empty_like(jt, torch.device("cpu")).copy_(jt), jt)
    # size_in_bytes as torchrec counts: every tensor held (values, weights, lengths, and the offsets
    # kjt_is_equal computed), plus the batch sizes as int32
    assert src.size_in_bytes() == 5 * 8 + 5 * 4 + 5 * 8 + 6 * 8 + 2 * 4
    assert jt.size_in_bytes() == 3 * 4 + 3 * 4 + 2 * 8 + 3 * 8  # values, weights, lengths, offsets
    assert KeyedTensor(["a"], [2], torch.ones(3, 2)).size_in_bytes() == 24
    assert src._key_indices() == {"u": 0, "i": 1} and KeyedTensor(["a"], [2], torch.ones(3, 2))._key_indices() == {"a": 0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs a CUDA runtime")
def test_pin_memory_pins_the_inverse_indices_too() -> None:
    kjt = KeyedJaggedTensor(keys=["u"], values=torch.arange(2), lengths=torch.tensor([1, 1]),
                            stride_per_key_per_rank=[[2]], inverse_indices=(["u"], torch.tensor([[0, 1, 1]])))  # fmt: skip
    pinned = kjt.pin_memory()
    assert pinned.values().is_pinned() and pinned.inverse_indices()[1].is_pinned()


# ------------------------------------------------------------------------------ dist_init
def test_dist_init_takes_torchrecs_per_sample_recat_for_ranks_of_different_batch_sizes() -> None:
    """Rank 0 sends batch 2, rank 1 batch 1, keys a, b; received rank-major: (r0 a)(r0 b)(r1 a)(r1 b)."""
    r0 = {"a": [[1], [2, 3]], "b": [[], [4]]}
    r1 = {"a": [[5]], "b": [[6, 7]]}
    lengths = [len(x) for rank in (r0, r1) for rows in rank.values() for x in rows]
    values = [v for rank in (r0, r1) for rows in rank.values() for x in rows for v in x]
    # torchrec's _get_recat(local_split=2, num_splits=2, batch_size_per_rank=[2, 1]): each output
    # length's source position (a from r0, a from r1, b from r0, b from r1)
    recat = torch.tensor([0, 1, 4, 2, 3, 5])
    got = KeyedJaggedTensor.dist_init(["a", "b"], [torch.tensor(lengths), torch.tensor(values)], False, 2, recat, [2, 1])
    assert got.stride() == 3
    assert [[t.tolist() for t in got[k].to_dense()] for k in "ab"] == [r0["a"] + r1["a"], r0["b"] + r1["b"]]
    # the block form (one entry per (rank, key)) gives the same batch
    blocks = KeyedJaggedTensor.dist_init(
        ["a", "b"], [torch.tensor(lengths), torch.tensor(values)], False, 2, torch.tensor([0, 2, 1, 3]), [2, 1]
    )
    assert kjt_is_equal(blocks, got)


# ------------------------------------------------------------------------------ TorchScript
def _scripted_paths(values: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    kjt = KeyedJaggedTensor(keys=["a", "b"], values=values, lengths=lengths, weights=values.float())
    like = KeyedJaggedTensor.empty_like(kjt, torch.device("cpu"))
    like.copy_(kjt)
    jt = kjt.to_dict(False)["b"]
    kt = KeyedTensor(["x", "y"], [1, 1], torch.stack([values.float(), values.float() * 2], dim=1))
    no_keys: list[str] = []
    out = KeyedTensor.regroup([kt], [["y"], no_keys, ["x", "y"]])
    padded = JaggedTensor(values=values, offsets=torch.tensor([1, 2, 4])).to_padded_dense(3, -1.0)
    sizes = [kjt.size_in_bytes(), jt.size_in_bytes(), kt.size_in_bytes(), kjt._key_indices()["b"]]
    return [like.values(), kjt.to(torch.device("cpu"), False, torch.float64).weights(), jt.lengths(), padded,
            torch.tensor(sizes)] + out  # fmt: skip


def test_new_methods_stay_scriptable() -> None:
    scripted = torch.jit.script(_scripted_paths)
    values, lengths = torch.tensor([4, 5, 6, 7]), torch.tensor([1, 0, 2, 1])
    expected = _scripted_paths(values, lengths)
    got = scripted(values, lengths)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert expected[3].tolist() == [[5, -1, -1], [6, 7, -1]] and expected[1].dtype == torch.float64
    assert expected[-2].shape == (4, 0)


def _to_dict_optional(kjt: KeyedJaggedTensor) -> torch.Tensor | None:
    return kjt.to_dict()["a"].offsets_or_none()


def test_to_dict_default_offsets_under_script() -> None:
    kjt = KeyedJaggedTensor(keys=["a"], values=torch.arange(3), lengths=torch.tensor([1, 2]))
    got = torch.jit.script(_to_dict_optional)(kjt)
    assert got is not None and got.tolist() == [0, 1, 3]
