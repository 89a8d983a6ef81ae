"""The intra-host transport: all-to-all exchanges of CPU tensors through shared memory.

On one host, gloo moves a rank's bytes to its peer over TCP loopback: measured 6.8-8.1 ms (and a
transport thread's CPU) for the 6.8 MB of a pooled-embedding exchange, against 2.3-2.5 ms for the
same bytes through shared memory -- one copy in by the sender, one copy out by the receiver and one
tiny signal. The sharded collections' exchanges (KJT input dist, pooled output dist forward and
backward) take this path when every rank of the process group runs on this host and the tensors
are on the CPU; otherwise, gloo as before. Results are the same bytes either way.

Layout, per rank (``shm_segments.py`` makes the files and keeps them from outliving the job)::

    control segment (fixed)       failed[3]       int64: (exchange, bytes, errno) of a failed grow; 0: none
                                  seq[K]          int32: the exchange last published in slot k
                                  ack[W][K]       int32: the exchange of writer w slot k this rank has read
                                  meta[K][3+2W]   int64: slot k's data generation, total, check, (offset, bytes) per dest
    data segment (generation g)   the arena the rank writes its outgoing chunks into

Exchange ``n`` (numbered in the order ranks start them, which the process group's collective
order already makes identical on every rank) uses slot ``n % K``. The writer allocates its chunks
in its arena, copies them in, and release-stores ``seq[k] = n`` (waking any reader); a reader waits
for ``seq[k]`` of each source to reach ``n`` (futex: no spinning on a core its peer needs), copies
its chunk out, and stores ``ack[src][k] = n`` in its own control segment. An arena range is
reused once every peer acked its exchange; an arena too small for an exchange is replaced by a
larger generation (a new segment that peers map when they first see it; the last one to map it
unlinks the name), never waited for -- waiting could deadlock against a rank blocked elsewhere.
A rank whose new generation does not fit (``/dev/shm`` full, the folder gone) raises
:class:`~lightrec.distributed.comm.ShmSpaceError`, records the failure in its control segment and
publishes the exchange as failed (data generation -1): the peers reading that exchange raise a
ShmSpaceError naming the rank at once, and a rank waiting for any other word of the transport
notices the record within a second (it looks at the records only when a wait runs past a second,
so the exchanges pay nothing for it). The transport cannot go on after that, on any rank.

A peer that dies mid-exchange is noticed within a second by the ranks waiting for it
(:class:`ShmPeerError`, a ``CollectiveError``, names it); the process group's timeout bounds a wait
for a live but stuck peer, as it bounds gloo's (``LIGHTREC_SHM_TIMEOUT``, seconds, overrides it).
What a rank that ends without its exit hook (SIGKILL, a plain SIGTERM) can leave in ``/dev/shm``,
and the next start-up's sweep that removes it: ``shm_segments.py``.
"""

from __future__ import annotations

import errno
import itertools
import multiprocessing.util
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from lightrec import _switches
from lightrec._native import native_ops
from lightrec.distributed.comm.failures import ShmMismatchError, ShmPeerError, timeout_of
from lightrec.distributed.comm.shm_segments import SHM_DIR, ShmSegment, ShmSpaceError, sweep_stale_segments

__all__ = ["ShmExchange", "ShmMismatchError", "ShmPeerError", "ShmTransport", "shm_transport"]

_SLOTS = 64
_ALIGN = 64
_HEADER = 64  # bytes at the start of a data segment: word 0 counts the ranks that mapped it
_MAGIC = 0x4C524543  # "LREC"
_INITIAL_ARENA = 16 << 20
_TIMED_OUT = -(1 << 39)  # shm_wait's return below this: the wait timed out
_EXIT_GRACE = 2.0  # seconds a rank at exit waits for its peers to read its last exchanges
_META = 3  # words of a slot's meta before its (offset, bytes) per dest: generation, total, check


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie -- killed, not yet reaped by its launcher -- does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :][:1] not in ("Z", "X")


