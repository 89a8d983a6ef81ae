"""Rebuilding one rank's block of a table (or of its optimizer state) from saved blocks.

A saved block is ``(offsets [row, col], sizes [rows, cols], tensor)`` cut out of a full
``[R, D]`` table by some plan; the target is the block another plan gives this rank. Three kinds
of tensors travel this way:

* ``"elem"`` -- one value per table element (weights, Adagrad/Adam moments): the tensor is
  ``[rows, cols]``; saved blocks are disjoint, so the target is the union of their intersections
  and every element must be covered.
* ``"row"`` -- one value per row (row-wise Adagrad's ``momentum1``): the tensor is ``[rows]``. A
  column shard keeps its own accumulator, the mean of ``g**2`` over *its* columns, so a target row
  takes the column-weighted mean of the saved values it overlaps. Saving column shards and loading
  them as one full table therefore gives exactly the unsharded accumulator; same-plan loads are
  exact; splitting a full row into column shards gives each shard the full-row value.
* ``"scalar"`` -- a 0-dim value shared by the whole kernel (Adam's ``step``): any saved copy.

A saved block that *is* the target (same plan: the usual resume) is returned as it is -- a view of
the memory-mapped checkpoint file, nothing copied. Otherwise the target is assembled into a new
tensor, ``allocate(shape, dtype)`` (a tiered table's loader passes a file-backed one, so a table
larger than memory is never materialised).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["Allocator", "Block", "CheckpointError", "assemble", "state_kind"]

Block = tuple[list[int], list[int], torch.Tensor]
Allocator = Callable[[list[int], torch.dtype], torch.Tensor]


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete, malformed, or does not fit the model it is loaded into."""


def state_kind(tensor: torch.Tensor, sizes: Sequence[int], what: str) -> str:
    """``"elem"``, ``"row"`` or ``"scalar"`` for a state tensor of a ``sizes`` shard."""
    if tensor.dim() == 0:
        return "scalar"
    if tensor.dim() == 1 and tensor.shape[0] == sizes[0]:
        return "row"
    if tensor.dim() == 2 and list(tensor.shape) == list(sizes):
        return "elem"
    raise CheckpointError(
        f"{what} has shape {tuple(tensor.shape)}, which is neither per element {list(sizes)}, "
        f"per row [{sizes[0]}] nor a scalar; lightrec cannot reshard it"
    )


def _overlap(a0: int, an: int, b0: int, bn: int) -> tuple[int, int]:
    lo, hi = max(a0, b0), min(a0 + an, b0 + bn)
    return lo, max(0, hi - lo)


def assemble(
    blocks: Sequence[Block],
    offsets: Sequence[int],
    sizes: Sequence[int],
    kind: str,
    what: str,
    allocate: Allocator | None = None,
) -> torch.Tensor:
    """The target block at ``offsets`` of ``sizes`` built from ``blocks`` (see the module docstring).

    Args:
        allocate: ``(shape, dtype) -> tensor`` for an ``"elem"`` target assembled from pieces
            (default ``torch.empty``).

    Raises:
        CheckpointError: the saved blocks do not cover the target.
    """
    (r0, c0), (nr, nc) = offsets, sizes
    if kind == "scalar":
        if not blocks:
            raise CheckpointError(f"{what}: the checkpoint holds no value")
        return blocks[0][2].clone()
    for b_offsets, b_sizes, tensor in blocks:  # the same plan: the saved block is the target
        if list(b_offsets) == list(offsets) and list(b_sizes) == list(sizes) and kind in ("elem", "row"):
            return tensor
    dtype = blocks[0][2].dtype if blocks else torch.float32
    if kind == "elem":
        out = allocate([nr, nc], dtype) if allocate is not None else torch.empty(nr, nc, dtype=dtype)
        covered = 0
        for (br, bc), (bnr, bnc), tensor in blocks:
            lo_r, n_r = _overlap(r0, nr, br, bnr)
            lo_c, n_c = _overlap(c0, nc, bc, bnc)
            if n_r and n_c:
                out[lo_r - r0 : lo_r - r0 + n_r, lo_c - c0 : lo_c - c0 + n_c] = tensor[
                    lo_r - br : lo_r - br + n_r, lo_c - bc : lo_c - bc + n_c
                ]
                covered += n_r * n_c
        if covered != nr * nc:
            raise CheckpointError(
                f"{what}: the saved shards cover {covered} of the {nr * nc} elements of the block at "
                f"{list(offsets)} of size {list(sizes)}; the checkpoint is incomplete (a rank's file is missing?)"
            )
        return out
    if kind == "row":
        total = torch.zeros(nr, dtype=torch.float64)
        weight = torch.zeros(nr, dtype=torch.float64)
        for (br, bc), (bnr, bnc), tensor in blocks:
            lo_r, n_r = _overlap(r0, nr, br, bnr)
            _, n_c = _overlap(c0, nc, bc, bnc)
            if n_r and n_c:
                rows = tensor[lo_r - br : lo_r - br + n_r].to(torch.float64)
                total[lo_r - r0 : lo_r - r0 + n_r] += n_c * rows
                weight[lo_r - r0 : lo_r - r0 + n_r] += n_c
        if nr and bool((weight == 0).any()):
            raise CheckpointError(
                f"{what}: rows {int((weight == 0).sum())} of the block at {list(offsets)} of size "
                f"{list(sizes)} are in no saved shard; the checkpoint is incomplete"
            )
        return (total / weight.clamp(min=1)).to(dtype)
    raise CheckpointError(f"{what}: unknown state kind {kind!r}")
