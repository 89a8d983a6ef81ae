"""``TieredBatchedLookup``: tables larger than the fast tier -- a cache of hot rows over host memory or SSD.

Every row and its fused-optimizer state live in a backing :class:`~lightrec.kernels.tiered.store.RowStore`
(host memory, or direct row files on SSD); the hot rows live in a cache on the kernel's device,
which an ordinary in-memory kernel (torch, fbgemm or Triton, chosen by ``kernel_backend``) serves
as if it were the table::

    lookup(ids)    global rows -> cache slots (one gather); misses are fetched first (evicting the
                   lowest-scored slots no batch in flight uses, writing dirty ones back); the cache
                   kernel looks up the slots, and its backward -- the fused update -- updates the
                   cached rows (marked dirty when admitted). The slots stay put until that
                   backward has run (``inflight.py``).
    prefetch(ids)  the same for a later batch while the current batch trains
                   (``SparseDistPipeline.prefetch``, ``SparseDistPrefetch``): on CPU one native call
                   for the bookkeeping and one per table for the copies -- on the worker thread when
                   a core is free for it, else here with the worker reading what must come from the
                   disk. Its slots stay put until it is looked up; a lookup whose prefetch admitted
                   every row only touches its slots
    flush()        dirty rows back to the store: the split views then hold every row's current value
    invalidate()   forget the cache (after the store was written from outside: a checkpoint load)

Every fused optimizer of the in-memory kernels gives the same numbers: the cache kernel applies the
same arithmetic to the same rows, with its own step counter (Adam's ``t``) advancing per backward.
``split_embedding_weights()`` / ``split_optimizer_states()`` are the store's tensors (mmap'd files
for SSD): current after :meth:`flush`, which ``BatchedEmbeddingBag`` runs before its state dict,
its fused optimizer's state dict and its ``split_embedding_weights()``.
"""

from __future__ import annotations

import collections
import functools
import math
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from lightrec.kernels.input_checks import LookupInputChecker
from lightrec.kernels.kernel_interface import (
    EmbeddingKernel,
    KernelConfig,
    LookupBatch,
    RowState,
    require_support,
)
from lightrec.kernels.tiered.cache import BatchAdmission, CacheFullError, CacheIndex
from lightrec.kernels.tiered.config import TieringConfig
from lightrec.kernels.tiered.inflight import BatchesInFlight, Hold
from lightrec.kernels.tiered.lookup_node import TieredLookupNode
from lightrec.kernels.tiered.store import HostMemoryStore, RowStore, SsdRowStore
from lightrec.kernels.tiered.transfer import TablePart, Transfer, TransferQueue, unversioned

__all__ = ["TieredBatchedLookup", "TieredCacheStats"]

_MAX_RESERVATIONS = 4  # prefetched batches held ahead of their lookups


