"""Column placements of a pooled all-to-all: where each rank's columns land in the output.

A permutation of output columns is kept as *placements* -- runs of equal width whose source columns
are consecutive in one rank's block and whose output columns are evenly spaced (a planner that
deals tables round-robin over ranks gives one placement per rank). Each placement is one strided
copy between ``[B, count, width]`` views of both sides, receiving and packing alike, so a
permutation costs no more than the plain concatenation (measured on 2 ranks with 26 tables of dim
64 dealt alternately, B = 2048: 0.9 ms against 1.5 ms for a ``torch.cat`` of the 26 column pieces).
"""

from __future__ import annotations

import torch

__all__ = ["Placement", "rank_placements"]


class Placement:
    """``count`` runs of ``width`` columns: source columns ``lo + i * width`` of one rank's block go
    to output columns ``out + i * step`` (``i < count``), for every sample row."""

    __slots__ = ("lo", "out", "width", "count", "step")

    def __init__(self, lo: int, out: int, width: int) -> None:
        self.lo, self.out, self.width, self.count, self.step = lo, out, width, 1, width

    def extend(self, lo: int, out: int, width: int) -> bool:
        """Take the next run of the rank (increasing ``lo``) if it continues the pattern."""
        if width != self.width or lo != self.lo + self.count * width:
            return False
        if self.count == 1:
            if out <= self.out:
                return False
            self.step = out - self.out
        elif out != self.out + self.count * self.step:
            return False
        self.count += 1
        return True

    def output_view(self, full: torch.Tensor) -> torch.Tensor:
        """``[B, count, width]`` view of this placement's columns of ``full`` ``[B, *]`` (unit column stride)."""
        return full.as_strided(
            (full.shape[0], self.count, self.width),
            (full.stride(0), self.step, 1),
            full.storage_offset() + self.out,
        )

    def block_view(self, block: torch.Tensor) -> torch.Tensor:
        """``[B, count, width]`` view of this placement's columns of a rank block ``[B, D_r]``."""
        return block[:, self.lo : self.lo + self.count * self.width].view(block.shape[0], self.count, self.width)


def rank_placements(dims: list[int], column_order: list[int]) -> list[list[Placement]]:
    """Placements of each rank's block (``dims[r]`` columns) for ``column_order``: for each column of
    the concatenated rank blocks, its column in the output (a permutation)."""
    # Runs of consecutive columns: (rank, column in the rank's block, output column, width).
    runs: list[list[int]] = []
    first = 0
    for r, width in enumerate(dims):
        for c in range(first, first + width):
            prev = runs[-1] if runs else None
            if prev is not None and prev[0] == r and prev[2] + prev[3] == column_order[c]:
                prev[3] += 1
            else:
                runs.append([r, c - first, column_order[c], 1])
        first += width
    out: list[list[Placement]] = []
    for r in range(len(dims)):
        placements: list[Placement] = []
        for rr, lo, col, width in runs:  # greedy merge of the rank's runs, in block order
            if rr == r and (not placements or not placements[-1].extend(lo, col, width)):
                placements.append(Placement(lo, col, width))
        out.append(placements)
    return out
