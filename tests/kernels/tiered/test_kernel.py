"""Tiered tables (a cache of hot rows over host memory or SSD) against the in-memory fused tables.

* With a tiny cache (a few hundred rows of tables of thousands, so every step evicts), 30 steps of
  every fused optimizer give bit-identical outputs, weights and optimizer state to the same kernel
  in memory -- pooled SUM / MEAN (weighted), unpooled, shared tables, SSD and host backing, with
  and without prefetching the next batch during the current backward.
* Write-back under eviction pressure loses nothing; LRU and LFU evict what they say; rows in use
  are pinned; a batch larger than the cache is refused with the numbers; unwritable directories
  and full disks are refused before anything is written; state dicts round-trip and loads reach
  the next lookup.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from lightrec._fbgemm import fbgemm_available
from lightrec.kernels import (
    BatchedEmbedding,
    BatchedEmbeddingBag,
    CacheFullError,
    EmbOptimType,
    FusedEmbeddingBagCollection,
    FusedOptimizerSpec,
    RowState,
    TieredStorageError,
    TieringConfig,
)
from lightrec.kernels.tiered import backend as tiered_backend
from lightrec.kernels.tiered import inflight as tiered_inflight
from lightrec.kernels.tiered.cache import CacheIndex
from lightrec.kernels.tiered.transfer import TransferFailedError
from lightrec.modules import EmbeddingBagConfig, PoolingType
from lightrec.sparse import KeyedJaggedTensor

SPECS = {
    "sgd": FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=0.1),
    "adagrad": FusedOptimizerSpec(EmbOptimType.ADAGRAD, learning_rate=0.1, eps=1e-6),
    "rowwise_adagrad": FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.1, eps=1e-6),
    "adam": FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=0.01),
    "adamw": FusedOptimizerSpec(EmbOptimType.ADAM, learning_rate=0.01, weight_decay=0.1, weight_decay_mode="decoupled"),
    "sgd_l2": FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=0.1, weight_decay=0.01),
}
TABLES = [(3000, 8), (2000, 4), (2500, 8)]
FTM = [0, 1, 0, 2]  # table 0 read by two features
CACHE_ROWS = 300


def _batches(steps: int, rows: list[int], ftm: list[int], batch: int, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """Jagged batches over a skewed id range (hot rows recur, cold ones force evictions)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 4, (len(ftm) * batch,), generator=gen)
        ids = []
        for f, t in enumerate(ftm):
            n = int(lengths[f * batch : (f + 1) * batch].sum())
            hot = torch.randint(0, 40, (n,), generator=gen)
            cold = torch.randint(0, rows[t], (n,), generator=gen)
            ids.append(torch.where(torch.rand(n, generator=gen) < 0.5, hot, cold))
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        weights = torch.rand(int(lengths.sum()), generator=gen) + 0.5
        out.append((torch.cat(ids), offsets, weights))
    return out


def _pair(
    spec: FusedOptimizerSpec, tiering: TieringConfig, pooling: PoolingType, tables: list = TABLES, ftm: list = FTM
) -> tuple[torch.nn.Module, torch.nn.Module]:
    if pooling == PoolingType.NONE:
        tables = [(r, 8) for r, _ in tables]
        tiered: torch.nn.Module = BatchedEmbedding(tables, ftm, spec, kernel_backend="torch", tiering=tiering)
        memory: torch.nn.Module = BatchedEmbedding(tables, ftm, spec, kernel_backend="torch")
    else:
        tiered = BatchedEmbeddingBag(tables, ftm, pooling, spec, kernel_backend="torch", tiering=tiering)
        memory = BatchedEmbeddingBag(tables, ftm, pooling, spec, kernel_backend="torch")
    memory.load_state_dict(tiered.state_dict())
    return tiered, memory


def _run(module: torch.nn.Module, batch: tuple[torch.Tensor, ...], pooling: PoolingType) -> torch.Tensor:
    ids, offsets, weights = batch
    if pooling == PoolingType.NONE:
        return module(ids, offsets)
    return module(ids, offsets, weights)


