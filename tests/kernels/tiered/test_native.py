"""The native bookkeeping and row copies of a tiered table (``lightrec/csrc/tiered_cache.cpp``)
against the torch path they replace on CPU.

* ``CacheIndex.admit_batch`` / ``release``: random streams over three tables (LRU and LFU, prefetch-
  like best-effort admissions, batches in flight kept and some pinned, evictions in most calls) give the same
  slots, misses, admissions, victims and every state tensor after every call; a batch too big for
  its cache is refused by both with the same message and changes nothing.
* A tiered table trained 30 steps with and without the native ops: the same outputs, weights,
  optimizer state, counters and cache state (and the in-memory table's numbers, which
  ``test_kernel.py`` checks for either path).
* ``tiered_copy_rows`` equals a gather and scatter; ``tiered_advise`` announces the ranges
  ``page_ranges`` computes; without a compiler the torch path runs.
"""

from __future__ import annotations

import pytest
import torch

from lightrec.kernels import (
    BatchedEmbeddingBag,
    CacheFullError,
    EmbOptimType,
    FusedOptimizerSpec,
    TieringConfig,
)
from lightrec.kernels.tiered import backend as tiered_backend
from lightrec.kernels.tiered import cache as tiered_cache
from lightrec.kernels.tiered.cache import BatchAdmission, CacheIndex, native_tiered_available
from lightrec.kernels.tiered.store import SsdRowStore, page_ranges
from lightrec.modules import PoolingType

needs_native = pytest.mark.skipif(
    not native_tiered_available(torch.device("cpu")),
    reason="the native ops could not be built here (a NativeUnavailableWarning says why) or LIGHTREC_TIERED_NATIVE=0",
)

ROWS, CACHE = [400, 250, 300], [40, 25, 30]
STATE = ("slot_of", "row_of", "last_used", "freq", "pins", "dirty", "free_ring", "free_state")


def _pair(algorithm: str, headroom: float) -> tuple[CacheIndex, CacheIndex]:
    make = lambda native: CacheIndex(ROWS, CACHE, algorithm, headroom, ["a", "b", "c"], torch.device("cpu"), native=native)  # noqa: E731
    return make(True), make(False)


def _assert_same(a: BatchAdmission, b: BatchAdmission, native: CacheIndex, torch_index: CacheIndex) -> None:
    assert torch.equal(a.slots, b.slots) and a.slots.dtype == b.slots.dtype == torch.int64
    assert a.missed_ids == b.missed_ids
    assert [t for t, _ in a.parts] == [t for t, _ in b.parts]
    for (_, x), (_, y) in zip(a.parts, b.parts, strict=True):
        for name in ("rows", "slots", "victim_slots", "victim_rows"):
            assert torch.equal(getattr(x, name), getattr(y, name)), name
    for name in STATE:
        assert torch.equal(getattr(native, name), getattr(torch_index, name)), name


