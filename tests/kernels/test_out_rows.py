"""``OutRows``: a kernel's pooled output rows written where the caller wants them, and its gradient
rows read where they arrive (``lightrec.kernels.kernel_interface``), against the plain lookup."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from lightrec._native import native_ops
from lightrec.kernels import BatchedEmbeddingBag, FusedOptimizerSpec
from lightrec.kernels.kernel_interface import OutRows
from lightrec.modules.embedding_configs import PoolingType
from lightrec.optim.fused_spec import EmbOptimType
from tests.kernels.reference import random_batch

pytestmark = pytest.mark.skipif(native_ops() is None, reason="the native ops could not be built here")

TABLES, FTM, BATCH, DIM = [(30, 8), (20, 8)], [0, 1, 0], 6, 8
WIDTH = len(FTM) * DIM


def _module() -> BatchedEmbeddingBag:
    torch.manual_seed(0)
    spec = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.1, eps=1e-6)
    return BatchedEmbeddingBag(TABLES, FTM, PoolingType.SUM, spec, kernel_backend="torch")


@pytest.mark.parametrize("one_per_bag", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("native_update", [True, False])
def test_rows_written_in_place_train_like_the_plain_lookup(
    one_per_bag: bool, weighted: bool, native_update: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows 0-1 go to a column block of a wider tensor, rows 2-5 to a buffer of their own; the
    gradient comes back in the same two places. Where every bag holds one id the torch kernel writes
    them itself (``placed``) and reads the gradient there; otherwise the lookup copies and autograd's
    gradient is used. Either way: the outputs and the trained tables of the plain lookup, bit for bit."""
    monkeypatch.setenv("LIGHTREC_CPU_UPDATE_NATIVE", "1" if native_update else "0")
    plain, placing = _module(), _module()
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        b = random_batch(gen, [30, 20, 30], FTM, BATCH, weighted, one_per_bag=one_per_bag)
        out = plain(b.indices, b.offsets, b.weights)
        grad = torch.randn(BATCH, WIDTH, generator=gen)
        out.backward(grad)

        wide, rest = torch.full((2, WIDTH + 5), -1.0), torch.empty(4, WIDTH)
        rows = OutRows([(0, wide[:, 3 : 3 + WIDTH]), (2, rest)])
        stand_in = placing(b.indices, b.offsets, b.weights, rows)
        assert rows.placed is one_per_bag and rows.blocks == []
        assert torch.equal(wide[:, 3 : 3 + WIDTH], out[:2].detach()) and torch.equal(rest, out[2:].detach())
        assert wide[:, :3].eq(-1).all() and wide[:, 3 + WIDTH :].eq(-1).all()
        if rows.placed:  # the caller hands the gradient rows over where they lie; autograd gets a stand-in
            released: list[int] = []
            grad_wide = torch.zeros(2, WIDTH + 5)
            grad_wide[:, 3 : 3 + WIDTH] = grad[:2]
            rows.give_grad([(0, grad_wide[:, 3 : 3 + WIDTH]), (2, grad[2:].clone())], partial(released.append, 1))
            stand_in.backward(torch.zeros(()).expand(BATCH, WIDTH))
            assert released == [1] and rows.take_grad() is None  # released once the update read them
        else:
            stand_in.backward(grad)
    for a, b_ in zip(plain.split_embedding_weights(), placing.split_embedding_weights()):
        assert torch.equal(a, b_)


def test_learned_weights_are_never_placed_by_the_kernel() -> None:
    """Per-id weights that need a gradient change the output after the kernel: the lookup copies."""
    m = _module()
    b = random_batch(torch.Generator().manual_seed(1), [30, 20, 30], FTM, BATCH, True, one_per_bag=True)
    assert b.weights is not None
    weights = b.weights.clone().requires_grad_(True)
    rows = OutRows([(0, torch.empty(BATCH, WIDTH))])
    out = m(b.indices, b.offsets, weights, rows)
    assert not rows.placed and torch.equal(out.detach(), m(b.indices, b.offsets, b.weights).detach())
