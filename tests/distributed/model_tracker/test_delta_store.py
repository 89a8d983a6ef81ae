"""``DeltaStoreTrec``: append in batch order, compact a window into unique ids, read from a batch,
delete up to a batch; a repeated id keeps its first / last state per ``UpdateMode``."""

from __future__ import annotations

import pytest
import torch

from lightrec.distributed.model_tracker import DeltaStoreTrec, UpdateMode


def _store(mode: UpdateMode = UpdateMode.NONE) -> DeltaStoreTrec:
    store = DeltaStoreTrec(mode)
    for batch, ids in enumerate(([7, 1, 7, 9], [1, 2], [5], [9, 3])):
        t = torch.tensor(ids)
        store.append(batch, "t", t, None if mode == UpdateMode.NONE else (t * 10 + batch).float())
    return store


def test_reads_compaction_and_deletion_keep_the_ids_of_each_window() -> None:
    store = _store()
    assert store.get_unique(0)["t"].ids.tolist() == [1, 2, 3, 5, 7, 9]
    assert store.get_unique(2)["t"].ids.tolist() == [3, 5, 9]
    store.compact(0, 2)
    entries = store.per_fqn_lookups["t"]
    assert [(e.batch_idx, e.compact) for e in entries] == [(0, True), (2, False), (3, False)]
    assert entries[0].ids.tolist() == [1, 2, 7, 9]
    assert store.get_unique(0)["t"].ids.tolist() == [1, 2, 3, 5, 7, 9]  # compaction changes no read
    store.delete(up_to_idx=3)
    assert store.get_unique(0)["t"].ids.tolist() == [3, 9]
    store.delete()
    assert store.get_unique(0) == {}


@pytest.mark.parametrize(("mode", "states"), [(UpdateMode.FIRST, [10, 21, 33, 52, 70, 90]),
                                               (UpdateMode.LAST, [11, 21, 33, 52, 70, 93])])  # fmt: skip
def test_a_repeated_id_keeps_its_first_or_last_state(mode: UpdateMode, states: list[int]) -> None:
    store = _store(mode)
    store.compact(1, 4)  # merging keeps the same choice
    rows = store.get_unique(0)["t"]
    assert rows.ids.tolist() == [1, 2, 3, 5, 7, 9]
    assert rows.states is not None and rows.states.tolist() == [float(s) for s in states]


def test_out_of_order_appends_and_empty_windows_are_refused() -> None:
    store = _store()
    with pytest.raises(ValueError, match="recorded after batch 3"):
        store.append(1, "t", torch.tensor([4]))
    with pytest.raises(ValueError, match="the window is empty"):
        store.compact(2, 2)


def test_a_model_without_sharded_tables_is_refused_with_the_fix() -> None:
    from lightrec import EmbeddingBagCollection, EmbeddingBagConfig
    from lightrec.distributed.model_tracker import ModelDeltaTrackerTrec

    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10, feature_names=["f"])])
    with pytest.raises(ValueError, match="holds no sharded embedding collection.*RecStrategy"):
        ModelDeltaTrackerTrec(ebc)


@pytest.mark.parametrize(
    "chunks",
    [
        [torch.tensor([7, 1, 7, 9]), torch.tensor([1, 2]), torch.tensor([], dtype=torch.int64)],  # dense: the mask
        [torch.randint(0, 100_000, (2048,), generator=torch.Generator().manual_seed(s)) for s in range(8)],
        [torch.tensor([2**62 + 5, 3, 2**62 + 5])],  # raw 64-bit ids: torch.unique, no 2**62-row mask
        [torch.tensor([-4, 3, -4, 0])],  # negative: torch.unique
        [torch.tensor([5, 5, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)],  # keeps the dtype
        [torch.tensor([], dtype=torch.int32)],
        [],
    ],
)
def test_sorted_unique_equals_torch_unique_of_the_concatenation(chunks: list[torch.Tensor]) -> None:
    from lightrec.distributed.model_tracker.delta_store import sorted_unique

    expected = torch.unique(torch.cat(chunks)) if chunks else torch.zeros(0, dtype=torch.int64)
    got = sorted_unique(chunks)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