@needs_native
@pytest.mark.parametrize("algorithm", ["lru", "lfu"])
@pytest.mark.parametrize("headroom", [0.0, 0.2])
def test_native_bookkeeping_equals_the_torch_path(algorithm: str, headroom: float) -> None:
    native, reference = _pair(algorithm, headroom)
    gen = torch.Generator().manual_seed(1)
    # batches in flight (lookups before their backward): their tick keeps every slot used since;
    # some are pinned instead, as TieredBatchedLookup does with one held for long
    held: list[tuple[int, torch.Tensor, bool]] = []
    evicted = refused = 0
    for step in range(120):
        table = torch.randint(0, 3, (30,), generator=gen)
        hot = torch.randint(0, 12, (30,), generator=gen)  # recurring rows: hits, LFU counts
        cold = (torch.rand(30, generator=gen) * torch.tensor(ROWS)[table]).long()
        local = torch.where(torch.rand(30, generator=gen) < 0.4, hot, cold)
        rows = local + torch.tensor([0, 400, 650])[table]
        best_effort = step % 3 == 0
        protect = min((tick for tick, _, pinned in held if not pinned), default=None)
        results, errors = [], []
        for index in (native, reference):
            try:
                results.append(index.admit_batch(rows, step + 1, best_effort=best_effort, pin=True, protect_from=protect))
            except CacheFullError as err:  # too many rows kept: refused alike, nothing changed
                errors.append(str(err))
        assert len(errors) in (0, 2) and len(set(errors)) <= 1
        refused += len(errors) // 2
        if results:
            _assert_same(*results, native, reference)
            evicted += sum(adm.victim_rows.numel() for _, adm in results[0].parts)
            held.append((step + 1, results[0].slots, False))
        if step % 7 == 3 and held and not held[0][2]:  # the oldest is held for long: pinned instead
            tick, slots, _ = held.pop(0)
            held.insert(0, (tick, slots, True))
            for index in (native, reference):
                index.pin(slots[slots >= 0])
        if held and (len(held) > 2 or step % 5 == 0):  # released in the order backward passes would
            _, slots, pinned = held.pop(0)
            if pinned:
                updated = bool(step % 2)
                native.release(slots, updated)
                reference.release(slots, updated)
        for name in STATE:
            assert torch.equal(getattr(native, name), getattr(reference, name)), name
    assert evicted > 100 and 0 < refused < 40  # evictions of dirty rows all along; some refusals too
    assert int(native.pins.min()) >= 0


@needs_native
@pytest.mark.parametrize("algorithm", ["lru", "lfu"])
def test_eviction_beyond_its_histogram_windows_equals_the_torch_path(algorithm: str) -> None:
    """The native eviction histograms the last 2^16 lookup counts (and for LFU frequencies below
    2^16); slots last used before that window (a table left alone for long) or read more often
    take its general path, with the same victims."""
    native, reference = _pair(algorithm, 0.1)
    gen = torch.Generator().manual_seed(5)
    evicted = 0
    for step in range(60):
        tick = step + 1 if step < 30 else 200_000 + step  # half the cache then dates from long ago
        if step == 45:  # a few slots read 2^16 times and more
            for index in (native, reference):
                index.freq[::7] += 70_000
        rows = torch.randint(0, 950, (30,), generator=gen)
        results = [index.admit_batch(rows, tick, best_effort=step % 2 == 0, pin=True) for index in (native, reference)]
        _assert_same(*results, native, reference)
        evicted += sum(adm.victim_rows.numel() for _, adm in results[0].parts)
        if step % 4 == 0:
            for index in (native, reference):
                for table in range(3):
                    index.evict(table, 3, tick, tick)
            for name in STATE:
                assert torch.equal(getattr(native, name), getattr(reference, name)), name
    assert evicted > 50


@needs_native
def test_a_batch_too_big_is_refused_the_same_way_and_changes_nothing() -> None:
    native, reference = _pair("lru", 0.0)
    for index in (native, reference):  # a batch in flight since tick 1 keeps 20 of table a's 40 slots
        index.admit_batch(torch.arange(20), 1, best_effort=False, pin=True)
    before = {name: getattr(native, name).clone() for name in STATE}
    messages = []
    for index in (native, reference):
        with pytest.raises(CacheFullError, match=r"table 'a': a batch needs 30 more of its rows") as err:
            index.admit_batch(torch.cat([torch.arange(5), torch.arange(100, 130)]), 2, best_effort=False, pin=True,
                              protect_from=1)  # fmt: skip
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert "20 are free and 0 evictable (20 are in use" in messages[0]
    for name in STATE:
        assert torch.equal(getattr(native, name), before[name]) and torch.equal(getattr(reference, name), before[name])
    # best effort: as many as fit, the rest left out (-1) and neither touched nor marked
    results = [index.admit_batch(torch.arange(100, 130), 3, best_effort=True, pin=True, protect_from=1)
               for index in (native, reference)]  # fmt: skip
    _assert_same(*results, native, reference)
    assert int((results[0].slots < 0).sum()) == 10
    # once that batch is done, its slots may go
    results = [index.admit_batch(torch.arange(200, 210), 4, best_effort=False, pin=True) for index in (native, reference)]
    _assert_same(*results, native, reference)
    assert sorted(results[0].parts[0][1].victim_rows.tolist()) == list(range(10))  # the oldest-used (tick 1)