@functools.cache
def _usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; all of them where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class TieredCacheStats:
    """Counters of a tiered kernel since it was built (``TieredBatchedLookup.stats``).

    Attributes:
        lookups: lookups run.
        requested_ids / missed_ids: ids looked up, and those whose row was not in the cache when
            the batch was first seen (by its prefetch, else by its lookup).
        rows_fetched / rows_written_back: rows read from / written to the backing store.
        bytes_read / bytes_written: the same in bytes (weights and optimizer state).
        cached_rows / cache_rows: rows in the cache now, and its capacity.
    """

    lookups: int = 0
    requested_ids: int = 0
    missed_ids: int = 0
    rows_fetched: int = 0
    rows_written_back: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    cached_rows: int = 0
    cache_rows: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of ids served from the cache (1.0 before any lookup)."""
        return 1.0 - self.missed_ids / self.requested_ids if self.requested_ids else 1.0


class TieredBatchedLookup:
    """A tiered ``EmbeddingKernel`` (see the module docstring); built by ``build_kernel`` from a
    ``KernelConfig`` whose ``tiering`` names the backing tier, the cache and the cache's kernel."""

    name: ClassVar[str] = "tiered"
    checks_ids_on_device: ClassVar[bool] = False
    wants_singletons: ClassVar[bool] = True
    prefetches = True
    error_flag: torch.Tensor | None = None

    @classmethod
    def supports(cls, config: KernelConfig) -> str | None:
        """Why ``config`` cannot be served: no tiering, no fused optimizer, or no cache kernel."""
        tiering = getattr(config, "tiering", None)
        if tiering is None:
            return "the tables are not tiered (KernelConfig.tiering is None)"
        if config.spec is None:
            return (
                "a tiered table needs a fused optimizer (its rows are updated where they are cached; a dense "
                "[rows, D] gradient of a table larger than memory cannot exist)"
            )
        if tiering.inner_kernel is None:
            return "no kernel serves the cache (TieringConfig.inner_kernel; build tiered kernels with build_kernel)"
        return None

    def __init__(self, config: KernelConfig) -> None:
        require_support(self.supports(config), "tiered")
        tiering = config.tiering
        assert tiering is not None and tiering.inner_kernel is not None  # supports() checked both
        self.tiering: TieringConfig = tiering
        self.tiering, self.spec, self.device = tiering, config.spec, config.device
        self.rows, self.dims = list(config.rows), list(config.dims)
        self.ftm, self.pooling = list(config.feature_table_map), config.pooling
        self.names = list(config.table_names) or [f"t{i}" for i in range(len(self.rows))]
        self.cache_rows = [tiering.cache_rows_for(r) for r in self.rows]
        inner_config = KernelConfig(
            self.cache_rows, self.dims, self.ftm, self.pooling, self.spec, self.device, self.names, config.dtype
        )
        self.inner: EmbeddingKernel = tiering.inner_kernel(inner_config)
        self.inner_name: str = tiering.inner_kernel.name
        states = self._row_state_layout()
        store_args = (self.rows, self.dims, config.dtype, states, self.names)
        self.store: RowStore = (
            SsdRowStore(*store_args, directory=tiering.directory)
            if tiering.backing == "ssd"
            else HostMemoryStore(*store_args, pin=self.device.type == "cuda")
        )
        self.index = CacheIndex(self.rows, self.cache_rows, tiering.algorithm, tiering.eviction_headroom,
                                self.names, self.device)  # fmt: skip
        self._cache_views = self._unversioned_cache_views()
        self.queue = TransferQueue(self.store, self._cache_views, self.device)
        weakref.finalize(self, self.queue.close)
        self._row_shift = self._per_feature([self.index.row_offset[t] for t in self.ftm])
        self._slot_shift = self._per_feature([self.index.cache_offset[t] for t in self.ftm])
        self._reservations: collections.deque[_Reservation] = collections.deque()
        self.in_flight = BatchesInFlight(self.index)  # which slots stay put (inflight.py)
        self._evictions_queued = 0  # evictions ahead of need submitted to the worker and not yet run
        self._worker_bookkeeping = False  # the queued prefetches' bookkeeping runs on the worker (CPU, native)
        self.generation = 0  # bumped by invalidate(): a backward of an older lookup updates nothing
        self._stats = TieredCacheStats(cache_rows=sum(self.cache_rows))
        # a prefetch's ids are checked as a lookup's are (a bad id would admit another table's row,
        # or fail in the bookkeeping -- on the worker thread, breaking the table until a load)
        self._prefetch_checker = LookupInputChecker(self.rows, self.ftm, self.names, "sync")

    def _row_state_layout(self) -> list[dict[str, tuple[tuple[int, ...], torch.dtype]]]:
        """Per table ``{state: (shape after the row dim, dtype)}`` of the cache kernel's row states."""
        out = []
        for t, states in enumerate(self.inner.split_optimizer_states()):
            out.append(
                {k: (tuple(v.shape[1:]), v.dtype) for k, v in states.items() if v.dim() >= 1 and v.shape[0] == self.cache_rows[t]}
            )
        return out

    def _unversioned_cache_views(self) -> list[dict[str, torch.Tensor]]:
        weights = self.inner.split_embedding_weights()
        states = self.inner.split_optimizer_states()
        layout = self._row_state_layout()
        return [
            {"weight": unversioned(weights[t]), **{k: unversioned(states[t][k]) for k in layout[t]}}
            for t in range(len(self.rows))
        ]

    def _per_feature(self, values: list[int]) -> torch.Tensor | None:
        return None if not any(values) else torch.tensor(values, dtype=torch.int64, device=self.device)

    def count_step(self) -> None:
        """A fused backward of no samples: the cache kernel's shared counters (Adam's step) advance."""
        self.inner.count_step()

    # ---- the split views are the backing store ---------------------------------------------------
    def split_embedding_weights(self) -> list[torch.Tensor]:
        """``[rows, D]`` per table: the store's tensors (current after :meth:`flush`)."""
        return list(self.store.weights)

    def split_optimizer_states(self) -> list[dict[str, torch.Tensor]]:
        """Per table the store's row states, plus the cache kernel's shared counters (Adam's step)."""
        inner = self.inner.split_optimizer_states()
        return [{**self.store.states[t], **{k: v for k, v in inner[t].items() if k not in self.store.states[t]}}
                for t in range(len(self.rows))]  # fmt: skip

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Allow only no-op conversions: the cache and the store are laid out for one device and dtype."""
        probe = torch.empty(0, dtype=self.store.weights[0].dtype, device=self.device)
        moved = fn(probe)
        if moved.device != probe.device or moved.dtype != probe.dtype:
            raise RuntimeError(
                "a tiered embedding table cannot change device or dtype after construction; build it with "
                f"device=... (it is on {self.device}, {probe.dtype})"
            )

    def __deepcopy__(self, memo: dict[int, object]) -> TieredBatchedLookup:
        raise TypeError(
            "a tiered embedding table (fused_uvm_caching / key_value) cannot be deep-copied: its rows live in a "
            "backing store; build another module and load_state_dict() into it"
        )

    # ---- ids -> slots ------------------------------------------------------------------------------
    def _shift(self, shift: torch.Tensor | None, offsets: torch.Tensor, batch: int, n: int) -> torch.Tensor | int:
        if shift is None:
            return 0
        starts = offsets[::batch] if batch else offsets[:1]
        return torch.repeat_interleave(shift, starts[1:] - starts[:-1], output_size=n)

    def _global_rows(self, indices: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
        if self._row_shift is None:  # every feature reads the first table: no shift (and no op)
            return indices.long()
        return indices.long() + self._shift(self._row_shift, offsets, batch, indices.numel())

    def _admit(self, global_rows: torch.Tensor, tick: int, best_effort: bool, pin: bool) -> tuple[Transfer, BatchAdmission]:
        """The batch's bookkeeping (``CacheIndex.admit_batch``: misses admitted, slots touched and
        pinned) and the transfer that brings its missing rows in; counts the rows moved.

        Raises:
            CacheFullError: not ``best_effort`` and some table cannot hold the batch's rows at once
                (checked for every table before any bookkeeping changes).
        """
        while True:
            protect = self.in_flight.protect_from(tick)
            try:
                admission = self.index.admit_batch(
                    global_rows, tick, best_effort=best_effort, pin=pin, protect_from=protect
                )
                break
            except CacheFullError:  # (refused: nothing changed) the oldest batch in flight's slots may be
                if self.in_flight.pin_oldest():  # holding back slots no batch in flight uses: pin them instead
                    continue
                if not self._reservations:
                    raise
                # a prefetched batch not looked up yet holds the room this lookup needs: a prefetch is
                # best effort and never makes a lookup fail, so give its slots up (its own lookup, if
                # it comes, admits its rows again)
                self.in_flight.drop(self._reservations.popleft().hold, updated=False)
        transfer = Transfer()
        stats = self._stats
        for t, adm in admission.parts:
            lo, row_bytes = self.index.cache_offset[t], self.store.row_bytes(t)
            victim_slots, slots = (adm.victim_slots, adm.slots) if lo == 0 else (adm.victim_slots - lo, adm.slots - lo)
            transfer.parts.append(TablePart(t, victim_slots, adm.victim_rows.cpu(), adm.rows.cpu(), slots))
            fetched, written = adm.rows.numel(), adm.victim_rows.numel()
            stats.rows_fetched += fetched
            stats.rows_written_back += written
            stats.bytes_read += fetched * row_bytes
            stats.bytes_written += written * row_bytes
        return transfer, admission

    # ---- lookup -----------------------------------------------------------------------------------
    def lookup(self, batch: LookupBatch, weight_inputs: Sequence[torch.Tensor], lr: Callable[[], float]) -> torch.Tensor:
        """The cache kernel's lookup of the batch's slots (misses fetched first); see the module docstring."""
        self.queue.join()
        offsets = batch.offsets.long()
        global_rows = self._global_rows(batch.indices, offsets, batch.batch_size)
        placeholder = weight_inputs[0] if weight_inputs else None
        training = torch.is_grad_enabled() and placeholder is not None and placeholder.requires_grad
        stats = self._stats
        stats.lookups += 1
        reserved = self._reservations[0] if self._reservations else None
        # whether the oldest prefetch was this batch's (else e.g. an evaluation lookup between a
        # training batch's prefetch and its lookup)
        prefetched = reserved is not None and torch.equal(reserved.rows, global_rows)
        if reserved is not None and prefetched and reserved.complete:
            # its prefetch admitted every row, and the slots of a batch in flight stay put: only the
            # touch is left, and the prefetch's hold becomes the lookup's (the same state as
            # admitting it again)
            self._reservations.popleft()
            self.index.tick += 1
            hold = reserved.hold
            if hold.tick != self.index.tick:  # (else the prefetch's touch was this lookup's: the same tick,
                self.index.touch_reserved(hold.slots, self.index.tick)  # and LFU counts each id's read once)
            if not training:  # not updated: nothing left to keep its rows for
                self.in_flight.drop(hold, updated=False)
            elif not reserved.training:  # prefetched for evaluation, looked up for training: updated after all
                self.index.mark_dirty(hold.slots)
        else:
            transfer, admission = self._admit(global_rows, self.index.tick + 1, best_effort=False, pin=training)
            self.index.tick += 1
            self.queue.run_now(transfer)
            if not prefetched:
                stats.requested_ids += global_rows.numel()
                stats.missed_ids += admission.missed_ids
            # (an evaluation lookup is over when it returns: nothing to hold)
            hold = self.in_flight.add(self.index.tick, admission.slots) if training else Hold(self.index.tick, admission.slots)
            # this batch's prefetch is superseded by the lookup's own admission; another batch's stays
            # reserved for its own lookup, unless this one trains (the prefetches no longer follow the
            # lookups: the oldest is dropped, as ever, so they cannot pile up)
            queued = bool(self._reservations) and self._reservations[0] is reserved  # (not given up since)
            if reserved is not None and (prefetched or training) and queued:
                self.in_flight.drop(self._reservations.popleft().hold, updated=False)
        slots = hold.slots
        local = slots if self._slot_shift is None else slots - self._shift(self._slot_shift, offsets, batch.batch_size, slots.numel())
        request = LookupBatch(local, offsets, batch.per_sample_weights, batch.batch_size, True, batch.singletons)
        if not training:
            with torch.no_grad():
                return self.inner.lookup(request, weight_inputs, lr)
        try:
            out: torch.Tensor = TieredLookupNode.apply(self, request, hold, lr, placeholder)
        except BaseException:
            self.in_flight.drop(hold, updated=False)  # no graph will end the hold
            raise
        return out

    # ---- prefetch ----------------------------------------------------------------------------------
    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        """Fetch the rows a later lookup of ``indices`` / ``offsets`` misses, and keep its rows in the
        cache until that lookup (as many as fit beside the rows in use).

        With the native bookkeeping (a CPU cache) the admission is one native call, on the training
        thread or, when a core is free for it (:meth:`_bookkeeping_on_worker`), on the worker thread
        with the copies, while the current batch trains; then the releases of the current batch's
        backward queue behind it (:meth:`_release`), so the decisions are the ones made on the
        training thread, in the same order.

        A prefetched batch's slots are given up again when a lookup of another batch needs the room
        (a prefetch never makes a lookup fail).

        Raises:
            EmbeddingIdError: an id outside its feature's table (checked as a lookup's ids are,
                before anything changes).
            ValueError: ``offsets`` of the wrong length for the kernel's features.
        """
        self.queue.check()
        checker = self._prefetch_checker
        batch = checker.check_shapes(indices, offsets, None)
        if not self.tiering.prefetch or indices.numel() == 0:
            return
        checker.check_values(indices, offsets, batch)
        # a copy: the caller may refill its id buffer while the worker reads this one
        global_rows = self._global_rows(indices, offsets.long(), batch).clone()
        tick = self.index.tick + 1
        training = torch.is_grad_enabled()  # (a prefetch for evaluation does not mark its rows dirty)
        if self._bookkeeping_on_worker():
            self.queue.submit_call(functools.partial(self._prefetch_now, global_rows, tick, training, True))
        else:
            self._prefetch_now(global_rows, tick, training, False)

    def _bookkeeping_on_worker(self) -> bool:
        """Whether the next prefetch's bookkeeping runs on the worker thread too (native CPU caches).

        Only when a core is left for it: torch runs fewer intra-op threads than this process may
        use. Then the whole prefetch overlaps the current batch's training. Otherwise the worker
        would take a core from those threads at every parallel region (measured on 2 cores with 2
        threads: slower than doing the bookkeeping here), so it runs on the training thread --
        a few hundred microseconds of native code -- and the worker moves only rows whose pages
        must come from the disk. The choice changes only while nothing is queued.
        """
        if not self.index.native:
            return False
        if not self.queue.busy:
            self._worker_bookkeeping = torch.get_num_threads() < _usable_cores()
        return self._worker_bookkeeping

    def _prefetch_now(self, global_rows: torch.Tensor, tick: int, training: bool, on_worker: bool) -> None:
        if self._evictions_queued and not on_worker:  # (a second prefetch before a lookup joined)
            self.queue.join()
        transfer, admission = self._admit(global_rows, tick, best_effort=True, pin=training)
        self._stats.requested_ids += global_rows.numel()
        self._stats.missed_ids += admission.missed_ids
        slots = admission.slots  # ids left out (-1): not cached, not held
        complete = not admission.missed_ids or bool((slots >= 0).all())
        hold = self.in_flight.add(tick, slots)
        self._reservations.append(_Reservation(global_rows, hold, complete, training))
        while len(self._reservations) > _MAX_RESERVATIONS:
            self.in_flight.drop(self._reservations.popleft().hold, updated=False)
        ahead = self._evictions_ahead(admission)
        if on_worker:
            self.queue.run_here(transfer)
            if ahead:
                self._evict_now(ahead, tick, self.in_flight.protect_from(tick), on_worker=True, queued=False)
            return
        if not self.queue.busy:  # (behind queued transfers, a part must queue too: they may share slots)
            transfer.parts = [p for p in transfer.parts if not self.queue.run_if_cached(p)]
        self.queue.submit(transfer)
        if ahead:
            protect = self.in_flight.protect_from(tick)
            if self.index.native:  # the scan and the write-backs on the worker, while this batch trains
                self._evictions_queued += 1
                self.queue.submit_call(functools.partial(self._evict_now, ahead, tick, protect, True, True))
            else:
                self._evict_now(ahead, tick, protect, on_worker=False, queued=False)

    # ---- evicting ahead of need -------------------------------------------------------------------
    def _evictions_ahead(self, admission: BatchAdmission) -> list[tuple[int, int]]:
        """``(table, k)``: the tables to evict ``k`` slots of right after a prefetch that admitted
        ``n`` of their rows -- those left with fewer than ``2 n`` free slots (what the next batches
        likely miss) whose eviction headroom is at least ``4 n`` -- and ``k``, that headroom (what an
        admission short of free slots would free).

        An eviction of the headroom (a scan of the table's slots) and the write-back of its dirty
        rows are the largest single costs of a big cache, paid once every ``headroom / n`` batches;
        freeing the slots right after a prefetch moves them off the next admission, onto the worker
        thread while the current batch trains (native CPU caches). Caches that evict at every batch
        anyway (a headroom below ``4 n``: small caches, many misses) are left to their admissions,
        which see the next batch's hits first. The decision depends only on the bookkeeping, so it
        is the same on every path."""
        out = []
        for t, adm in admission.parts:
            n, headroom = adm.rows.numel(), math.ceil(self.tiering.eviction_headroom * self.cache_rows[t])
            if self.index.free_slots(t) < 2 * n and headroom >= 4 * n:
                out.append((t, headroom))
        return out

    def _evict_now(self, tables: list[tuple[int, int]], tick: int, protect: int, on_worker: bool, queued: bool) -> None:
        try:
            self._evict_tables(tables, tick, protect, on_worker)
        finally:
            if queued:
                self._evictions_queued -= 1

    def _evict_tables(self, tables: list[tuple[int, int]], tick: int, protect: int, on_worker: bool) -> None:
        transfer, stats = Transfer(), self._stats
        for t, k in tables:
            evicted = self.index.evict(t, k, tick, protect)
            lo, written = self.index.cache_offset[t], evicted.victim_rows.numel()
            if written:
                empty = evicted.rows.cpu()
                transfer.parts.append(TablePart(t, evicted.victim_slots - lo, evicted.victim_rows.cpu(), empty, empty))
                stats.rows_written_back += written
                stats.bytes_written += written * self.store.row_bytes(t)
        if on_worker:
            self.queue.run_here(transfer)
        else:
            self.queue.submit(transfer)

    def release_hold(self, hold: Hold, updated: bool) -> None:
        """A lookup's backward ran (``updated``) or its graph was freed: its rows need not stay in
        the cache any longer. Behind the queued bookkeeping, if the worker runs some: all of it
        (the worker reads the holds), or an eviction (it reads the pins a pinned hold drops)."""
        if self.queue.on_worker():
            if not self._worker_bookkeeping:  # (a finalizer run by the worker's garbage collection)
                self.in_flight.drop_later(hold, updated)  # the training thread owns the holds: it drops it
                return
        elif self.queue.busy and (self._worker_bookkeeping or (hold.pinned and self._evictions_queued)):
            self.queue.submit_call(functools.partial(self.in_flight.drop, hold, updated))
            return
        self.in_flight.drop(hold, updated)

    # ---- keeping the store current -------------------------------------------------------------------
    def flush(self) -> None:
        """Write every dirty cached row back to the store (the rows stay cached, now clean).

        Raises:
            BaseException: a write-back failed: its rows stay dirty, and the table refuses to go on
                (``TransferFailedError``) until a load replaces its rows.
        """
        self.queue.join()
        transfer, written = Transfer(), []
        for t in range(len(self.rows)):
            slots, rows = self.index.dirty_rows(t)
            if rows.numel():
                empty = rows.new_empty(0)
                lo = self.index.cache_offset[t]
                transfer.parts.append(TablePart(t, slots - lo, rows.cpu(), empty.cpu(), empty))
                self._stats.rows_written_back += rows.numel()
                self._stats.bytes_written += rows.numel() * self.store.row_bytes(t)
                written.append(slots)
        self.queue.run_now(transfer)
        for slots in written:  # clean only once the store holds them (a failed write leaves them dirty)
            self._mark_clean(slots)

    def _mark_clean(self, slots: torch.Tensor) -> None:
        """``slots`` (global) now equal the store, except those a batch in flight will still update."""
        kept = self.index.kept(self.in_flight.protect_from(self.index.tick + 1), slots)  # (only theirs: O(slots))
        self.index.dirty.index_fill_(0, slots[~kept], False)

    def invalidate(self) -> None:
        """Forget every cached row without writing it back: the store was overwritten (a load).
        This also ends the refusal after a failed transfer (``TransferFailedError``)."""
        self.queue.reset()
        self.generation += 1  # first: a finalizer run while the state is cleared must see the new one
        self._reservations.clear()
        self.in_flight.clear()
        self.index.clear()

    # ---- row access ------------------------------------------------------------------------------------
    def _cached(self, table: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(positions in rows, cache-local slots)`` of the cached ones among ``rows``."""
        slots = self.index.slots(rows.to(self.device, torch.long) + self.index.row_offset[table])
        where = torch.nonzero(slots >= 0).flatten()
        return where, slots.index_select(0, where).long() - self.index.cache_offset[table]

    def read_rows(self, table: int, rows: torch.Tensor) -> RowState:
        self.queue.join()
        out = self.store.read(table, rows.cpu().long())
        where, slots = self._cached(table, rows)
        if where.numel():
            views, at = self._cache_views[table], where.cpu()
            out.weights.index_copy_(0, at, views["weight"].index_select(0, slots).cpu())
            for name in out.states:
                out.states[name].index_copy_(0, at, views[name].index_select(0, slots).cpu())
        return out

    def read_weights(self, table: int, rows: torch.Tensor) -> torch.Tensor:
        """``[N, D]`` current weights of ``table``'s local ``rows`` ``[N]``, on the cache's device: the
        cached ones from the cache (a dirty row is newer than the store's copy), the rest from the store.

        What the gradient of learned per-sample weights reads (``with_weight_grad``): a batch's rows
        stay cached until its backward, so they come from the cache, as its forward used them, and
        no store page is touched for them (unlike :meth:`read_rows`, which also copies row states).
        """
        self.queue.join()  # (the worker may be moving slots of other batches, and their bookkeeping)
        rows = rows.to(self.device, torch.long)
        slots = self.index.slots(rows + self.index.row_offset[table]).long()
        cached = slots >= 0
        local = torch.where(cached, slots - self.index.cache_offset[table], 0)
        out = self._cache_views[table]["weight"].index_select(0, local)
        missing = torch.nonzero(~cached).flatten()
        if missing.numel():  # (only after a cache was dropped since the forward: invalidate())
            stored = self.store.weights[table].index_select(0, rows.index_select(0, missing).cpu())
            out.index_copy_(0, missing, stored.to(out.device, out.dtype))
        return out

    def write_rows(self, table: int, rows: torch.Tensor, state: RowState) -> None:
        self.queue.join()
        unknown = sorted(set(state.states) - set(self.store.states[table]))
        if unknown:
            raise KeyError(
                f"write_rows: table {table} has no row state {unknown}; its row states are {sorted(self.store.states[table])}"
            )
        self.store.write(table, rows.cpu().long(), RowState(state.weights.cpu(), {k: v.cpu() for k, v in state.states.items()}))
        where, slots = self._cached(table, rows)
        if where.numel():  # the cached copy too; it now equals the store (clean)
            views, at = self._cache_views[table], where.to(self.device)
            with torch.no_grad():
                views["weight"].index_copy_(0, slots, state.weights.to(self.device).index_select(0, at).to(views["weight"].dtype))
                for name, values in state.states.items():
                    views[name].index_copy_(0, slots, values.to(self.device).index_select(0, at).to(views[name].dtype))
            self._mark_clean(slots + self.index.cache_offset[table])

    def reset_rows(self, table: int, rows: torch.Tensor, weights: torch.Tensor) -> None:
        fresh = {k: v.new_zeros((rows.numel(), *v.shape[1:])) for k, v in self.store.states[table].items()}
        self.write_rows(table, rows, RowState(weights, fresh))

    def reset_tables(self, resets: Sequence[tuple[int, torch.Tensor, torch.Tensor]]) -> None:
        for table, rows, weights in resets:
            self.reset_rows(table, rows, weights)

    # ---- what the monitor reads --------------------------------------------------------------------------
    def stats(self) -> TieredCacheStats:
        """A copy of the counters (see :class:`TieredCacheStats`)."""
        out = TieredCacheStats(**vars(self._stats))
        out.cached_rows = self.index.occupancy()
        return out

    def close(self) -> None:
        """Stop the worker thread (after its queued transfers)."""
        self.queue.close()


@dataclass
class _Reservation:
    """A prefetched batch awaiting its lookup: its ``[N]`` global rows, its hold, whether every id
    got a slot, and whether it was prefetched for training."""

    rows: torch.Tensor
    hold: Hold
    complete: bool
    training: bool  # prefetched with grad enabled: its slots were marked dirty