def _assert_same_tables(tiered: torch.nn.Module, memory: torch.nn.Module) -> None:
    for a, b in zip(tiered.split_embedding_weights(), memory.split_embedding_weights(), strict=True):
        assert torch.equal(a, b)
    sa, sb = tiered.fused_optimizer.state_dict()["state"], memory.fused_optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for name in sa:
        for key in sb[name]:
            assert torch.equal(torch.as_tensor(sa[name][key]), torch.as_tensor(sb[name][key])), (name, key)


@pytest.mark.parametrize("prefetch", [False, True], ids=["lookup-only", "prefetch"])
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN, PoolingType.NONE], ids=lambda p: p.name)
@pytest.mark.parametrize("optimizer", list(SPECS))
def test_tiny_cache_equals_the_in_memory_table(optimizer: str, pooling: PoolingType, prefetch: bool, tmp_path) -> None:
    backing = "ssd" if (len(optimizer) + int(prefetch)) % 2 else "host"  # both tiers over the grid
    tiering = TieringConfig(backing, cache_rows=CACHE_ROWS, ssd_storage_directory=str(tmp_path))
    tiered, memory = _pair(SPECS[optimizer], tiering, pooling)
    batches = _batches(31, [r for r, _ in TABLES], FTM, batch=24)
    for step in range(30):
        out, ref = _run(tiered, batches[step], pooling), _run(memory, batches[step], pooling)
        assert torch.equal(out, ref), f"step {step}: {(out - ref).abs().max()}"
        if prefetch:  # the next batch's rows are fetched on the worker thread during this backward
            tiered.prefetch(*batches[step + 1][:2])
        out.square().sum().backward()
        ref.square().sum().backward()
    _assert_same_tables(tiered, memory)
    stats = tiered.kernel.stats()
    assert stats.rows_written_back > 0 and stats.rows_fetched > CACHE_ROWS  # the cache really churned
    assert 0.0 < stats.hit_rate < 1.0


def test_fused_collection_with_lfu_equals_in_memory(tmp_path) -> None:
    tables = [
        EmbeddingBagConfig(name="a", num_embeddings=4000, embedding_dim=8, feature_names=["fa"]),
        EmbeddingBagConfig(name="b", num_embeddings=900, embedding_dim=8, feature_names=["fb"], pooling=PoolingType.MEAN),
    ]
    fused_params = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}
    tiering = TieringConfig("ssd", cache_rows=250, algorithm="lfu", ssd_storage_directory=str(tmp_path))
    tiered = FusedEmbeddingBagCollection(tables, fused_params=fused_params, kernel_backend="torch", tiering=tiering)
    memory = FusedEmbeddingBagCollection(tables, fused_params=fused_params, kernel_backend="torch")
    memory.load_state_dict(tiered.state_dict())
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        lengths = torch.randint(0, 5, (2 * 16,), generator=gen)
        values = torch.cat([torch.randint(0, 900, (int(lengths.sum()),), generator=gen)])
        kjt = KeyedJaggedTensor(["fa", "fb"], values, lengths=lengths)
        a, b = tiered(kjt).values(), memory(kjt).values()
        assert torch.equal(a, b)
        a.sum().backward()
        b.sum().backward()
    for key, value in memory.state_dict().items():
        assert torch.equal(tiered.state_dict()[key], value), key
    assert tiered.fused_optimizer.state_dict()["state"].keys() == memory.fused_optimizer.state_dict()["state"].keys()


def test_write_back_under_eviction_pressure_loses_nothing(tmp_path) -> None:
    """Every row written through a tiny cache (100 slots, 5000 rows) reads back from the store."""
    spec = FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=1.0)
    tiering = TieringConfig("ssd", cache_rows=100, ssd_storage_directory=str(tmp_path))
    module = BatchedEmbeddingBag([(5000, 4)], optimizer=spec, kernel_backend="torch", tiering=tiering)
    with torch.no_grad():
        module.weights["t0"].zero_()
    expected = torch.zeros(5000, 4)
    for start in range(0, 5000, 50):  # 50 new rows per step: the cache turns over every 2 steps
        ids = torch.arange(start, start + 50)
        out = module(ids, torch.arange(51))
        (out * -1.0).sum().backward()  # SGD: every looked-up row gains exactly 1.0 per element
        expected[ids] += 1.0
    stats = module.kernel.stats()
    assert stats.rows_written_back >= 4800  # evicted dirty rows went to the store before reuse
    assert torch.equal(module.split_embedding_weights()[0].detach(), expected)  # flushes the last 100
    assert not [f for f in os.listdir(tmp_path) if not f.startswith(".")]  # the row files are unlinked


