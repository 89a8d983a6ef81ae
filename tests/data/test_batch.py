"""Batch, collate_samples and concat_batches against hand-built references."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from lightrec.data import Batch, collate_samples, concat_batches
from lightrec.sparse import KeyedJaggedTensor


def _samples() -> list[dict]:
    return [
        {"dense": [1.0, 2.0], "sparse": {"a": [3, 4], "b": 7}, "label": 1},
        {"dense": [0.5, -1.0], "sparse": {"a": [], "b": [8, 9, 10]}, "label": 0.0},
        {
            "dense": torch.tensor([3.0, 4.0]),
            "sparse": {"a": torch.tensor([5]), "b": (1,)},
            "label": torch.tensor(1.0),
        },
    ]


def test_collate_builds_key_major_kjt() -> None:
    b = collate_samples(_samples())
    assert b.batch_size == 3
    torch.testing.assert_close(b.dense_features, torch.tensor([[1.0, 2.0], [0.5, -1.0], [3.0, 4.0]]))
    torch.testing.assert_close(b.labels, torch.tensor([1.0, 0.0, 1.0]))
    kjt = b.sparse_features
    assert kjt.keys() == ["a", "b"]
    assert kjt.lengths().tolist() == [2, 0, 1, 1, 3, 1]
    assert kjt.values().tolist() == [3, 4, 5, 7, 8, 9, 10, 1]
    assert kjt.values().dtype == torch.int64 and kjt.lengths().dtype == torch.int32
    assert kjt["b"].to_dense()[1].tolist() == [8, 9, 10]


def test_collate_tuples_and_key_order() -> None:
    rows = [((1.0,), {"x": 1, "y": 2}, 0), ((2.0,), {"y": 3, "x": 4}, 1)]
    b = collate_samples(rows, keys=["y", "x"])
    assert b.sparse_features.keys() == ["y", "x"]
    assert b.sparse_features.values().tolist() == [2, 3, 1, 4]


def test_collate_as_dataloader_collate_fn() -> None:
    loader = DataLoader(_samples(), batch_size=2, collate_fn=collate_samples)
    batches = list(loader)
    assert [b.batch_size for b in batches] == [2, 1]


@pytest.mark.parametrize(
    ("samples", "error", "match"),
    [
        ([], ValueError, "at least one sample"),
        ([{"dense": [1.0], "label": 0}], KeyError, "lacks \\['sparse'\\]"),
        (
            [{"dense": [1.0], "sparse": {"a": 1}, "label": 0}, {"dense": [1.0], "sparse": {}, "label": 0}],
            KeyError,
            "sample 1 has no sparse feature 'a'",
        ),
        ([{"dense": [1.0], "sparse": {"a": "7"}, "label": 0}], TypeError, "feature 'a' must be"),
        ([object()], TypeError, "sample 0 must be"),
    ],
)
def test_collate_errors(samples: list, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        collate_samples(samples)


def test_batch_validates_shapes() -> None:
    kjt = KeyedJaggedTensor(keys=["a"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="labels must have shape \\[2\\]"):
        Batch(torch.zeros(2, 3), kjt, torch.zeros(3))
    with pytest.raises(ValueError, match="stride\\) 2 but dense_features has 3 rows"):
        Batch(torch.zeros(3, 1), kjt, torch.zeros(3))
    with pytest.raises(ValueError, match="\\[B, num_dense\\]"):
        Batch(torch.zeros(2), kjt, torch.zeros(2))
    with pytest.raises(TypeError, match="KeyedJaggedTensor"):
        Batch(torch.zeros(2, 1), {"a": 1}, torch.zeros(2))  # type: ignore[arg-type]


def test_to_copies_every_tensor() -> None:
    b = collate_samples(_samples())
    moved = b.to("cpu", non_blocking=True)
    assert isinstance(moved, Batch) and moved is not b
    torch.testing.assert_close(moved.dense_features, b.dense_features)
    assert moved.sparse_features.values().tolist() == b.sparse_features.values().tolist()
    assert moved.sparse_features.lengths().tolist() == b.sparse_features.lengths().tolist()
    torch.testing.assert_close(moved.labels, b.labels)


def test_lightning_moves_batch_as_one_object() -> None:
    from lightning.fabric.utilities.apply_func import move_data_to_device

    b = collate_samples(_samples())
    moved = move_data_to_device(b, torch.device("cpu"))
    assert isinstance(moved, Batch) and moved.batch_size == 3


def test_concat_batches_equals_collate_of_all_samples() -> None:
    s = _samples()
    whole = collate_samples(s)
    parts = concat_batches([collate_samples(s[:1]), collate_samples(s[1:])])
    torch.testing.assert_close(parts.dense_features, whole.dense_features)
    torch.testing.assert_close(parts.labels, whole.labels)
    assert parts.sparse_features.values().tolist() == whole.sparse_features.values().tolist()
    assert parts.sparse_features.lengths().tolist() == whole.sparse_features.lengths().tolist()
    assert parts.sparse_features.stride() == 3
    with pytest.raises(ValueError, match="at least one"):
        concat_batches([])


def test_concat_batches_refuses_mixed_weights_and_dense_widths_by_batch_index() -> None:
    s = _samples()
    plain = collate_samples(s[:1])
    weighted = plain.sparse_features
    weighted = KeyedJaggedTensor(keys=weighted.keys(), values=weighted.values(), lengths=weighted.lengths(),
                                 weights=torch.ones(weighted.values().numel()))  # fmt: skip
    with_weights = Batch(plain.dense_features, weighted, plain.labels)
    # batch 1's weights used to be dropped without a word
    with pytest.raises(ValueError, match=r"batch 1 has per-id weights, batch 0 has none"):
        concat_batches([plain, with_weights])
    with pytest.raises(ValueError, match=r"batch 1 has no per-id weights, batch 0 has"):
        concat_batches([with_weights, plain])
    wide = Batch(torch.zeros(1, 3), plain.sparse_features, plain.labels)
    with pytest.raises(ValueError, match=r"batch 1 has dense_features of shape \[1, 3\], batch 0 \[1, 2\]"):
        concat_batches([plain, wide])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs a CUDA runtime")
def test_pin_memory_and_dataloader_pinning() -> None:
    b = collate_samples(_samples()).pin_memory()
    assert b.dense_features.is_pinned() and b.labels.is_pinned() and b.sparse_features.values().is_pinned()
    loader = DataLoader([collate_samples(_samples())], batch_size=None, pin_memory=True)
    assert next(iter(loader)).sparse_features.lengths().is_pinned()


@pytest.mark.gpu
def test_to_cuda_and_record_stream() -> None:
    b = collate_samples(_samples()).pin_memory().to(torch.device("cuda"), non_blocking=True)
    stream = torch.cuda.Stream()
    b.record_stream(stream)
    torch.cuda.synchronize()
    assert b.sparse_features.values().is_cuda and b.dense_features.is_cuda and b.labels.is_cuda
    assert b.sparse_features.values().cpu().tolist() == [3, 4, 5, 7, 8, 9, 10, 1]
