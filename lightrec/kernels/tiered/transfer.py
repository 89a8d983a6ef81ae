"""Moving rows between a tiered kernel's cache and its backing store, on or off the training thread.

A :class:`Transfer` is what one fetch decided, per table: the dirty rows leaving the cache (read
from their slots, written to the store) and the rows entering it (read from the store, written
into their slots). Write-backs run first, since an evicted slot may be reused by a row fetched in
the same transfer. :class:`TransferQueue` runs transfers -- and, for CPU caches, the next batch's bookkeeping calls
(``submit_call``) -- in order on one worker thread (the file I/O and the page faults stay off the
training thread; torch's copies and the native ops release the GIL), and
:meth:`TransferQueue.join` is what a lookup, a flush or a checkpoint waits on first.

Why the slots may be written while a backward runs: the bookkeeping (``cache.py``) never
hands a transfer a slot that a batch in flight still uses (kept until its backward ran), so the
worker and the training thread touch disjoint rows of the cache tensors. The worker writes through aliases of
the cache storage with their own autograd version counters (:func:`unversioned`): a kernel that
saved its weights for backward (fbgemm's TBE does) would otherwise see "modified by an inplace
operation" although none of the rows it reads changed.

On CUDA the worker issues its copies on a side stream that first waits for the work queued on the
training stream when the transfer was submitted (the last updates of the rows it writes back), and
records an event the training stream waits on before the lookup reads the fetched rows.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from lightrec.kernels.tiered.cache import native_tiered_available
from lightrec.kernels.tiered.store import ADVISE_GAP_PAGES, PAGE_BYTES, RESIDENCY_SAMPLE, RowStore

# While an SSD store's pages are found in the page cache, one table part in this many looks them up
# again (run_if_cached): residency changes slowly, and each look-up costs a few system calls.
_PROBE_EVERY = 8

__all__ = ["TablePart", "Transfer", "TransferFailedError", "TransferQueue", "unversioned"]


class TransferFailedError(RuntimeError):
    """A transfer between a tiered table's cache and its store failed earlier (an I/O error on the
    worker thread): the cache no longer matches the store, so the table refuses to go on until a
    load replaces its rows (``load_state_dict``, which calls ``invalidate()``)."""


def unversioned(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor over ``tensor``'s memory (same offset, shape, strides) with its own version counter."""
    alias = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return alias.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())


@dataclass
class TablePart:
    """One table's share of a transfer.

    Attributes:
        table: the table.
        writeback_slots / writeback_rows: ``[v]`` slots (local to the table's cache) of dirty rows
            leaving the cache, and their table-local rows.
        fetch_rows / fetch_slots: ``[n]`` table-local rows entering the cache and their slots.
    """

    table: int
    writeback_slots: torch.Tensor
    writeback_rows: torch.Tensor
    fetch_rows: torch.Tensor
    fetch_slots: torch.Tensor
    announced: bool = False  # its SSD pages were announced already (TransferQueue.run_if_cached)


@dataclass
class Transfer:
    """The table parts of one fetch (see the module docstring)."""

    parts: list[TablePart] = field(default_factory=list)
    ready: torch.cuda.Event | None = None  # CUDA: the training stream's work the transfer follows

    def __bool__(self) -> bool:
        return any(p.writeback_rows.numel() or p.fetch_rows.numel() for p in self.parts)


