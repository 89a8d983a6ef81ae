"""Review of tiered tables' prefetch and configuration against the plain in-memory table.

* A prefetch's ids are checked as a lookup's are: a bad id is refused with ``EmbeddingIdError`` naming
  it, before anything changes (it used to admit another table's row, or fail inside the bookkeeping --
  on the worker thread, which broke the table until a load).
* A prefetched batch that is never looked up (here: prefetched twice) does not make a later lookup that
  fits in the cache fail: its slots are given up (it used to raise ``CacheFullError``).
* ``TableTiering`` refuses a load factor outside (0, 1] whatever the tier.
"""

from __future__ import annotations

import pytest
import torch

from lightrec.kernels import BatchedEmbeddingBag, EmbOptimType, FusedOptimizerSpec, TieringConfig
from lightrec.kernels.tiered import backend as tiered_backend
from lightrec.lightning import TableTiering
from lightrec.modules.feature_checks import EmbeddingIdError

SPEC = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.1, eps=1e-6)


def _pair(tables: list[tuple[int, int]], ftm: list[int] | None, cache_rows: int, tmp_path) -> tuple[BatchedEmbeddingBag, BatchedEmbeddingBag]:
    tiering = TieringConfig("ssd", cache_rows=cache_rows, ssd_storage_directory=str(tmp_path))
    tiered = BatchedEmbeddingBag(tables, ftm, optimizer=SPEC, kernel_backend="torch", tiering=tiering)
    memory = BatchedEmbeddingBag(tables, ftm, optimizer=SPEC, kernel_backend="torch")
    memory.load_state_dict(tiered.state_dict())
    return tiered, memory


def _step(tiered: BatchedEmbeddingBag, memory: BatchedEmbeddingBag, ids: list[int], offsets: list[int]) -> None:
    batch = (torch.tensor(ids), torch.tensor(offsets))
    out, ref = tiered(*batch), memory(*batch)
    assert torch.equal(out, ref)
    out.square().sum().backward()
    ref.square().sum().backward()


@pytest.mark.parametrize("worker", [False, True], ids=["bookkeeping-here", "bookkeeping-on-worker"])
@pytest.mark.parametrize("bad", [12, 25, -3, 2**40], ids=["next-table", "past-all", "negative", "raw-64-bit"])
def test_a_prefetch_with_a_bad_id_is_refused_and_the_table_trains_on(
    bad: int, worker: bool, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    # the prefetch's bookkeeping runs on the worker thread when a core is left for it
    monkeypatch.setattr(tiered_backend, "_usable_cores", lambda: torch.get_num_threads() + int(worker))
    tiered, memory = _pair([(10, 4), (10, 4)], [0, 1], 4, tmp_path)
    with pytest.raises(EmbeddingIdError, match=rf"id {bad} \(position 0, feature 0\).*table 't0' with 10 rows"):
        tiered.prefetch(torch.tensor([bad, 1]), torch.tensor([0, 1, 2]))
    kernel = tiered.kernel
    assert int((kernel.index.row_of >= 0).sum()) == 0 and not kernel._reservations  # nothing changed
    for step in range(3):
        _step(tiered, memory, [2 + step, 1], [0, 1, 2])
    for a, b in zip(tiered.split_embedding_weights(), memory.split_embedding_weights(), strict=True):
        assert torch.equal(a, b)


def test_a_prefetch_with_offsets_of_the_wrong_length_is_refused(tmp_path) -> None:
    tiered, _ = _pair([(10, 4), (10, 4)], [0, 1], 4, tmp_path)
    with pytest.raises(ValueError, match="offsets must have T\\*B \\+ 1 entries for T=2 features"):
        tiered.prefetch(torch.tensor([1, 2]), torch.tensor([0, 2]))


def test_a_batch_prefetched_twice_does_not_refuse_a_later_lookup_that_fits(tmp_path) -> None:
    """A (looked up), B prefetched twice and looked up once, then C with 3 rows in a 4-row cache:
    the second, never looked-up reservation of B must give its slots up rather than refuse C."""
    tiered, memory = _pair([(20, 4)], None, 4, tmp_path)
    a = (torch.tensor([0, 1]), torch.tensor([0, 2]))
    out, ref = tiered(*a), memory(*a)
    tiered.prefetch(torch.tensor([2, 3]), torch.tensor([0, 2]))  # B, during A's backward
    out.square().sum().backward()
    ref.square().sum().backward()
    tiered.prefetch(torch.tensor([2, 3]), torch.tensor([0, 2]))  # B again
    _step(tiered, memory, [2, 3], [0, 2])
    _step(tiered, memory, [4, 5, 6], [0, 3])  # C: 3 distinct rows, the cache holds 4
    _step(tiered, memory, [2, 6, 7], [0, 1, 3])
    for a_, b_ in zip(tiered.split_embedding_weights(), memory.split_embedding_weights(), strict=True):
        assert torch.equal(a_, b_)
    sa, sb = tiered.fused_optimizer.state_dict()["state"], memory.fused_optimizer.state_dict()["state"]
    for name in sb:
        assert torch.equal(sa[name]["momentum1"], sb[name]["momentum1"])


@pytest.mark.parametrize("tables_on", ["memory", "ssd", "host"])
@pytest.mark.parametrize("factor", [5.0, 0.0, -1.0])
def test_table_tiering_refuses_a_load_factor_outside_0_1_in_every_tier(tables_on: str, factor: float) -> None:
    with pytest.raises(ValueError, match=rf"cache_load_factor must be a share of the table's rows in \(0, 1\], got {factor}"):
        TableTiering(tables_on, cache_load_factor=factor)
    assert TableTiering(tables_on, cache_load_factor=0.5).cache_load_factor == 0.5
