"""The backing tier of a tiered table: every row and its optimizer state, in host memory or on SSD.

One :class:`RowStore` holds the tables of one tiered kernel, one CPU tensor per (table, tensor)::

    table t    weights  [R_t, D_t]        the split view ``split_embedding_weights()[t]``
               momentum1 [R_t] | [R_t, D_t]   (the fused optimizer's per-row state, same dtypes as
               momentum2 [R_t, D_t]            the cache kernel's)

``HostMemoryStore`` allocates them in host memory (pinned when the cache is on a GPU, so fetches and
write-backs are asynchronous copies). ``SsdRowStore`` gives each tensor its own *direct row file*
under the storage directory -- row ``r`` at byte ``r * row_bytes``, no index, no hashing, no
compaction -- memory-mapped and used as a tensor:

* the file never has a name on disk for longer than a system call (created with ``O_TMPFILE``, or
  unlinked right after ``mkstemp``), then preallocated (``posix_fallocate``: a full disk fails here,
  with the numbers, not in the middle of training) and mapped: the space returns to the filesystem
  when the process ends, kill -9 included, at any point. It is a working store, never a checkpoint;
* the mapping is advised ``MADV_RANDOM`` (a miss reads its own page, not a 128 KiB read-around:
  measured 0.1k -> 19k rows/s on this machine's disk under a 1 GiB memory cgroup), and the pages of
  a batch's misses are first announced with ``POSIX_FADV_WILLNEED`` so the disk reads them in
  parallel (19k -> 55k rows/s); streaming passes (checkpoints) switch to ``MADV_SEQUENTIAL``;
* pages are the kernel's page cache: reclaimable, so a table many times the memory limit trains
  inside it (``docs/tiered-tables.md`` has the measurements, and why a direct row file rather than
  a key-value store: ``benchmarks/bench_tiered.py --stores``).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from typing import TypeAlias

import numpy as np
import torch
from typing_extensions import Unpack

from lightrec.kernels.kernel_interface import RowState
from lightrec.kernels.tiered.cache import native_tiered_available

__all__ = ["HostMemoryStore", "RowStore", "SsdRowStore", "TieredStorageError", "scratch_like", "sequential_access"]

PAGE_BYTES = mmap.PAGESIZE
# Pages with this few pages between them are announced as one range: a few unneeded pages read ahead cost the SSD
# less than a system call (and a trip through the GIL) per page costs the training thread.
ADVISE_GAP_PAGES = 4
# Pages of a batch looked up (mincore) before announcing them: when nearly all are cached (a table
# that fits in the page cache) the announcements are skipped.
RESIDENCY_SAMPLE = 32
# Stores by the data pointer of each of their tensors (checkpoint code finds a tensor's store).
_STORES: dict[int, weakref.ref[RowStore]] = {}


class TieredStorageError(OSError):
    """The backing tier cannot be created or written: an unwritable directory, a full disk."""


class RowStore:
    """Rows and per-row optimizer state of a group of tables in CPU tensors (see the module docstring).

    Args:
        rows, dims: ``[T]`` shape of each table.
        dtype: the weights' dtype.
        states: per table ``{state name: (per-row shape tail, dtype)}``: ``()`` for ``[R]`` states,
            ``(D,)`` for ``[R, D]`` ones.
        names: ``[T]`` table names (file names, messages).
    """

    def __init__(
        self,
        rows: Sequence[int],
        dims: Sequence[int],
        dtype: torch.dtype,
        states: Sequence[dict[str, tuple[tuple[int, ...], torch.dtype]]],
        names: Sequence[str],
    ) -> None:
        self.rows, self.dims, self.names = list(rows), list(dims), list(names)
        item = torch.empty(0, dtype=dtype).element_size()
        self._row_bytes = [
            d * item + sum(int(np.prod(tail, dtype=np.int64)) * torch.empty(0, dtype=dt).element_size()
                           for tail, dt in states[t].values())
            for t, d in enumerate(self.dims)
        ]  # fmt: skip
        needed = sum(r * b for r, b in zip(self.rows, self._row_bytes, strict=True))
        self.nbytes = needed
        self._prepare(needed)
        self.weights: list[torch.Tensor] = []
        self.states: list[dict[str, torch.Tensor]] = []
        self._fds: list[int] = []
        self._maps: list[mmap.mmap] = []
        for t, (r, d) in enumerate(zip(self.rows, self.dims, strict=True)):
            self.weights.append(self._allocate(f"{self.names[t]}.weight", (r, d), dtype))
            self.states.append(
                {name: self._allocate(f"{self.names[t]}.{name}", (r, *tail), dt) for name, (tail, dt) in states[t].items()}
            )
        ref = weakref.ref(self)
        for t in range(len(self.rows)):
            for tensor in (self.weights[t], *self.states[t].values()):
                if tensor.numel():
                    _STORES[tensor.untyped_storage().data_ptr()] = ref
        weakref.finalize(self, _forget, [k for k, v in _STORES.items() if v is ref])

    kind = "host"

    def _prepare(self, needed: int) -> None:  # noqa: B027 - host memory needs no preparation
        """Called with the bytes every tensor takes together, before any is allocated."""

    def _allocate(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype)

    def row_bytes(self, table: int) -> int:
        """Bytes one row of ``table`` takes in the store (weights and optimizer state)."""
        return self._row_bytes[table]

    def tensors(self, table: int) -> dict[str, torch.Tensor]:
        """``{"weight": ..., <state>: ...}`` of ``table``."""
        return {"weight": self.weights[table], **self.states[table]}

    def read(self, table: int, rows: torch.Tensor) -> RowState:
        """Copies of ``rows`` (``[n]`` int64 CPU) of ``table`` and their optimizer state."""
        return RowState(
            self.weights[table].index_select(0, rows),
            {k: v.index_select(0, rows) for k, v in self.states[table].items()},
        )

    def write(self, table: int, rows: torch.Tensor, state: RowState) -> None:
        """Overwrite ``rows`` of ``table`` (and the states ``state`` names)."""
        with torch.no_grad():
            self.weights[table].index_copy_(0, rows, state.weights.to(self.weights[table].dtype))
            for name, values in state.states.items():
                target = self.states[table][name]
                target.index_copy_(0, rows, values.to(target.dtype))

    def advise(self, table: int, rows: torch.Tensor) -> None:  # noqa: B027 - nothing to announce in memory
        """Announce that ``rows`` of ``table`` will be read or written soon (SSD: start the reads)."""

    def files(self, table: int) -> list[int]:
        """The file descriptor behind each of ``tensors(table)``, in its order (-1: host memory)."""
        return [-1] * len(self.tensors(table))

    @contextlib.contextmanager
    def sequential(self) -> Iterator[None]:
        """Streaming access (whole tables in order) inside the block."""
        yield


#: ``RowStore``'s positional arguments (rows, dims, dtype, states, names), which the stores forward.
StoreLayout: TypeAlias = tuple[
    Sequence[int], Sequence[int], torch.dtype, Sequence[dict[str, tuple[tuple[int, ...], torch.dtype]]], Sequence[str]
]


class HostMemoryStore(RowStore):
    """The rows in host memory (``fused_uvm_caching``), pinned when ``pin`` (a cache on a GPU)."""

    def __init__(self, *layout: Unpack[StoreLayout], pin: bool = False) -> None:
        self._pin = pin
        super().__init__(*layout)

    def _allocate(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, pin_memory=self._pin)


class SsdRowStore(RowStore):
    """The rows in direct row files under ``directory`` (``key_value``; see the module docstring).

    Raises:
        TieredStorageError: the directory cannot be created or written, its filesystem has too
            little free space for every row and its state (checked before anything is written), or
            a row file cannot be memory-mapped. The folders the call created are removed again.
    """

    kind = "ssd"

    def __init__(self, *layout: Unpack[StoreLayout], directory: str) -> None:
        self.directory = directory
        self._fd_by_ptr: dict[int, int] = {}
        # per table, advise()'s native call's files (fds, addresses, row strides); None: no native ops
        self._native_advise: dict[int, tuple[list[int], list[int], list[int]] | None] = {}
        self._created_dirs: list[str] = []  # folders this call made (deepest first): removed if it fails
        try:
            super().__init__(*layout)
        except BaseException:
            self._undo()
            raise
        self._created_dirs = []

    def _undo(self) -> None:
        """After a failed construction: close the row files made so far (they have no name, so their
        space returns with the last mapping) and remove the folders this call created, if empty."""
        for fd in self._fds if hasattr(self, "_fds") else []:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        for folder in self._created_dirs:
            with contextlib.suppress(OSError):  # not empty (another process wrote there) or gone: keep it
                os.rmdir(folder)
        self._created_dirs = []

    def _prepare(self, needed: int) -> None:
        """Check the directory and its free space before any file is created."""
        directory = self.directory
        self._created_dirs = _missing_dirs(directory)
        try:
            os.makedirs(directory, exist_ok=True)
            probe_fd, probe = tempfile.mkstemp(prefix=".lightrec-probe-", dir=directory)
            os.unlink(probe)  # (first: the name is gone before anything else can be interrupted)
            os.close(probe_fd)
        except OSError as exc:
            raise TieredStorageError(
                exc.errno,
                f"ssd_storage_directory {directory!r} cannot hold the tables' row files ({exc.strerror}); "
                "choose a directory on a local disk that this process can write",
            ) from exc
        free = shutil.disk_usage(directory).free
        if needed > free:
            raise TieredStorageError(errno.ENOSPC, _no_space(directory, needed, free))
        self._needed = needed

    def _allocate(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        if nbytes == 0:
            return torch.zeros(shape, dtype=dtype)
        tensor, fd, mapping = _mapped_file(self.directory, f"lightrec-{name}-", nbytes, self._needed)
        self._fds.append(fd)
        self._maps.append(mapping)
        self._fd_by_ptr[tensor.untyped_storage().data_ptr()] = fd
        return tensor.view(dtype).view(shape)

    def advise(self, table: int, rows: torch.Tensor) -> None:
        """``POSIX_FADV_WILLNEED`` the pages holding ``rows`` in every file of ``table``: the disk
        reads them in parallel, so the gather that follows finds them in the page cache."""
        if rows.numel() == 0:
            return
        if table not in self._native_advise:  # decided once per table: its files and mappings do not change
            files = [(fd, t) for t in self.tensors(table).values() if (fd := self._fd_of(t)) is not None]
            self._native_advise[table] = (
                ([fd for fd, _ in files], [t.data_ptr() for _, t in files], [_row_stride(t) for _, t in files])
                if native_tiered_available(torch.device("cpu"))
                else None
            )
        plan = self._native_advise[table]
        if plan is not None:
            # one call without the GIL, which also skips a file whose pages are mostly cached already
            # (a sample looked up with mincore): announcing cached pages costs a system call per range
            torch.ops.lightrec_tiered.tiered_advise(
                *plan, rows.long().contiguous(), PAGE_BYTES, ADVISE_GAP_PAGES, RESIDENCY_SAMPLE
            )
            return
        row_ids = rows.numpy()
        for tensor in self.tensors(table).values():
            fd = self._fd_of(tensor)
            if fd is None:
                continue
            first, count = page_ranges(row_ids * _row_stride(tensor) // PAGE_BYTES, ADVISE_GAP_PAGES)
            for page, n in zip(first.tolist(), count.tolist()):
                os.posix_fadvise(fd, page * PAGE_BYTES, n * PAGE_BYTES, os.POSIX_FADV_WILLNEED)

    def files(self, table: int) -> list[int]:
        """The file descriptor behind each of ``tensors(table)``, in its order (-1: none, an empty tensor)."""
        return [-1 if (fd := self._fd_of(t)) is None else fd for t in self.tensors(table).values()]

    def _fd_of(self, tensor: torch.Tensor) -> int | None:
        return self._fd_by_ptr.get(tensor.untyped_storage().data_ptr()) if tensor.numel() else None

    @contextlib.contextmanager
    def sequential(self) -> Iterator[None]:
        """``MADV_SEQUENTIAL`` (aggressive read-ahead) inside the block, ``MADV_RANDOM`` after."""
        for mapping in self._maps:
            mapping.madvise(mmap.MADV_SEQUENTIAL)
        try:
            yield
        finally:
            for mapping in self._maps:
                mapping.madvise(mmap.MADV_RANDOM)

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", []):
            with contextlib.suppress(OSError):
                os.close(fd)


def _row_stride(tensor: torch.Tensor) -> int:
    """Bytes from one row of a store tensor to the next."""
    return tensor[0].numel() * tensor.element_size() if tensor.dim() > 1 else tensor.element_size()


def page_ranges(pages: np.ndarray, gap: int) -> tuple[np.ndarray, np.ndarray]:
    """``(first page [K], page count [K])`` of ranges covering every page in ``pages`` (any order,
    repeats allowed); two pages with at most ``gap`` pages between them share a range, which then also
    covers those pages."""
    pages = np.unique(pages)
    if pages.size == 0:
        return pages, pages
    breaks = np.flatnonzero(np.diff(pages) > gap + 1) + 1
    first = pages[np.concatenate([[0], breaks])]
    last = pages[np.concatenate([breaks - 1, [pages.size - 1]])]
    return first, last - first + 1


def _no_space(directory: str, needed: int, free: int) -> str:
    return (
        f"ssd_storage_directory {directory!r} has {free / 2**30:.2f} GiB free but the tables' row files need "
        f"{needed / 2**30:.2f} GiB (every row and its optimizer state); free space, choose another directory "
        "or give the tables fewer rows"
    )


def _mapped_file(directory: str, prefix: str, nbytes: int, needed: int) -> tuple[torch.Tensor, int, mmap.mmap]:
    """An unlinked, preallocated file of ``nbytes`` in ``directory``, mapped shared: ``(uint8 tensor
    over the mapping, file descriptor, mapping)``."""
    fd = _unnamed_file(directory, prefix)
    try:
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                free = shutil.disk_usage(directory).free
                raise TieredStorageError(exc.errno, _no_space(directory, needed, free)) from exc
            raise TieredStorageError(
                exc.errno, f"cannot preallocate {nbytes} bytes for row files in {directory!r}: {exc.strerror}"
            ) from exc
        try:
            mapping = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            raise TieredStorageError(
                exc.errno,
                f"cannot memory-map a {nbytes}-byte row file in ssd_storage_directory {directory!r} ({exc.strerror}); "
                "choose a directory on a local disk whose file system supports shared memory maps (not a network "
                "or FUSE mount), or, with many large tables, raise the limit on mappings (sysctl vm.max_map_count) "
                "or the address space (ulimit -v)",
            ) from exc
        mapping.madvise(mmap.MADV_RANDOM)
    except BaseException:
        os.close(fd)
        raise
    return torch.frombuffer(mapping, dtype=torch.uint8), fd, mapping


def _missing_dirs(directory: str) -> list[str]:
    """The folders ``os.makedirs(directory)`` would create, deepest first."""
    missing = []
    path = os.path.abspath(directory)
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _unnamed_file(directory: str, prefix: str) -> int:
    """A read-write descriptor of a new file in ``directory`` that has no name there: its blocks are
    freed when the last descriptor or mapping of it goes, however the process ends (even SIGKILL).

    ``O_TMPFILE`` creates it nameless (Linux, on file systems that support it); elsewhere the name
    ``mkstemp`` gives is removed at once, before anything slow (the preallocation) can be interrupted.
    """
    tmpfile = getattr(os, "O_TMPFILE", 0)  # (Linux only)
    if tmpfile:
        try:
            return os.open(directory, tmpfile | os.O_RDWR, 0o600)
        except OSError as exc:  # not supported by this file system / kernel: fall back to a name
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".rows", dir=directory)
    try:
        os.unlink(path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _forget(keys: list[int]) -> None:
    for key in keys:
        _STORES.pop(key, None)


def store_of(tensor: torch.Tensor) -> RowStore | None:
    """The store a tensor belongs to (its storage is one of a store's tensors), or None."""
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return None
    ref = _STORES.get(tensor.untyped_storage().data_ptr())
    return ref() if ref is not None else None


def scratch_like(tensor: torch.Tensor, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor | None:
    """A zeroed, file-backed ``shape`` tensor next to the SSD store ``tensor`` belongs to, or None.

    What a checkpoint load assembles a reshaped block of an SSD-backed table into, so the block is
    page cache (reclaimable), never process memory. The file is unlinked at once.
    """
    store = store_of(tensor)
    if not isinstance(store, SsdRowStore):
        return None
    nbytes = int(np.prod(list(shape), dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(list(shape), dtype=dtype)
    free = shutil.disk_usage(store.directory).free
    if nbytes > free:
        raise TieredStorageError(errno.ENOSPC, _no_space(store.directory, nbytes, free))
    raw, fd, mapping = _mapped_file(store.directory, "lightrec-scratch-", nbytes, nbytes)
    os.close(fd)  # the mapping keeps the pages; the tensor keeps the mapping (its buffer export)
    mapping.madvise(mmap.MADV_SEQUENTIAL)
    return raw.view(dtype).view(list(shape))


@contextlib.contextmanager
def sequential_access(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Streaming access to the stores ``tensors`` belong to, inside the block (a checkpoint pass)."""
    stores = {id(s): s for s in (store_of(t) for t in tensors) if s is not None}
    with contextlib.ExitStack() as stack:
        for store in stores.values():
            stack.enter_context(store.sequential())
        yield
