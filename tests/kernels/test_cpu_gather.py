"""The native prefetching row gather (``lightrec.kernels.cpu_gather``) against ``index_select``."""

from __future__ import annotations

import pytest
import torch

from lightrec._native import native_ops
from lightrec.kernels.cpu_gather import gather_rows

pytestmark = pytest.mark.skipif(
    native_ops() is None,
    reason="the native ops could not be built here (a NativeUnavailableWarning says why)",
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("threads", [1, 2])
def test_gather_equals_index_select_bit_for_bit(dtype: torch.dtype, threads: int) -> None:
    gen = torch.Generator().manual_seed(0)
    table = (torch.randn(5000, 24, generator=gen) * 50).to(dtype)
    ids = torch.randint(0, 5000, (10_000,), generator=gen)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = gather_rows(table, ids)
    finally:
        torch.set_num_threads(saved)
    assert out.dtype == dtype and out.shape == (10_000, 24) and out.is_contiguous()
    assert torch.equal(out, table.index_select(0, ids))


def test_strided_table_and_empty_ids() -> None:
    wide = torch.randn(50, 16)
    table = wide[:, 4:12]  # row stride 16, not 8
    ids = torch.tensor([3, 49, 0, 3])
    assert torch.equal(gather_rows(table, ids), table.index_select(0, ids))
    assert gather_rows(table, torch.zeros(0, dtype=torch.int64)).shape == (0, 8)


@pytest.mark.parametrize("bad", [-1, 50])
def test_out_of_range_id_names_it_and_its_position(bad: int) -> None:
    with pytest.raises(RuntimeError, match=f"id {bad} at position 2 is outside \\[0, 50\\)"):
        gather_rows(torch.randn(50, 8), torch.tensor([1, 2, bad, 3]))


def test_autograd_and_other_operands_take_index_select() -> None:
    """The op has no autograd formula: a table that needs a gradient (grad mode on) is gathered by
    ``index_select``, so the gradient still flows; int32 ids and 1-D tables too."""
    table = torch.randn(10, 4, requires_grad=True)
    out = gather_rows(table, torch.tensor([1, 1, 7]))
    out.sum().backward()
    assert table.grad is not None and table.grad[1].eq(2).all() and table.grad[7].eq(1).all()
    with torch.no_grad():
        assert torch.equal(gather_rows(table, torch.tensor([2, 3])), table[[2, 3]])
    small = torch.randn(10, 4)
    assert torch.equal(gather_rows(small, torch.tensor([4, 5], dtype=torch.int32)), small[[4, 5]])


@pytest.mark.parametrize("native", [True, False])
def test_gather_into_a_column_block_and_a_segment(native: bool) -> None:
    """``gather_rows_into`` writes id ``i`` to row ``i // K``, columns ``(i % K) * D`` on, of any row
    stride, and nothing else; without the native op (a table that needs a gradient) the same."""
    from lightrec.kernels.cpu_gather import gather_rows_into

    gen = torch.Generator().manual_seed(1)
    table = torch.randn(60, 4, generator=gen).requires_grad_(not native)
    ids = torch.randint(0, 60, (21,), generator=gen)
    wide = torch.full((7, 20), -7.0)
    with torch.set_grad_enabled(not native):
        gather_rows_into(table, ids, wide[:, 5:17])  # 7 samples x 3 ids x 4 columns, row stride 20
    assert torch.equal(wide[:, 5:17], table.detach()[ids].view(7, 12))
    assert wide[:, :5].eq(-7).all() and wide[:, 17:].eq(-7).all()
    flat = torch.empty(21, 4)
    gather_rows_into(table.detach(), ids, flat)
    assert torch.equal(flat, table.detach()[ids])


def test_gather_into_refuses_a_bad_id_or_shape_and_writes_nothing() -> None:
    from lightrec.kernels.cpu_gather import gather_rows_into

    table = torch.randn(50, 8)
    out = torch.zeros(2, 16)
    with pytest.raises(RuntimeError, match="id 50 at position 3 is outside \\[0, 50\\)"):
        gather_rows_into(table, torch.tensor([1, 2, 3, 50]), out)
    assert out.eq(0).all()
    with pytest.raises(ValueError, match="must be \\[M, K \\* 8\\] with M \\* K = 3"):
        gather_rows_into(table, torch.tensor([1, 2, 3]), out)


def test_gather_into_refuses_strided_columns() -> None:
    from lightrec.kernels.cpu_gather import gather_rows_into

    out = torch.zeros(8, 2).t()  # [2, 8] with column stride 2
    with pytest.raises(ValueError, match="unit column stride"):
        gather_rows_into(torch.randn(50, 4), torch.tensor([1, 2, 3, 4]), out)
    assert out.eq(0).all()