def _train(
    monkeypatch: pytest.MonkeyPatch, native: bool, tmp_path, worker: bool = False
) -> tuple[BatchedEmbeddingBag, list[torch.Tensor]]:
    monkeypatch.setenv("LIGHTREC_TIERED_NATIVE", "1" if native else "0")
    # where the prefetch's bookkeeping runs: on the worker when torch leaves a core free for it
    monkeypatch.setattr(tiered_backend, "_usable_cores", lambda: torch.get_num_threads() + (1 if worker else 0))
    spec = FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=0.01)
    tiering = TieringConfig("ssd", cache_rows=120, algorithm="lfu", ssd_storage_directory=str(tmp_path))
    torch.manual_seed(0)
    module = BatchedEmbeddingBag([(3000, 8), (2000, 4)], [0, 1, 0], PoolingType.SUM, spec, kernel_backend="torch", tiering=tiering)
    assert module.kernel.index.native is native  # type: ignore[attr-defined]
    gen = torch.Generator().manual_seed(2)
    outputs = []
    batches = []
    for _ in range(31):
        ids = torch.where(torch.rand(60, generator=gen) < 0.5, torch.randint(0, 30, (60,), generator=gen),
                          torch.randint(0, 2000, (60,), generator=gen))  # fmt: skip
        batches.append((ids, torch.arange(0, 61, 4)))
    for step in range(30):
        out = module(*batches[step])
        module.prefetch(*batches[step + 1])
        (out * torch.arange(out.numel()).view_as(out)).sum().backward()
        outputs.append(out.detach())
    return module, outputs


@needs_native
@pytest.mark.parametrize("worker", [False, True], ids=["bookkeeping-here", "bookkeeping-on-worker"])
def test_a_tiered_table_trains_the_same_with_and_without_the_native_ops(
    monkeypatch: pytest.MonkeyPatch, tmp_path, worker: bool
) -> None:
    native, native_out = _train(monkeypatch, True, tmp_path, worker)
    assert native.kernel._worker_bookkeeping is worker  # type: ignore[attr-defined]
    reference, reference_out = _train(monkeypatch, False, tmp_path)
    for a, b in zip(native_out, reference_out, strict=True):
        assert torch.equal(a, b)
    assert vars(native.kernel.stats()) == vars(reference.kernel.stats())  # type: ignore[attr-defined]
    assert native.kernel.stats().rows_written_back > 200  # type: ignore[attr-defined]
    for name in STATE:
        assert torch.equal(getattr(native.kernel.index, name), getattr(reference.kernel.index, name)), name  # type: ignore[attr-defined]
    for a, b in zip(native.split_embedding_weights(), reference.split_embedding_weights(), strict=True):
        assert torch.equal(a, b)
    sa, sb = native.fused_optimizer.state_dict()["state"], reference.fused_optimizer.state_dict()["state"]
    for name in sb:
        for key in sb[name]:
            assert torch.equal(torch.as_tensor(sa[name][key]), torch.as_tensor(sb[name][key])), (name, key)