def _index(algorithm: str) -> CacheIndex:
    return CacheIndex([10], [4], algorithm, 0.0, ["t"], torch.device("cpu"))


@pytest.mark.parametrize("algorithm", ["lru", "lfu"])
def test_eviction_order(algorithm: str) -> None:
    index, kept = _index(algorithm), _index(algorithm)
    for ix in (index, kept):
        adm = ix.admit(0, torch.tensor([0, 1, 2, 3]), protect=1)
        assert adm.victim_rows.numel() == 0
        # uses: row 0 three times (long ago), rows 1-3 once each, recently
        ix.touch(ix.slots(torch.tensor([0, 0, 0])), 1)
        ix.touch(ix.slots(torch.tensor([1, 2, 3])), 2)
        ix.touch(ix.slots(torch.tensor([3])), 3)
        ix.mark_dirty(ix.slots(torch.tensor([0, 1])))
    adm = index.admit(0, torch.tensor([7]), protect=4)
    evicted = 0 if algorithm == "lru" else 1  # LRU: row 0 (used at tick 1); LFU: row 1 (once, oldest tie)
    assert adm.victim_rows.tolist() == [evicted]  # it was dirty: written back
    assert int(index.slots(torch.tensor([evicted]))) == -1 and int(index.slots(torch.tensor([7]))) >= 0
    # a batch in flight since tick 2 keeps every slot used at 2 or later: only row 0's may go
    adm = kept.admit(0, torch.tensor([7]), protect=2)
    assert adm.victim_rows.tolist() == [0]
    # (free, evictable, kept): row 7's slot is evictable until admit_batch touches it
    assert kept.room(0, protect=2) == (0, 1, 3)


def test_pinned_rows_are_not_evicted_and_a_too_large_batch_is_refused(tmp_path) -> None:
    spec = FusedOptimizerSpec(EmbOptimType.ROWWISE_ADAGRAD, learning_rate=0.1)
    tiering = TieringConfig("host", cache_rows=8)
    module = BatchedEmbeddingBag([(100, 4)], optimizer=spec, kernel_backend="torch", tiering=tiering)
    ref = BatchedEmbeddingBag([(100, 4)], optimizer=spec, kernel_backend="torch")
    ref.load_state_dict(module.state_dict())
    ids, offsets = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2, 5])
    out, ref_out = module(ids, offsets), ref(ids, offsets)
    # before the backward: a prefetch of 6 other rows may only use the 3 unpinned slots
    module.prefetch(torch.tensor([10, 11, 12, 13, 14, 15]), torch.tensor([0, 6]))
    out.sum().backward()
    ref_out.sum().backward()
    assert torch.equal(module.split_embedding_weights()[0], ref.split_embedding_weights()[0])
    with pytest.raises(CacheFullError, match=r"table 't0': a batch needs 9 more of its rows .* holds 8 rows"):
        module(torch.arange(20, 29), torch.tensor([0, 9]))
    assert torch.equal(module(ids, offsets), ref(ids, offsets))  # the refused batch changed nothing


def test_graph_dropped_without_backward_releases_its_rows() -> None:
    spec = FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=0.1)
    module = BatchedEmbeddingBag([(50, 4)], optimizer=spec, kernel_backend="torch", tiering=TieringConfig("host", cache_rows=6))
    out = module(torch.arange(6), torch.tensor([0, 6]))
    kernel = module.kernel
    assert [h.tick for h in kernel.in_flight.holds] == [1]  # its 6 slots are kept for its backward
    with pytest.raises(CacheFullError, match="0 evictable"):
        module(torch.arange(6, 8), torch.tensor([0, 2]))
    del out  # e.g. a validation forward with grad enabled
    assert not kernel.in_flight.holds
    module(torch.arange(6, 12), torch.tensor([0, 6])).sum().backward()  # all 6 slots evictable again