@dataclass
class _Control:
    """One rank's control segment, as int32 / int64 views."""

    segment: ShmSegment
    failed: torch.Tensor  # [3] int64: (exchange, bytes, errno) of a grow that failed; all 0: none
    seq: torch.Tensor  # [K] int32
    ack: torch.Tensor  # [W * K] int32, ack[w * K + k]
    meta: torch.Tensor  # [K, 2 + 2W] int64

    @classmethod
    def layout_bytes(cls, world: int) -> int:
        return 64 + 4 * _SLOTS * (1 + world) + 8 * _SLOTS * (_META + 2 * world) + 64

    @classmethod
    def over(cls, segment: ShmSegment, world: int) -> _Control:
        seq_at = 64
        ack_at = seq_at + 4 * _SLOTS
        meta_at = -(-(ack_at + 4 * _SLOTS * world) // 64) * 64
        return cls(
            segment,
            segment.words(torch.int64, 8, 3),  # the header: int32 word 0 is the magic
            segment.words(torch.int32, seq_at, _SLOTS),
            segment.words(torch.int32, ack_at, _SLOTS * world),
            segment.words(torch.int64, meta_at, _SLOTS * (_META + 2 * world)).view(_SLOTS, _META + 2 * world),
        )


@dataclass
class _Arena:
    """One generation of a rank's data segment, with the ranges still waiting for acks."""

    gen: int
    segment: ShmSegment
    live: list[tuple[int, int, int]] = field(default_factory=list)  # (seq, start, end)


class ShmTransport:
    """Shared-memory all-to-all among the ranks of ``group`` (all on this host); see the module docstring.

    Build it with :func:`shm_transport`, which runs the start-up handshake (collective) and returns
    None where the transport cannot serve the group.
    """

    def __init__(self, group: dist.ProcessGroup | None, rank: int, world: int, peers: list[dict]) -> None:
        self.group, self.rank, self.world = group, rank, world
        self._pids = [int(p["pid"]) for p in peers]
        self._tag = peers[rank]["tag"]
        self._next = 1
        self._control: list[_Control] = []
        self._arenas: list[_Arena] = []  # this rank's generations, newest last
        self._peer_data: dict[tuple[int, int], ShmSegment] = {}  # (rank, gen) -> mapped segment
        self._peer_names = {(r, 0): p["data"] for r, p in enumerate(peers)}
        # The process group's timeout bounds a wait, as it bounds gloo's (LIGHTREC_SHM_TIMEOUT overrides).
        pg_timeout = timeout_of(group)
        default = pg_timeout.total_seconds() if pg_timeout is not None else 1800.0
        self._timeout = _switches.SHM_TIMEOUT.read() or default
        self._lock = threading.Lock()
        self._ops = torch.ops.lightrec_shm
        self._failed: ShmSpaceError | None = None  # this rank's grow failed: the transport is done

    # ---- start-up --------------------------------------------------------------------------
    def _attach(self, peers: list[dict], own_control: ShmSegment, own_data: ShmSegment) -> None:
        for r, p in enumerate(peers):
            seg = own_control if r == self.rank else ShmSegment.open(p["control"])
            self._control.append(_Control.over(seg, self.world))
        self._arenas.append(_Arena(0, own_data))
        for r, p in enumerate(peers):
            if r != self.rank:
                self._peer_data[(r, 0)] = ShmSegment.open(p["data"])

    # ---- exchanges ---------------------------------------------------------------------------
    def start(self, send_bytes: list[int], check: int = 0) -> ShmExchange:
        """Begin the next exchange: ``send_bytes[d]`` bytes to each peer ``d`` (0 for this rank).

        ``check``: an int64 that every rank computes from what it believes the exchange's geometry is
        (e.g. a checksum of the widths and batch sizes); a reader whose check differs from its
        source's raises :class:`ShmMismatchError` in :meth:`ShmExchange.recv_view` (one word written
        here and one read per received chunk: no extra exchange).

        Raises:
            ShmSpaceError: this rank's send buffer had to grow and ``/dev/shm`` cannot hold it (the
                peers raise too, see the module docstring), or it failed so before.
        """
        if self._failed is not None:  # the transport cannot go on (module docstring)
            raise ShmSpaceError(str(self._failed))
        with self._lock:
            seq = self._next
            self._next = (self._next + 1) & 0x7FFFFFFF or 1
        slot = seq % _SLOTS
        self._wait_slot_free(seq, slot)
        sizes = [0 if d == self.rank else int(n) for d, n in enumerate(send_bytes)]
        padded = [-(-n // _ALIGN) * _ALIGN for n in sizes]
        arena, base = self._allocate(seq, sum(padded))
        offsets, at = [], base
        for n in padded:
            offsets.append(at)
            at += n
        fields = [arena.gen, sum(padded), int(check)]
        for d in range(self.world):
            fields += [offsets[d], sizes[d]]
        self._control[self.rank].meta[slot].copy_(torch.tensor(fields, dtype=torch.int64))
        return ShmExchange(self, seq, slot, arena.segment, offsets, sizes, int(check))

    def _wait_slot_free(self, seq: int, slot: int) -> None:
        """Slot ``seq % K`` last carried exchange ``seq - K``: every peer must have read it."""
        previous = seq - _SLOTS
        if previous <= 0:
            return
        for r in range(self.world):
            if r != self.rank:
                self._wait_word(self._control[r].ack, self.rank * _SLOTS + slot, previous, r)

    def _acked(self, seq: int, until: float | None = None) -> bool:
        """Every peer has read exchange ``seq`` (an acquire poll of their ack words). With ``until``
        (a ``time.monotonic()`` deadline) live peers are waited for until then, and a dead peer
        counts as done (it reads nothing more), as do all once a rank's grow failed (see :meth:`_fail`)."""
        index = self.rank * _SLOTS + seq % _SLOTS
        for r in range(self.world):
            if r == self.rank:
                continue
            while True:
                left = 0.0 if until is None else min(0.05, max(0.0, until - time.monotonic()))
                if int(self._ops.shm_wait(self._control[r].ack, index, seq, left)) > _TIMED_OUT:
                    break
                if until is not None and (not _pid_alive(self._pids[r]) or self._failure() is not None):
                    break  # a dead peer reads nothing more, nor does any once a rank's grow failed
                if left == 0.0:
                    return False
        return True

    def _allocate(self, seq: int, nbytes: int) -> tuple[_Arena, int]:
        """A free range of ``nbytes`` in the newest arena (reaping acked ranges), or a new generation."""
        for arena in self._arenas:
            arena.live = [a for a in arena.live if not self._acked(a[0])]
        while len(self._arenas) > 1 and not self._arenas[0].live:
            retired = self._arenas.pop(0).segment
            retired.unlink()  # no exchange lives there: a peer that never mapped it never will
            retired.close()
        arena = self._arenas[-1]
        start = _HEADER  # the first bytes hold the segment's header word (see _grow)
        for _, lo, hi in sorted(arena.live, key=lambda a: a[1]):
            if lo - start >= nbytes:
                break
            start = max(start, hi)
        if start + nbytes > arena.segment.nbytes:
            arena = self._grow(seq, max(2 * arena.segment.nbytes, 2 * nbytes + _HEADER))
            start = _HEADER
        arena.live.append((seq, start, start + nbytes))
        return arena, start

    def _grow(self, seq: int, nbytes: int) -> _Arena:
        gen = self._arenas[-1].gen + 1
        purpose = f"rank {self.rank}'s send buffer"
        try:
            segment = ShmSegment.create(f"{self._tag}-data{gen}", nbytes, purpose)
        except ShmSpaceError as exc:  # /dev/shm full, the folder gone or read-only
            self._fail(seq, nbytes, exc, exc.__cause__)
            raise
        except OSError as exc:  # the mapping itself (ENOMEM)
            error = ShmSpaceError(
                f"lightrec's intra-host transport cannot map {nbytes / 2**20:.0f} MiB more for {purpose} "
                f"({exc.strerror}). Free memory, or set LIGHTREC_SHM=0 to exchange through gloo instead"
            )
            self._fail(seq, nbytes, error, exc)
            raise error from exc
        # Peers that map it count themselves in the header word; the last one unlinks the name.
        self._ops.shm_store(segment.words(torch.int32, 0, 1), 0, 1)
        arena = _Arena(gen, segment)
        self._arenas.append(arena)
        return arena

    def _fail(self, seq: int, nbytes: int, error: ShmSpaceError, cause: BaseException | None) -> None:
        """This rank cannot send exchange ``seq`` (a new generation of ``nbytes`` failed with ``error``):
        record why in its control segment (a rank whose wait runs past a second reads it) and publish
        ``seq`` as failed -- data generation -1 -- so the peers waiting to read it wake now and raise,
        instead of waiting out the timeout. Every later exchange of this rank raises ``error`` again."""
        self._failed = error
        code = cause.errno if isinstance(cause, OSError) and cause.errno else 0
        own = self._control[self.rank]
        slot = seq % _SLOTS
        own.meta[slot, 0] = -1
        own.failed.copy_(torch.tensor([seq, nbytes, code], dtype=torch.int64))
        self._ops.shm_store(own.seq, slot, seq)  # release: the record and the meta are visible first

    def _failure(self) -> tuple[int, int, int, int] | None:
        """(rank, exchange, bytes, errno) of the first rank whose grow failed (its control segment's
        record), or None."""
        for r, control in enumerate(self._control):
            seq, nbytes, code = (int(v) for v in control.failed)
            if seq:
                return r, seq, nbytes, code
        return None

    def _peer_failed(self) -> ShmSpaceError | None:
        """The error to raise on this rank once a rank's grow failed (:meth:`_failure`), or None; this
        rank's later exchanges raise it too."""
        failure = self._failure()
        if failure is None:
            return None
        r, seq, nbytes, code = failure
        if code == errno.ENOMEM:
            fix = "the host had no memory left to map it. Free memory"
        elif code in (0, errno.ENOSPC):
            try:
                free = f"{shutil.disk_usage(SHM_DIR).free / 2**20:.0f} MiB free"
            except OSError as exc:
                free = f"no usable space ({exc.strerror})"
            fix = (
                f"the shared-memory filesystem {SHM_DIR} has {free}. Enlarge it (docker run --shm-size=2g, or "
                "mount -o remount,size=... /dev/shm)"
            )
        else:  # the folder went away or became read-only
            fix = f"set {_switches.SHM_DIR.name} to a writable shared-memory folder (now {SHM_DIR})"
        why = f" ({os.strerror(code)})" if code else ""
        self._failed = ShmSpaceError(
            f"rank {r} of the shared-memory transport could not grow its send buffer to {nbytes / 2**20:.0f} MiB "
            f"for exchange {seq}{why}, so rank {self.rank} cannot go on either: {fix}, or set LIGHTREC_SHM=0 to "
            "exchange through gloo instead"
        )
        return self._failed

    def _unlink_at_exit(self) -> None:
        """Drop the names of this rank's grown segments that a peer never mapped (one that is never
        sent anything from a generation does not count itself in), once every peer has read the
        exchanges living there -- waiting at most ``_EXIT_GRACE`` seconds for live peers. A segment
        still unread keeps its name for the peer; the next run's sweep removes it."""
        deadline = time.monotonic() + _EXIT_GRACE
        for arena in self._arenas:
            # generation 0 was unlinked at start-up
            if arena.gen and all(self._acked(seq, until=deadline) for seq, _, _ in arena.live):
                arena.segment.unlink()

    def _peer_segment(self, src: int, gen: int) -> ShmSegment:
        seg = self._peer_data.get((src, gen))
        if seg is None:
            name = self._control_name_of_data(src, gen)
            try:
                seg = ShmSegment.open(name)
            except OSError as exc:  # the name is gone: this rank was too late to map it
                state = "running" if _pid_alive(self._pids[src]) else "gone"
                raise ShmPeerError(
                    f"rank {self.rank} cannot map {exc.filename or name}, the send buffer rank {src} (pid "
                    f"{self._pids[src]}, {state}) grew for an exchange ({exc.strerror}): rank {src} left (it waits "
                    f"at most {_EXIT_GRACE:.0f} s at exit for its peers to read) and a transport started since "
                    "swept the name as stale, or it was removed by hand. The job cannot continue; set "
                    "LIGHTREC_SHM=0 to exchange through gloo instead"
                ) from exc
            if int(self._ops.shm_fetch_add(seg.words(torch.int32, 0, 1), 0, 1)) + 1 == self.world:
                seg.unlink()  # every rank has it mapped now
            # Older generations stay mapped: an exchange this rank has not read yet may live there.
            # Generations double, so they add up to less than twice the newest.
            self._peer_data[(src, gen)] = seg
        return seg

    def _control_name_of_data(self, src: int, gen: int) -> str:
        base = self._peer_names[(src, 0)]
        return f"{base[: base.rindex('-data')]}-data{gen}"

    def _wait_word(self, words: torch.Tensor, index: int, target: int, peer: int) -> None:
        waited = 0.0
        while True:
            got = int(self._ops.shm_wait(words, index, target, 1.0))
            if got > _TIMED_OUT:
                return
            waited += 1.0
            failed = self._peer_failed()
            if failed is not None:
                raise failed
            if not _pid_alive(self._pids[peer]):
                raise ShmPeerError(
                    f"rank {peer} (pid {self._pids[peer]}) of the shared-memory transport died while rank "
                    f"{self.rank} waited for it in an exchange: its peer, rank {peer}, is gone and the job cannot "
                    "continue. Look at that rank's log (killed by the OOM killer, preempted, crashed)"
                )
            if waited >= self._timeout:
                raise ShmPeerError(
                    f"an exchange of the shared-memory transport on rank {self.rank} timed out: no answer within "
                    f"the process group's timeout ({self._timeout:.0f} s; LIGHTREC_SHM_TIMEOUT overrides it). Its "
                    f"peer, rank {peer}, is stuck or dead, or the ranks did not start their collectives in the "
                    "same order. Look at that rank's log"
                )


class ShmExchange:
    """One all-to-all in progress; see :meth:`ShmTransport.start`.

    Writer side: fill :meth:`send_view` for every peer, then :meth:`publish`. Reader side (after
    publish): :meth:`recv_view` of each source you expect bytes from, copy out, then :meth:`finish`.
    """

    def __init__(
        self,
        transport: ShmTransport,
        seq: int,
        slot: int,
        segment: ShmSegment,
        offsets: list[int],
        sizes: list[int],
        check: int = 0,
    ) -> None:
        self._t, self.seq, self._slot, self.check = transport, seq, slot, check
        self._segment, self._offsets, self._sizes = segment, offsets, sizes
        self._finished = False
        self._published = False

    def send_view(self, dest: int, dtype: torch.dtype, numel: int, byte_offset: int = 0) -> torch.Tensor:
        """``[numel]`` of ``dtype`` where this rank's chunk for ``dest`` starts (+ ``byte_offset``)."""
        at = self._offsets[dest] + byte_offset
        size = numel * torch.empty((), dtype=dtype).element_size()
        if byte_offset + size > self._sizes[dest]:
            raise ValueError(
                f"send_view: {size} bytes at {byte_offset} overrun the {self._sizes[dest]}-byte chunk"
            )
        return self._segment.data[at : at + size].view(dtype)

    def publish(self) -> None:
        """The chunks are written: let the peers read them."""
        t = self._t
        self._published = True
        t._ops.shm_store(t._control[t.rank].seq, self._slot, self.seq)

    def cancel(self) -> None:
        """Take back this exchange, started but not published (what was to fill it failed): its number
        and its bytes are free again, as if it had never started, so this rank's next exchange is
        numbered as its peers' is. Only the newest exchange of the transport can be taken back.

        Raises:
            RuntimeError: it was published, or a later exchange has started since.
        """
        t = self._t
        with t._lock:
            if self._published or t._next != ((self.seq + 1) & 0x7FFFFFFF or 1):
                raise RuntimeError(
                    f"exchange {self.seq} cannot be taken back: it was published, or a later one has started"
                )
            t._next = self.seq
        for arena in t._arenas:
            arena.live = [a for a in arena.live if a[0] != self.seq]
        self._finished = True  # nothing for the peers to release

    def recv_view(
        self, src: int, dtype: torch.dtype, numel: int, byte_offset: int = 0, whole: bool = False
    ) -> torch.Tensor:
        """``[numel]`` of ``dtype`` of ``src``'s chunk for this rank (waits for ``src`` to publish).
        ``whole``: the view must end where the chunk ends (a reader that takes the whole chunk).

        Raises:
            ShmMismatchError: ``src`` started the exchange with another ``check`` (:meth:`ShmTransport.start`),
                or its chunk is shorter than the view (or, with ``whole``, of another size).
        """
        t = self._t
        control = t._control[src]
        t._wait_word(control.seq, self._slot, self.seq, src)
        meta = control.meta[self._slot]
        gen, offset, nbytes = int(meta[0]), int(meta[_META + 2 * t.rank]), int(meta[_META + 1 + 2 * t.rank])
        if gen < 0:  # src published this exchange as failed: its send buffer could not grow
            raise t._peer_failed() or ShmSpaceError(f"rank {src} could not send exchange {self.seq}")
        size = numel * torch.empty((), dtype=dtype).element_size()
        end = byte_offset + size
        same_check = int(meta[2]) == self.check
        if end > nbytes or (whole and end != nbytes) or not same_check:
            what = "fewer than" if end > nbytes else "not" if end != nbytes else "as"
            raise ShmMismatchError(
                f"rank {src} sent rank {t.rank} {nbytes} bytes in exchange {self.seq}, {what} the {end} expected"
                f"{'' if same_check else ' (and the ranks computed different checks of its geometry)'}; ranks "
                "disagree about the exchange (different batches or plans?)",
                src, nbytes, end, same_check,
            )
        segment = t._peer_segment(src, gen)
        return segment.data[offset + byte_offset : offset + byte_offset + size].view(dtype)

    def finish(self) -> None:
        """This rank has copied out everything it needed: release the sources' chunks."""
        if self._finished:
            return
        self._finished = True
        t = self._t
        for src in range(t.world):
            if src != t.rank:
                t._ops.shm_store(t._control[t.rank].ack, src * _SLOTS + self._slot, self.seq)

    def __del__(self) -> None:
        # Work started ahead and then dropped unfinished (gloo simply forgets such work) must still
        # release its slot, else every writer blocks _SLOTS exchanges later waiting for this rank to
        # read it. Nothing is read: the ack only lets the sources reuse the slot and the bytes. An ack
        # already past this exchange (the slot's next use) is never moved back.
        if self._finished:
            return
        self._finished = True
        try:
            t = self._t
            acks = t._control[t.rank].ack
            for src in range(t.world):
                index = src * _SLOTS + self._slot
                if src != t.rank and int(acks[index]) < self.seq:
                    t._ops.shm_store(acks, index, self.seq)
        except Exception:  # noqa: BLE001 - the transport may be closed at interpreter exit
            pass


_TRANSPORTS: dict[object, ShmTransport | None] = {}
# Numbers this process's transports: a segment's name (user, pid, start time, then the tag) must be
# unique, and two live groups' ids may share their low bits.
_TRANSPORT_SERIAL = itertools.count()


_EXIT_HOOK_PID: int | None = None  # the process whose exit hook is registered


def _unlink_all_at_exit() -> None:
    for transport in list(_TRANSPORTS.values()):
        if transport is not None and transport._pids[transport.rank] == os.getpid():  # not a forked child's
            transport._unlink_at_exit()


def _hook_exit() -> None:
    """Register :func:`_unlink_all_at_exit` once per process. multiprocessing's exit hook, not atexit: it
    also runs in the rank processes multiprocessing starts (``torch.multiprocessing.spawn``, Lightning's
    ``ddp_spawn``), which leave through ``os._exit``, skipping atexit; and per process, as a child
    multiprocessing forks starts with the hooks cleared."""
    global _EXIT_HOOK_PID
    if _EXIT_HOOK_PID != os.getpid():
        _EXIT_HOOK_PID = os.getpid()
        multiprocessing.util.Finalize(None, _unlink_all_at_exit, exitpriority=0)


def _pid_namespace() -> str | None:
    """This process's pid namespace (``pid:[4026531836]``), or None where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _enabled_here() -> str | None:
    """None when this process could use the transport, else why not."""
    off = _switches.SHM.off_reason()
    if off is not None:
        return off
    if not sys.platform.startswith("linux"):
        return f"no shared-memory transport on {sys.platform}"
    ops = native_ops()
    if ops is None or not ops.shm:
        return "lightrec's native ops are unavailable"
    return None


def shm_transport(group: dist.ProcessGroup | None) -> ShmTransport | None:
    """The transport of ``group`` (set up on first use: a collective, every rank calls it at the
    same point, as the first exchange of the group does), or None when gloo must carry it: a
    backend other than gloo, ranks on several hosts (or in separate ``/dev/shm`` namespaces),
    ``LIGHTREC_SHM=0``, or no native ops.

    Raises:
        ShmSpaceError: on every rank, when a rank's ``/dev/shm`` cannot hold its segments.
    """
    key = group if group is not None else dist.group.WORLD
    if key in _TRANSPORTS:
        return _TRANSPORTS[key]
    transport = _setup(group)
    _TRANSPORTS[key] = transport
    if transport is not None:
        _hook_exit()
    return transport


def _setup(group: dist.ProcessGroup | None) -> ShmTransport | None:
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world == 1 or dist.get_backend(group) != "gloo":
        return None
    reason = _enabled_here()
    info: dict = {"ok": reason is None, "why": reason, "pid": os.getpid(), "host": socket.gethostname(),
                  "pid_namespace": _pid_namespace()}  # fmt: skip
    control = data = None
    if reason is None:
        sweep_stale_segments()
        tag = f"g{next(_TRANSPORT_SERIAL)}r{rank}"
        try:
            control = ShmSegment.create(f"{tag}-control", _Control.layout_bytes(world), "its control words")
            data = ShmSegment.create(f"{tag}-data0", _INITIAL_ARENA, f"rank {rank}'s send buffer")
        except ShmSpaceError as exc:
            info.update(ok=False, space=str(exc))
        else:
            control.data.zero_()
            control.words(torch.int32, 0, 1)[0] = _MAGIC
            torch.ops.lightrec_shm.shm_store(data.words(torch.int32, 0, 1), 0, world)  # opened by all below
            info.update(tag=tag, control=control.name, data=data.name)
    peers: list[dict] = [{} for _ in range(world)]
    transport: ShmTransport | None = None
    try:
        dist.all_gather_object(peers, info, group=group)
        # One host and one pid namespace: a peer's pid (its liveness) and its futex words mean the same
        # here, even where the segment folder is shared wider (a network LIGHTREC_SHM_DIR, --ipc=host).
        one_host = len({(p["host"], p["pid_namespace"]) for p in peers}) == 1
        if all(p["ok"] for p in peers) and one_host:
            transport = ShmTransport(group, rank, world, peers)
            try:
                transport._attach(peers, control, data)  # type: ignore[arg-type]
                opened = True
            except OSError:  # another host, or another /dev/shm namespace
                opened = False
            flags: list[bool] = [False] * world
            dist.all_gather_object(flags, opened, group=group)
            if not all(flags):
                transport = None
    finally:  # every peer has mapped them, given up, or failed: drop the names
        for seg in (control, data):
            if seg is not None:
                seg.unlink()
    space = [p["space"] for p in peers if "space" in p]
    if space:
        raise ShmSpaceError(space[0])
    return transport