@needs_native
def test_native_row_copies_and_read_ahead(tmp_path) -> None:
    gen = torch.Generator().manual_seed(3)
    src = [torch.randn(50, 6, generator=gen), torch.randn(50, generator=gen), torch.randn(80, 16, generator=gen)[:, 3:9]]
    dst = [torch.zeros(20, 6), torch.zeros(20), torch.zeros(20, 6)]
    expected = [d.clone() for d in dst]
    src_rows, dst_rows = torch.tensor([4, 49, 0, 7]), torch.tensor([19, 0, 5, 6])
    for s, e in zip(src, expected, strict=True):
        e.index_copy_(0, dst_rows, s.index_select(0, src_rows))
    torch.ops.lightrec_tiered.tiered_copy_rows(src, src_rows, dst, dst_rows)
    for d, e in zip(dst, expected, strict=True):
        assert torch.equal(d, e)
    with pytest.raises(RuntimeError, match="outside the tensors"):
        torch.ops.lightrec_tiered.tiered_copy_rows(src, torch.tensor([50]), dst, torch.tensor([0]))

    store = SsdRowStore([100_000], [64], torch.float32, [{"momentum1": ((), torch.float32)}], ["t"], directory=str(tmp_path))
    rows = torch.tensor([5, 6, 70, 99_999, 40_000, 40_016, 40_100, 5])
    weights = store.weights[0]
    fd, base = store._fd_of(weights), weights.data_ptr()
    advise = lambda: torch.ops.lightrec_tiered.tiered_advise([fd, fd], [base, base], [256, 4], rows, 4096, 4, 32)  # noqa: E731
    expected_ranges = sum(len(page_ranges(rows.numpy() * stride // 4096, 4)[0]) for stride in (256, 4))
    assert advise() == expected_ranges  # a fresh file: nothing cached, every range announced
    weights[rows] += 1.0  # now the pages of those rows are in the page cache: nothing to announce
    assert torch.ops.lightrec_tiered.tiered_advise([fd], [base], [256], rows, 4096, 4, 32) == 0


@needs_native
def test_a_transfer_whose_pages_are_not_cached_is_announced_and_left_to_the_worker(tmp_path) -> None:
    """``tiered_transfer(only_if_cached=True)`` copies rows whose pages are in the page cache, and
    leaves the rest (announced) to the caller's worker; without the flag it always copies."""
    store = SsdRowStore([400_000], [64], torch.float32, [{"momentum1": ((), torch.float32)}], ["t"], directory=str(tmp_path))
    cache = [torch.zeros(100, 64), torch.zeros(100)]
    tensors = [store.weights[0], store.states[0]["momentum1"]]
    files = store.files(0)
    assert files[0] >= 0 and files[1] >= 0
    empty = torch.empty(0, dtype=torch.long)
    cold = torch.arange(0, 400_000, 4000)  # 100 rows on 100 pages never touched: not in the page cache
    slots = torch.arange(100)

    def transfer(rows: torch.Tensor, only_if_cached: bool) -> bool:
        return torch.ops.lightrec_tiered.tiered_transfer(
            cache, tensors, files, empty, empty, rows, slots, 4096, 4, 32, only_if_cached
        )

    assert not transfer(cold, True) and not cache[0].any()  # left to the worker: nothing copied
    with torch.no_grad():
        tensors[0][cold] = torch.arange(100, dtype=torch.float32).unsqueeze(1)  # now cached (written)
        tensors[1][cold] = 7.0
    assert transfer(cold, True)
    assert torch.equal(cache[0][:, 0], torch.arange(100, dtype=torch.float32)) and bool((cache[1] == 7.0).all())
    warm_again = torch.arange(1, 400_000, 4000)  # (the same pages: cached)
    assert transfer(warm_again, True)
    # write-backs too: the victims' rows land in the store before the fetch reuses their slots
    cache[1][0] = 5.0
    assert torch.ops.lightrec_tiered.tiered_transfer(
        cache, tensors, files, torch.tensor([0]), torch.tensor([123]), torch.tensor([cold[5].item()]), torch.tensor([0]),
        4096, 4, 0, True,
    )  # fmt: skip
    assert float(tensors[1][123]) == 5.0 and float(cache[1][0]) == 7.0


def test_without_the_native_library_the_torch_path_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiered_cache, "native_ops", lambda: None)  # e.g. no compiler on this machine
    assert not native_tiered_available(torch.device("cpu"))
    index = CacheIndex([10], [4], "lru", 0.0, ["t"], torch.device("cpu"))
    assert index.native is False
    adm = index.admit_batch(torch.tensor([1, 2, 1]), 1, best_effort=False, pin=True)
    assert adm.missed_ids == 3 and adm.slots.tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match=r"native=True"):
        CacheIndex([10], [4], "lru", 0.0, ["t"], torch.device("cpu"), native=True)


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_native), False], ids=["native", "torch"])
@pytest.mark.parametrize("training", [True, False], ids=["training", "no-grad"])
def test_the_lookup_of_a_whole_prefetch_equals_admitting_it_again(native: bool, training: bool) -> None:
    """``touch_reserved`` (the lookup's shortcut when its prefetch admitted every row) leaves the
    state that admitting the batch again leaves."""
    shortcut, full = (CacheIndex(ROWS, CACHE, "lfu", 0.1, ["a", "b", "c"], torch.device("cpu"), native=native) for _ in range(2))
    gen = torch.Generator().manual_seed(4)
    for step in range(40):
        rows = torch.randint(0, 950, (24,), generator=gen)
        tick = 2 * step + 1
        prefetched = [index.admit_batch(rows, tick, best_effort=True, pin=True) for index in (shortcut, full)]
        assert bool((prefetched[0].slots >= 0).all())
        shortcut.touch_reserved(prefetched[0].slots, tick + 1)
        looked_up = full.admit_batch(rows, tick + 1, best_effort=False, pin=training, protect_from=tick)
        assert torch.equal(looked_up.slots, prefetched[0].slots) and looked_up.missed_ids == 0
        for name in STATE:
            assert torch.equal(getattr(shortcut, name), getattr(full, name)), name