def test_a_failed_transfer_is_raised_then_refused_until_a_load(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """An I/O error on the worker reaches the next lookup; after it the table refuses lookups,
    prefetches and saves (its cache no longer matches its store) until a load replaces its rows,
    after which it trains as the in-memory table does."""
    monkeypatch.setattr(tiered_backend, "_usable_cores", lambda: torch.get_num_threads() + 1)  # prefetch on the worker
    spec = FusedOptimizerSpec(EmbOptimType.ADAGRAD, learning_rate=0.1)
    tiering = TieringConfig("ssd", cache_rows=16, ssd_storage_directory=str(tmp_path))
    module = BatchedEmbeddingBag([(200, 4)], optimizer=spec, kernel_backend="torch", tiering=tiering)
    ref = BatchedEmbeddingBag([(200, 4)], optimizer=spec, kernel_backend="torch")
    saved = {k: v.clone() for k, v in module.state_dict().items()}
    ref.load_state_dict(saved)
    offsets = torch.tensor([0, 8])
    for step in range(3):
        module(torch.arange(8 * step, 8 * step + 8), offsets).sum().backward()
        ref(torch.arange(8 * step, 8 * step + 8), offsets).sum().backward()  # (the same optimizer state)
    queue = module.kernel.queue

    def fail(transfer: object, same_stream: bool = False) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(queue, "_run", fail)
    module.prefetch(torch.arange(100, 108), offsets)  # its fetch fails on the worker
    with pytest.raises(OSError, match="Input/output error"):
        module(torch.arange(100, 108), offsets)
    monkeypatch.undo()
    with pytest.raises(TransferFailedError, match=r"failed earlier \(OSError.*load a checkpoint"):
        module(torch.arange(100, 108), offsets)
    with pytest.raises(TransferFailedError):
        module.prefetch(torch.arange(8), offsets)
    with pytest.raises(TransferFailedError):
        module.state_dict()  # no checkpoint of rows the store may not hold
    module.load_state_dict(saved)
    ref.load_state_dict(saved)
    for step in range(4):
        ids = torch.arange(30 * step, 30 * step + 8)
        assert torch.equal(module(ids, offsets), ref(ids, offsets))
        module(ids, offsets).square().sum().backward()
        ref(ids, offsets).square().sum().backward()
    assert torch.equal(module.split_embedding_weights()[0], ref.split_embedding_weights()[0])


def test_a_prefetch_for_evaluation_leaves_its_rows_clean(tmp_path) -> None:
    """Rows fetched and looked up without grad are not written back when evicted (they did not
    change); a batch prefetched without grad but looked up for training is updated and kept."""
    spec = FusedOptimizerSpec(EmbOptimType.ADAGRAD, learning_rate=0.1)
    tiering = TieringConfig("ssd", cache_rows=16, ssd_storage_directory=str(tmp_path))
    module = BatchedEmbeddingBag([(300, 4)], optimizer=spec, kernel_backend="torch", tiering=tiering)
    ref = BatchedEmbeddingBag([(300, 4)], optimizer=spec, kernel_backend="torch")
    ref.load_state_dict(module.state_dict())
    offsets = torch.tensor([0, 8])
    with torch.no_grad():
        for step in range(6):  # 48 rows through 16 slots: every step evicts
            ids = torch.arange(8 * step, 8 * step + 8)
            module.prefetch(ids, offsets)
            assert torch.equal(module(ids, offsets), ref(ids, offsets))
    assert module.kernel.stats().rows_written_back == 0
    ids = torch.arange(100, 108)
    with torch.no_grad():
        module.prefetch(ids, offsets)
    module(ids, offsets).square().sum().backward()  # looked up for training after all
    ref(ids, offsets).square().sum().backward()
    assert torch.equal(module.split_embedding_weights()[0], ref.split_embedding_weights()[0])


def test_a_graph_kept_for_many_lookups_pins_its_rows_and_frees_the_rest(tmp_path) -> None:
    """A lookup whose backward waits (a graph kept for later) gets pins on its slots when the cache
    needs room: it keeps serving other batches around them, and the late backward updates its rows
    as the in-memory table's does."""
    spec = FusedOptimizerSpec(EmbOptimType.ADAGRAD, learning_rate=0.1)
    tiering = TieringConfig("ssd", cache_rows=12, ssd_storage_directory=str(tmp_path))
    module = BatchedEmbeddingBag([(200, 4)], optimizer=spec, kernel_backend="torch", tiering=tiering)
    ref = BatchedEmbeddingBag([(200, 4)], optimizer=spec, kernel_backend="torch")
    ref.load_state_dict(module.state_dict())
    kept_ids, offsets = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 4])
    kept, ref_kept = module(kept_ids, offsets), ref(kept_ids, offsets)
    for step in range(tiered_inflight.HOLD_LOOKUPS + 8):  # 8 new rows per step through the 8 other slots
        ids = torch.arange(10 + 8 * step, 18 + 8 * step) % 190 + 10
        module(ids, torch.tensor([0, 8])).square().sum().backward()
        ref(ids, torch.tensor([0, 8])).square().sum().backward()
    hold = module.kernel.in_flight.holds[0]
    assert hold.pinned and int(module.kernel.index.pins.sum()) == 4
    kept.sum().backward()
    ref_kept.sum().backward()
    assert not module.kernel.in_flight.holds and int(module.kernel.index.pins.sum()) == 0
    assert torch.equal(module.split_embedding_weights()[0], ref.split_embedding_weights()[0])