class TransferQueue:
    """Runs transfers between ``cache_views`` (per table ``{"weight": [C, D], state: ...}``) and
    ``store``, in submission order, on a worker thread (see the module docstring).

    Args:
        store: the backing store.
        cache_views: per table, unversioned aliases of the cache kernel's weights and row states.
        device: the cache's device.
    """

    def __init__(self, store: RowStore, cache_views: list[dict[str, torch.Tensor]], device: torch.device) -> None:
        self.store, self.cache_views, self.device = store, cache_views, device
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future[torch.cuda.Event | None]] = []
        self._worker_ident: int | None = None
        self._stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        # per table, what one native call (tiered_transfer) needs -- the cache's and the store's
        # tensors in one order, and the store's file behind each -- or None: the torch copies serve it
        self._native_parts = [self._native_part(t) for t in range(len(cache_views))]
        # per table, its parts moved before its pages are looked up in the page cache again (run_if_cached)
        self._probe_in = [0] * len(cache_views)
        self.failure: BaseException | None = None  # the worker's error that broke the cache (join)

    def _native_part(self, table: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]] | None:
        if not native_tiered_available(self.device):
            return None
        names = list(self.store.tensors(table))
        cache = [self.cache_views[table][n] for n in names]
        store = [self.store.tensors(table)[n] for n in names]
        return (cache, store, self.store.files(table)) if _native_copies(cache, store) else None

    # ---- running transfers and bookkeeping calls, on the worker or here ----------------------
    def submit(self, transfer: Transfer) -> None:
        """Run ``transfer`` on the worker thread after the ones already submitted."""
        if not transfer:
            return
        if self._stream is not None:
            transfer.ready = torch.cuda.Event()
            transfer.ready.record(torch.cuda.current_stream(self.device))
        self._pending.append(self._worker().submit(self._run, transfer))

    def submit_call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the worker thread after everything already submitted (CPU caches: the
        next batch's bookkeeping, and the releases that must follow it)."""
        self._pending.append(self._worker().submit(fn))

    def _worker(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="lightrec-tiered-io", initializer=self._remember_worker
            )
        return self._executor

    def _remember_worker(self) -> None:
        self._worker_ident = threading.get_ident()

    def on_worker(self) -> bool:
        """Whether the calling thread is the worker (e.g. a finalizer run by its garbage collection)."""
        return threading.get_ident() == self._worker_ident

    def run_if_cached(self, part: TablePart) -> bool:
        """Move one table part on this thread now if its rows are in memory (one native call:
        write-backs, then fetches); False when it cannot (no native ops; or an SSD store whose pages
        are not in the page cache: they were announced, and the caller submits the part to the
        worker rather than wait for the disk here).

        A table's pages are looked up in the page cache (a few ``mincore`` calls) on one of its parts
        in ``_PROBE_EVERY`` while they are found cached, and on every part while they are not.
        """
        native = self._native_parts[part.table]
        if native is None:
            return False
        t = part.table
        sample = RESIDENCY_SAMPLE if self._probe_in[t] <= 0 else 0
        with self._failure_breaks_cache():
            done: bool = torch.ops.lightrec_tiered.tiered_transfer(
                *native, part.writeback_slots, part.writeback_rows, part.fetch_rows, part.fetch_slots, PAGE_BYTES,
                ADVISE_GAP_PAGES, sample, True,
            )  # fmt: skip
        self._probe_in[t] = 0 if not done else (_PROBE_EVERY if sample else self._probe_in[t] - 1)
        part.announced = not done
        return done

    def run_here(self, transfer: Transfer) -> None:
        """Run ``transfer`` on the calling thread now, whatever is queued (the worker's own calls)."""
        if transfer:
            self._run(transfer, same_stream=True)

    def run_now(self, transfer: Transfer) -> None:
        """Run ``transfer`` on this thread (after every submitted one).

        Raises:
            BaseException: the copy's error; the table is broken from then on, as after a failure on
                the worker (:meth:`join`): the bookkeeping already moved rows the copy did not.
            TransferFailedError: a transfer failed earlier.
        """
        self.join()
        if transfer:
            with self._failure_breaks_cache():
                self._run(transfer, same_stream=True)

    @contextlib.contextmanager
    def _failure_breaks_cache(self) -> Iterator[None]:
        """Record an error of a copy run on the training thread as :meth:`join` records the worker's:
        the cache's bookkeeping already says the rows moved (slots reassigned, victims gone), so every
        later call must refuse (:meth:`check`) until a load, wherever the copy ran."""
        try:
            yield
        except BaseException as err:
            self.failure = err
            raise

    def join(self) -> None:
        """Wait for every submitted transfer (CUDA: the training stream then waits for their copies).

        Raises:
            BaseException: the worker's error, the first time; nothing queued after it runs.
            TransferFailedError: at every later call, until :meth:`reset` (a load replaced the rows).
        """
        self.check()
        # ``_pending`` empties only as its futures finish: a release queued while this thread waits
        # (a finalizer run by garbage collection inside ``result()``) sees ``busy`` and queues behind
        # the worker instead of updating the pins beside it -- and is waited for here too.
        while self._pending:
            future = self._pending[0]
            try:
                done = future.result()
            except BaseException as err:
                rest, self._pending = self._pending[1:], []
                for queued in rest:  # (not started: the single worker was running the failed one)
                    queued.cancel()
                concurrent.futures.wait(rest)
                self.failure = err
                raise
            if self._pending and self._pending[0] is future:
                self._pending.pop(0)
            if done is not None:
                torch.cuda.current_stream(self.device).wait_event(done)

    def check(self) -> None:
        """Raise :class:`TransferFailedError` if a transfer failed earlier (see :meth:`join`)."""
        if self.failure is not None:
            raise TransferFailedError(
                f"a transfer between this tiered table's cache and its store failed earlier "
                f"({type(self.failure).__name__}: {self.failure}); the cache no longer matches the store, so the "
                "table refuses to go on: load a checkpoint into it (load_state_dict) to continue"
            ) from self.failure

    def reset(self) -> None:
        """Forget a failure: the store's rows were replaced and the cache dropped (a load)."""
        if self.failure is None:
            self.join()
        self.failure, self._pending = None, []

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._pending = []

    # ---- the work ------------------------------------------------------------------------------
    def _run(self, transfer: Transfer, same_stream: bool = False) -> torch.cuda.Event | None:
        store = self.store
        for part in transfer.parts:  # every page this transfer touches, read in parallel first
            if not part.announced:
                store.advise(part.table, torch.cat([part.writeback_rows, part.fetch_rows]))
        stream = None if same_stream else self._stream
        if stream is not None and transfer.ready is not None:
            stream.wait_event(transfer.ready)
        with torch.no_grad(), _on(stream):
            for part in transfer.parts:
                native = self._native_parts[part.table]
                if native is not None:  # one call: write-backs, then fetches (pages announced above)
                    torch.ops.lightrec_tiered.tiered_transfer(
                        *native, part.writeback_slots, part.writeback_rows, part.fetch_rows, part.fetch_slots, PAGE_BYTES,
                        ADVISE_GAP_PAGES, 0, False,
                    )  # fmt: skip
                    continue
                views, rows = self.cache_views[part.table], store.tensors(part.table)
                if part.writeback_rows.numel():
                    _copy_rows(views, part.writeback_slots, rows, part.writeback_rows)
                if part.fetch_rows.numel():
                    _copy_rows(rows, part.fetch_rows, views, part.fetch_slots)
            if stream is None:
                return None
            done = torch.cuda.Event()
            done.record(stream)
            return done


def _native_copies(sources: list[torch.Tensor], targets: list[torch.Tensor]) -> bool:
    """Whether the native copy takes these tensor pairs: CPU rows of one dtype, 1-D or with unit column stride."""
    return all(
        a.device.type == b.device.type == "cpu" and a.dtype == b.dtype and a.dim() == b.dim() <= 2
        and (a.dim() == 1 or a.stride(1) == b.stride(1) == 1)
        for a, b in zip(sources, targets, strict=True)
    )  # fmt: skip


def _copy_rows(src: dict[str, torch.Tensor], src_rows: torch.Tensor, dst: dict[str, torch.Tensor], dst_rows: torch.Tensor) -> None:
    """``dst[name][dst_rows] = src[name][src_rows]`` for every tensor ``name`` of ``dst``, by torch ops:
    a gather into a temporary and a scatter (host -> GPU without blocking the worker; the side stream
    orders it). Native CPU stores take one ``tiered_transfer`` call instead (``TransferQueue._run``)."""
    names = list(dst)
    sources, targets = [src[n] for n in names], [dst[n] for n in names]
    for a, b in zip(sources, targets, strict=True):
        values = a.index_select(0, src_rows.to(a.device))
        # host -> GPU may run asynchronously (the side stream orders it); GPU -> host must be done
        # before the store's copy reads it
        values = values.to(b.device, b.dtype, non_blocking=b.device.type == "cuda")
        b.index_copy_(0, dst_rows.to(b.device), values)


def _on(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager[object]:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