def test_a_prefetch_keeps_its_own_copy_of_the_ids(tmp_path) -> None:
    """A caller that refills its id buffer after the prefetch: the lookup of the new ids is served
    right (the prefetch's shortcut compares against a copy, and the worker reads the copy)."""
    spec = FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=0.1)
    tiering = TieringConfig("ssd", cache_rows=64, ssd_storage_directory=str(tmp_path))
    module = BatchedEmbeddingBag([(500, 4)], optimizer=spec, kernel_backend="torch", tiering=tiering)
    ref = BatchedEmbeddingBag([(500, 4)], optimizer=spec, kernel_backend="torch")
    ref.load_state_dict(module.state_dict())
    buffer, offsets = torch.arange(10, 30), torch.tensor([0, 10, 20])
    module.prefetch(buffer, offsets)
    buffer.copy_(torch.arange(200, 220))  # refilled in place before the lookup
    assert torch.equal(module(buffer, offsets), ref(buffer, offsets))


@needs_native
def test_bad_slots_or_state_sizes_are_refused_before_anything_changes() -> None:
    last, freq, pins = torch.zeros(8, dtype=torch.long), torch.zeros(8, dtype=torch.long), torch.zeros(8, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="tiered_touch: slot 8 outside"):
        torch.ops.lightrec_tiered.tiered_touch(last, freq, pins, torch.tensor([1, 2, 8]), 5, True, 1)
    assert not last.any() and not freq.any() and not pins.any()  # slots 1 and 2 were not touched
    dirty = torch.zeros(8, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="tiered_release: slot 9 outside"):
        torch.ops.lightrec_tiered.tiered_release(pins, dirty, torch.tensor([0, -1, 9]), 1, True)
    assert not pins.any() and not dirty.any()
    with pytest.raises(RuntimeError, match="one entry per slot"):
        torch.ops.lightrec_tiered.tiered_touch(last[:4], freq, pins, torch.tensor([1]), 5, True, 1)