def test_state_dict_round_trip_and_loads_reach_the_next_lookup(tmp_path) -> None:
    spec = SPECS["adam"]
    tiering = TieringConfig("ssd", cache_rows=30, ssd_storage_directory=str(tmp_path))
    tiered, memory = _pair(spec, tiering, PoolingType.SUM)
    batches = _batches(6, [r for r, _ in TABLES], FTM, batch=8, seed=3)
    for batch in batches:
        _run(tiered, batch, PoolingType.SUM).sum().backward()
    # a load into the tiered module replaces what its cache held
    memory_state = {k: v.clone() for k, v in memory.state_dict().items()}
    optim_state = copy.deepcopy(memory.fused_optimizer.state_dict())
    tiered.load_state_dict(memory_state)
    tiered.fused_optimizer.load_state_dict(optim_state)
    _assert_same_tables(tiered, memory)
    for batch in batches[:3]:
        a, b = _run(tiered, batch, PoolingType.SUM), _run(memory, batch, PoolingType.SUM)
        assert torch.equal(a, b)
        a.sum().backward()
        b.sum().backward()
    _assert_same_tables(tiered, memory)


def test_row_access_through_the_cache(tmp_path) -> None:
    spec = SPECS["rowwise_adagrad"]
    tiering = TieringConfig("ssd", cache_rows=20, ssd_storage_directory=str(tmp_path))
    tiered, memory = _pair(spec, tiering, PoolingType.SUM)
    for batch in _batches(4, [r for r, _ in TABLES], FTM, batch=4, seed=5):
        for m in (tiered, memory):
            _run(m, batch, PoolingType.SUM).square().sum().backward()
    rows = torch.tensor([0, 1, 2, 39, 2999])  # cached and uncached rows
    got, want = tiered.kernel.read_rows(0, rows), memory.kernel.read_rows(0, rows)
    assert torch.equal(got.weights, want.weights) and torch.equal(got.states["momentum1"], want.states["momentum1"])
    fresh = torch.full((5, 8), 0.5)
    tiered.reset_rows("t0", rows, fresh)
    memory.reset_rows("t0", rows, fresh)
    batch = (torch.tensor([0, 2, 2999]), torch.tensor([0, 3, 3, 3, 3]), None)
    assert torch.equal(tiered(batch[0], batch[1]), memory(batch[0], batch[1]))
    with pytest.raises(KeyError, match="has no row state"):
        tiered.kernel.write_rows(0, rows, RowState(fresh, {"momentum2": torch.zeros(5)}))


