"""Where a tiered table's cache and its backing store disagree, and what must still hold.

* Learned per-sample weights: their gradient ``<grad_out, row>`` uses the rows the forward used --
  the cached (dirty) ones, not the store's older copies -- equal to ``nn.EmbeddingBag``'s.
* A copy that fails on the training thread (a lookup's fetch, a flush's write-back, a prefetch's
  in-memory part) breaks the table as a failure on the worker does (``TransferFailedError`` until a
  load), and a failed flush leaves its rows dirty.
* An SSD store's row files never have a name on disk, not even while they are preallocated.
* An evaluation lookup between a prefetch and its lookup leaves the prefetch's reservation alone.
* The planner's per-slot bytes are the cache's per-slot arrays.
"""

from __future__ import annotations

import os

import pytest
import torch

from lightrec.distributed.planner import shard_estimators
from lightrec.kernels import BatchedEmbeddingBag, EmbOptimType, FusedOptimizerSpec, TieringConfig
from lightrec.kernels.tiered import backend as tiered_backend
from lightrec.kernels.tiered import store as tiered_store
from lightrec.kernels.tiered.cache import CacheIndex, native_tiered_available
from lightrec.kernels.tiered.transfer import TransferFailedError
from lightrec.modules import PoolingType

LR = 0.5
TABLES = [(120, 4), (90, 8)]
FTM = [0, 1, 0]  # table 0 read by two features


def _batch(gen: torch.Generator, batch: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices [N], offsets [F * B + 1])`` over a few hot rows, so rows stay cached across steps."""
    lengths = torch.randint(0, 4, (len(FTM) * batch,), generator=gen)
    ids = [torch.randint(0, 20, (int(lengths[f * batch : (f + 1) * batch].sum()),), generator=gen) for f in range(len(FTM))]
    return torch.cat(ids), torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])


def _reference(
    emb: list[torch.nn.EmbeddingBag], ids: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor, batch: int
) -> torch.Tensor:
    """``[B, sum D]``: each feature through its table's ``nn.EmbeddingBag(mode="sum")``."""
    outs = []
    for f, t in enumerate(FTM):
        bags = offsets[f * batch : (f + 1) * batch + 1]
        lo, hi = int(bags[0]), int(bags[-1])
        outs.append(emb[t](ids[lo:hi], bags[:-1] - lo, per_sample_weights=psw[lo:hi]))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("prefetch", [False, True], ids=["lookup-only", "prefetch"])
@pytest.mark.parametrize("backing", ["host", "ssd"])
def test_per_sample_weight_gradient_reads_the_cached_rows(backing: str, prefetch: bool, tmp_path) -> None:
    """After a few SGD steps the cached rows are newer than the store; the per-sample weights'
    gradient must be taken from them (it equals ``nn.EmbeddingBag``'s at every step)."""
    spec = FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=LR)
    tiering = TieringConfig(backing, cache_rows=64, ssd_storage_directory=str(tmp_path))
    module = BatchedEmbeddingBag(TABLES, FTM, optimizer=spec, kernel_backend="torch", tiering=tiering)
    emb = [torch.nn.EmbeddingBag(r, d, mode="sum") for r, d in TABLES]
    with torch.no_grad():
        for e, w in zip(emb, module.split_embedding_weights(), strict=True):
            e.weight.copy_(w)
    gen = torch.Generator().manual_seed(0)
    batches = [_batch(gen) for _ in range(7)]
    for step in range(6):
        ids, offsets = batches[step]
        psw = (torch.rand(ids.numel(), generator=gen) + 0.5).requires_grad_(True)
        ref_psw = psw.detach().clone().requires_grad_(True)
        scale = torch.randn(6, sum(TABLES[t][1] for t in FTM), generator=gen)
        out, ref = module(ids, offsets, psw), _reference(emb, ids, offsets, ref_psw, 6)
        torch.testing.assert_close(out, ref)
        if prefetch:  # the next batch's rows move while this backward runs
            module.prefetch(*batches[step + 1])
        (out * scale).sum().backward()
        (ref * scale).sum().backward()
        torch.testing.assert_close(psw.grad, ref_psw.grad, rtol=1e-5, atol=1e-6, msg=f"step {step}")
        with torch.no_grad():  # plain SGD on the reference: what the fused update does
            for e in emb:
                e.weight -= LR * e.weight.grad
                e.weight.grad = None
    assert int(module.kernel.index.dirty.sum()) > 0  # the cache really held rows the store did not


def test_mean_pooled_per_sample_weight_gradient_reads_the_cached_rows(tmp_path) -> None:
    """MEAN pooling (``nn.EmbeddingBag`` takes no per-sample weights there): the in-memory table,
    whose split views are the live rows, is the reference."""
    spec = FusedOptimizerSpec(EmbOptimType.ADAGRAD, learning_rate=LR)
    tiering = TieringConfig("ssd", cache_rows=64, ssd_storage_directory=str(tmp_path))
    tiered = BatchedEmbeddingBag(TABLES, FTM, PoolingType.MEAN, spec, kernel_backend="torch", tiering=tiering)
    memory = BatchedEmbeddingBag(TABLES, FTM, PoolingType.MEAN, spec, kernel_backend="torch")
    memory.load_state_dict(tiered.state_dict())
    gen = torch.Generator().manual_seed(1)
    for step in range(5):
        ids, offsets = _batch(gen)
        psw = (torch.rand(ids.numel(), generator=gen) + 0.5).requires_grad_(True)
        ref_psw = psw.detach().clone().requires_grad_(True)
        tiered(ids, offsets, psw).square().sum().backward()
        memory(ids, offsets, ref_psw).square().sum().backward()
        torch.testing.assert_close(psw.grad, ref_psw.grad, rtol=1e-5, atol=1e-6, msg=f"step {step}")


