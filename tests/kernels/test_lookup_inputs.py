"""The native per-call passes of ``lightrec/csrc/lookup_inputs.cpp`` against their torch-op forms.

``check_lookup_inputs`` must give the same verdicts as the torch ops of ``LookupInputChecker``
(which an accelerator runs) on every kind of good and bad input, for int32 and int64 ids and
offsets; ``sample_major_ids`` must equal the shift-and-transpose it replaces, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from lightrec._native import native_ops
from lightrec.kernels import input_checks
from lightrec.kernels.input_checks import LookupInputChecker
from lightrec.modules.feature_checks import EmbeddingIdError
from lightrec.sparse import SparseValueError

pytestmark = pytest.mark.skipif(native_ops() is None, reason="lightrec's native CPU ops are not built here")

ROWS = [7, 5, 9]  # per table; feature f reads table FTM[f]
FTM = [0, 1, 2, 1]
BATCH = 4


def _batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Good ids for ``lengths`` (``[F * B]``, feature-major) and their offsets."""
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    ids = []
    for bag, n in enumerate(lengths):
        rows = ROWS[FTM[bag // BATCH]]
        ids.append(torch.randint(0, rows, (n,), generator=gen))
    return torch.cat(ids), offsets


def _cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    singles = _batch([1] * (len(FTM) * BATCH))
    multi = _batch([2, 0, 1, 3] * len(FTM))
    cases = {"one id per bag": singles, "several ids, empty bags": multi}
    ids, off = singles
    cases["id = rows"] = (ids.clone().index_fill_(0, torch.tensor([BATCH + 2]), ROWS[FTM[1]]), off)
    cases["id -1"] = (ids.clone().index_fill_(0, torch.tensor([3 * BATCH]), -1), off)
    # An id valid for a larger table but not for its own (feature 1 reads the 5-row table).
    cases["id of another table's range"] = (ids.clone().index_fill_(0, torch.tensor([BATCH]), 6), off)
    ids, off = multi
    cases["first offset not 0"] = (ids, off.clone().index_fill_(0, torch.tensor([0]), 1))
    cases["last offset short"] = (ids, off.clone().index_fill_(0, torch.tensor([off.numel() - 1]), ids.numel() - 1))
    bad = off.clone()
    bad[3] = int(off[4]) + 1  # bag 3 has a negative length (offsets 7 then 6)
    cases["decreasing offsets"] = (ids, bad)
    return cases


def _torch_verdict(
    checker: LookupInputChecker, ids: torch.Tensor, off: torch.Tensor, batch: int = BATCH
) -> tuple[bool, str]:
    """(singletons, error kind) from the torch-op form of the check."""
    original = input_checks._native_checks
    input_checks._native_checks = lambda: False
    try:
        return _verdict(checker, ids, off, batch)
    finally:
        input_checks._native_checks = original


def _verdict(checker: LookupInputChecker, ids: torch.Tensor, off: torch.Tensor, batch: int = BATCH) -> tuple[bool, str]:
    try:
        return bool(checker.check_values(ids, off, batch, want_singletons=True)), ""
    except (EmbeddingIdError, SparseValueError, ValueError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("offset_dtype", [torch.int64, torch.int32])
def test_native_check_gives_the_torch_ops_verdict(case: str, id_dtype: torch.dtype, offset_dtype: torch.dtype) -> None:
    ids, off = _cases()[case]
    ids, off = ids.to(id_dtype), off.to(offset_dtype)
    checker = LookupInputChecker(ROWS, FTM, ["a", "b", "c"], "sync")
    native = _verdict(checker, ids, off)
    assert native == _torch_verdict(checker, ids, off)
    good = case in ("one id per bag", "several ids, empty bags")
    assert (native[1] == "") == good
    assert native[0] == (case == "one id per bag")


def test_uniform_rows_and_every_int32_extreme() -> None:
    """Ids at the int32 extremes are refused; the largest valid id passes."""
    checker = LookupInputChecker([10] * 2, [0, 1], ["a", "b"], "sync")
    off = torch.arange(2 * BATCH + 1, dtype=torch.int32)
    for value, ok in [(9, True), (10, False), (2**31 - 1, False), (-(2**31), False)]:
        ids = torch.zeros(2 * BATCH, dtype=torch.int32)
        ids[5] = value
        verdict = torch.ops.lightrec_cpu.check_lookup_inputs(ids, off, torch.tensor([10, 10]), BATCH)
        assert verdict == [1, int(ok), int(ok)], value
        assert (_verdict(checker, ids, off)[1] == "") == ok


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("features,batch", [(1, 4), (2, 2)])
def test_offsets_whose_differences_wrap_are_refused(dtype: torch.dtype, features: int, batch: int) -> None:
    """[0, MAX, MIN, -1, n]: every signed difference wraps to a non-negative length, yet the offsets
    decrease. Once accepted they sent the id pass (and the kernel) outside the tensors."""
    info = torch.iinfo(dtype)
    n = 2
    offsets = torch.tensor([0, info.max, info.min, -1, n], dtype=dtype)
    ids = torch.zeros(n, dtype=dtype)
    rows = torch.tensor([10] * features)
    assert torch.ops.lightrec_cpu.check_lookup_inputs(ids, offsets, rows, batch)[0] == 0
    checker = LookupInputChecker([10] * features, list(range(features)), [f"t{i}" for i in range(features)], "sync")
    native = _verdict(checker, ids, offsets, batch)[1]
    assert native.startswith("SparseValueError") and native == _torch_verdict(checker, ids, offsets, batch)[1]


def test_check_op_refuses_operands_it_cannot_read() -> None:
    ids, off = torch.zeros(4, dtype=torch.long), torch.arange(5)
    with pytest.raises(RuntimeError, match="F \\* batch \\+ 1"):
        torch.ops.lightrec_cpu.check_lookup_inputs(ids, off, torch.tensor([3, 3]), 4)
    with pytest.raises(RuntimeError, match="int32/int64"):
        torch.ops.lightrec_cpu.check_lookup_inputs(ids.float(), off, torch.tensor([3]), 4)


@pytest.mark.parametrize("features,batch", [(26, 2048), (3, 1), (5, 130), (1, 64)])
def test_sample_major_ids_equal_the_shift_and_transpose(features: int, batch: int) -> None:
    gen = torch.Generator().manual_seed(features * batch)
    ids = torch.randint(0, 1000, (features * batch,), generator=gen)
    shift = torch.randint(0, 10**9, (features,), generator=gen)
    expected = (ids.view(features, batch) + shift.view(features, 1)).t().reshape(-1)
    assert torch.equal(torch.ops.lightrec_cpu.sample_major_ids(ids, shift, batch), expected)


def test_sample_major_ids_refuse_a_wrong_count() -> None:
    with pytest.raises(RuntimeError, match="F \\* batch"):
        torch.ops.lightrec_cpu.sample_major_ids(torch.zeros(7, dtype=torch.long), torch.zeros(2, dtype=torch.long), 4)
