"""Rebuilding a shard from the blocks another plan saved (no process group needed)."""

from __future__ import annotations

import pytest
import torch

from lightrec.distributed.checkpoint.blocks import CheckpointError, assemble, state_kind


def _cut(full: torch.Tensor, row_splits: list[int], col_splits: list[int]) -> list:
    blocks = []
    for r0, r1 in zip(row_splits, row_splits[1:]):
        for c0, c1 in zip(col_splits, col_splits[1:]):
            blocks.append(([r0, c0], [r1 - r0, c1 - c0], full[r0:r1, c0:c1].clone()))
    return blocks


def test_elementwise_blocks_rebuild_any_target_block() -> None:
    full = torch.randn(11, 6)
    saved = _cut(full, [0, 4, 8, 11], [0, 2, 6])  # row-wise x column-wise saving plan
    for offsets, sizes in [([0, 0], [11, 6]), ([3, 1], [5, 4]), ([10, 5], [1, 1]), ([6, 0], [0, 6])]:
        (r, c), (nr, nc) = offsets, sizes
        assert torch.equal(assemble(saved, offsets, sizes, "elem", "t"), full[r : r + nr, c : c + nc])


def test_row_state_of_column_shards_merges_to_the_unsharded_accumulator() -> None:
    grad = torch.randn(7, 6, dtype=torch.float64)
    cols = [(0, 2), (2, 6)]
    saved = [([0, c0], [7, c1 - c0], grad[:, c0:c1].pow(2).mean(1)) for c0, c1 in cols]
    merged = assemble(saved, [0, 0], [7, 6], "row", "t")
    assert torch.allclose(merged, grad.pow(2).mean(1))  # exactly what unsharded row-wise Adagrad keeps
    # the same column block gets its own accumulator back, bit for bit
    assert torch.equal(assemble(saved, [2, 2], [3, 4], "row", "t"), saved[1][2][2:5])


def test_scalar_and_missing_blocks() -> None:
    assert assemble([([0, 0], [3, 2], torch.tensor(5.0))], [0, 0], [3, 2], "scalar", "t").item() == 5.0
    saved = _cut(torch.randn(8, 4), [0, 4], [0, 4])  # rows 4..7 were never saved
    with pytest.raises(CheckpointError, match=r"cover 16 of the 32 elements"):
        assemble(saved, [0, 0], [8, 4], "elem", "t")
    with pytest.raises(CheckpointError, match=r"rows 4 of the block"):
        assemble([([0, 0], [4, 4], torch.ones(4))], [0, 0], [8, 4], "row", "t")
    with pytest.raises(CheckpointError, match="no value"):
        assemble([], [0, 0], [1, 1], "scalar", "t")


def test_state_kind_names_the_shape_it_cannot_reshard() -> None:
    assert state_kind(torch.zeros(()), [3, 2], "s") == "scalar"
    assert state_kind(torch.zeros(3), [3, 2], "s") == "row"
    assert state_kind(torch.zeros(3, 2), [3, 2], "s") == "elem"
    with pytest.raises(CheckpointError, match=r"momentum of t has shape \(2, 2\)"):
        state_kind(torch.zeros(2, 2), [3, 2], "momentum of t")