def _trained(tmp_path, backing: str = "ssd", cache_rows: int = 16) -> BatchedEmbeddingBag:
    spec = FusedOptimizerSpec(EmbOptimType.ADAGRAD, learning_rate=0.1)
    tiering = TieringConfig(backing, cache_rows=cache_rows, ssd_storage_directory=str(tmp_path))
    module = BatchedEmbeddingBag([(200, 4)], optimizer=spec, kernel_backend="torch", tiering=tiering)
    offsets = torch.tensor([0, 8])
    for step in range(3):
        module(torch.arange(4 * step, 4 * step + 8), offsets).square().sum().backward()
    return module


def _fail_once(monkeypatch: pytest.MonkeyPatch, target: object, name: str) -> list[int]:
    """Make ``target.name`` raise an I/O error on its next call (then behave again); returns the call count."""
    real, calls = getattr(target, name), []

    def fail(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(5, "Input/output error")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, fail)
    return calls


def test_a_failed_flush_keeps_its_rows_dirty_and_breaks_the_table(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    module = _trained(tmp_path)
    kernel = module.kernel
    dirty = kernel.index.dirty.clone()
    assert int(dirty.sum()) > 0
    calls = _fail_once(monkeypatch, kernel.queue, "_run")
    with pytest.raises(OSError, match="Input/output error"):
        kernel.flush()
    assert calls and torch.equal(kernel.index.dirty, dirty)  # not marked clean: they never reached the store
    assert kernel.queue.failure is not None
    with pytest.raises(TransferFailedError, match="load a checkpoint"):
        kernel.flush()  # a retry must not report success with the rows missing from the store
    with pytest.raises(TransferFailedError):
        module.state_dict()


def test_a_failed_fetch_on_the_training_thread_breaks_the_table(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    module = _trained(tmp_path)
    saved = {k: v.clone() for k, v in module.state_dict().items()}
    offsets = torch.tensor([0, 8])
    _fail_once(monkeypatch, module.kernel.queue, "_run")
    with pytest.raises(OSError, match="Input/output error"):
        module(torch.arange(100, 108), offsets)  # misses: its fetch (and write-backs) fail here
    with pytest.raises(TransferFailedError, match=r"failed earlier \(OSError"):
        module(torch.arange(100, 108), offsets)  # slots assigned to rows never fetched: refused
    module.load_state_dict(saved)  # a load ends the refusal
    module(torch.arange(100, 108), offsets).sum().backward()


@pytest.mark.skipif(not native_tiered_available(torch.device("cpu")), reason="lightrec's native ops absent")
def test_a_failed_in_memory_prefetch_copy_breaks_the_table(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A prefetch copies rows already in memory on the training thread (``run_if_cached``)."""
    monkeypatch.setattr(tiered_backend, "_usable_cores", lambda: torch.get_num_threads())  # bookkeeping here
    module = _trained(tmp_path, backing="host")
    _fail_once(monkeypatch, torch.ops.lightrec_tiered, "tiered_transfer")
    with pytest.raises(OSError, match="Input/output error"):
        module.prefetch(torch.arange(100, 108), torch.tensor([0, 8]))
    monkeypatch.undo()
    with pytest.raises(TransferFailedError):
        module(torch.arange(100, 108), torch.tensor([0, 8]))


def test_ssd_row_files_have_no_name_on_disk_while_preallocated(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A process killed at any point of building the store leaves no file behind."""
    real, seen = os.posix_fallocate, []

    def fallocate(fd: int, offset: int, length: int) -> None:
        seen.append(sorted(os.listdir(tmp_path)))
        real(fd, offset, length)

    monkeypatch.setattr(tiered_store.os, "posix_fallocate", fallocate)
    _trained(tmp_path)
    assert seen and all(names == [] for names in seen), seen
    assert os.listdir(tmp_path) == []


def test_an_evaluation_lookup_leaves_a_prefetched_batch_reserved() -> None:
    """prefetch(A), an evaluation lookup of B, lookup(A): A's prefetch is what serves A (its ids are
    counted once), and B's ids are counted too."""
    spec = FusedOptimizerSpec(EmbOptimType.SGD, learning_rate=0.1)
    module = BatchedEmbeddingBag([(200, 4)], optimizer=spec, kernel_backend="torch", tiering=TieringConfig("host", cache_rows=32))
    a, b = torch.arange(0, 8), torch.arange(50, 56)
    module.prefetch(a, torch.tensor([0, 8]))
    with torch.no_grad():
        module(b, torch.tensor([0, 6]))
    assert len(module.kernel._reservations) == 1  # A's reservation is still there for A's lookup
    module(a, torch.tensor([0, 8])).sum().backward()
    stats = module.kernel.stats()
    assert (stats.lookups, stats.requested_ids, stats.missed_ids, stats.rows_fetched) == (2, 14, 14, 14)
    assert not module.kernel._reservations and not module.kernel.in_flight.holds


def test_planner_slot_bytes_are_the_cache_arrays() -> None:
    """``SLOT_META_BYTES`` / ``SLOT_INDEX_BYTES``: the bytes a real ``CacheIndex`` keeps per slot / per row."""
    rows, slots = 100, 10
    index = CacheIndex([rows], [slots], "lfu", 0.1, ["t"], torch.device("cpu"))
    per_slot = [v for v in vars(index).values() if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == slots]
    per_row = [v for v in vars(index).values() if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == rows]
    assert len(per_slot) >= 6  # row_of, last_used, freq, pins, dirty, free_ring
    assert shard_estimators.SLOT_META_BYTES == sum(v.nbytes for v in per_slot) // slots
    assert shard_estimators.SLOT_INDEX_BYTES == sum(v.nbytes for v in per_row) // rows