def test_storage_errors_are_clear(tmp_path, monkeypatch) -> None:
    spec = SPECS["sgd"]
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(TieredStorageError, match="cannot hold the tables' row files"):
        BatchedEmbeddingBag([(10, 4)], optimizer=spec, tiering=TieringConfig("ssd", ssd_storage_directory=str(blocked / "x")))
    import lightrec.kernels.tiered.store as store

    real = store.shutil.disk_usage
    monkeypatch.setattr(store.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    with pytest.raises(TieredStorageError, match=r"has 0.00 GiB free but the tables' row files need"):
        BatchedEmbeddingBag([(1000, 4)], optimizer=spec, tiering=TieringConfig("ssd", ssd_storage_directory=str(tmp_path)))
    monkeypatch.undo()
    with pytest.raises(ValueError, match="needs a fused optimizer"):
        BatchedEmbeddingBag([(10, 4)], optimizer=None, tiering=TieringConfig("host"))
    with pytest.raises(ValueError, match="cache_load_factor must be a share"):
        TieringConfig("ssd", cache_load_factor=1.5)
    with pytest.raises(ValueError, match="cache algorithm must be one of"):
        TieringConfig("ssd", algorithm="fifo")
    module = BatchedEmbeddingBag([(10, 4)], optimizer=spec, tiering=TieringConfig("host"))
    with pytest.raises(RuntimeError, match="cannot change device or dtype"):
        module.double()
    with pytest.raises(TypeError, match="cannot be deep-copied"):
        copy.deepcopy(module)
    assert "tiering=host/lru" in repr(module)


@pytest.mark.parametrize(
    "cache_kernel",
    ["torch", pytest.param("fbgemm", marks=pytest.mark.skipif(not fbgemm_available(), reason="fbgemm absent"))],
)
def test_one_id_bags_and_a_cache_served_by_fbgemm(cache_kernel: str, tmp_path) -> None:
    """fbgemm's TBE saves its weights for backward: prefetches that write other cache rows between a
    forward and its backward must not trip autograd's in-place check (the transfer's aliases)."""
    spec = SPECS["rowwise_adagrad"]
    tables, ftm = [(4000, 8), (3000, 8)], [0, 1]
    tiering = TieringConfig("ssd", cache_rows=120, ssd_storage_directory=str(tmp_path))
    tiered = BatchedEmbeddingBag(tables, ftm, optimizer=spec, kernel_backend=cache_kernel, tiering=tiering)
    memory = BatchedEmbeddingBag(tables, ftm, optimizer=spec, kernel_backend=cache_kernel)
    memory.load_state_dict(tiered.state_dict())
    assert tiered.kernel.inner_name == cache_kernel
    gen = torch.Generator().manual_seed(7)
    batches = [torch.randint(0, 3000, (2 * 32,), generator=gen) for _ in range(31)]
    offsets = torch.arange(2 * 32 + 1)  # one id per bag
    for step in range(30):
        out, ref = tiered(batches[step], offsets), memory(batches[step], offsets)
        assert torch.equal(out, ref)
        tiered.prefetch(batches[step + 1], offsets)
        out.square().sum().backward()
        ref.square().sum().backward()
    _assert_same_tables(tiered, memory)


def test_page_ranges_cover_every_missed_page_in_few_ranges() -> None:
    """The SSD store announces the missed rows' pages as ranges (one posix_fadvise each, not one per page)."""
    import numpy as np

    from lightrec.kernels.tiered.store import page_ranges

    pages = np.array([40, 3, 3, 5, 9, 10, 41, 100, 0])
    first, count = page_ranges(pages, gap=4)
    assert first.tolist() == [0, 40, 100] and count.tolist() == [11, 2, 1]
    covered = set(np.concatenate([np.arange(f, f + c) for f, c in zip(first, count)]).tolist())
    assert set(pages.tolist()) <= covered and len(covered) == 14
    assert page_ranges(pages, gap=0)[0].tolist() == [0, 3, 5, 9, 40, 100]  # gap 0: only adjacent pages merge
    assert page_ranges(np.zeros(0, dtype=np.int64), gap=4)[0].size == 0


def test_join_also_waits_for_calls_queued_while_it_waits() -> None:
    # A release queued during join's wait (a finalizer, or another thread) must not be left running
    # beside the training thread once join returned: it would update the pins concurrently.
    import threading
    import time

    from lightrec.kernels.tiered.transfer import TransferQueue

    queue = TransferQueue(None, [], torch.device("cpu"))  # type: ignore[arg-type] - calls need no store
    started, done = threading.Event(), []

    def first() -> None:
        started.set()
        time.sleep(0.3)

    def second() -> None:
        time.sleep(0.1)
        done.append(True)

    queue.submit_call(first)
    assert started.wait(5)
    late = threading.Timer(0.05, lambda: queue.submit_call(second))
    late.start()
    queue.join()
    late.join()
    assert done == [True] and not queue.busy
    queue.close()
