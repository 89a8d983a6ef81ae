"""The dense gradients' all-reduce through the intra-host shared-memory transport: a DDP communication hook.

On CPU ranks of one host, DDP's gloo all-reduce moves every gradient bucket over TCP loopback (and
a gloo transport thread competes with the backward for the cores). :func:`register_shm_allreduce`
puts DDP's buckets through the transport the embedding exchanges already use (``shm_transport.py``,
its own segments for the DDP process group instead). It is opt-in
(``DefaultDataParallelWrapper(shm_allreduce=True)``): on the quiet 2-rank DLRM it measured 1.00x
against gloo's, whose all-reduce already runs beside the backward (0.3 ms of it exposed).

1. every rank divides its bucket by the world size (what DDP's own all-reduce does first);
2. reduce-scatter: the bucket is cut into ``W`` near-equal chunks; chunk ``d`` goes to rank ``d``,
   which sums the ``W`` copies of its chunk **in rank order 0, 1, ..., W-1** (a fixed order: the
   result does not depend on which rank arrives first);
3. all-gather: each rank sends its summed chunk to every peer, and every rank copies them in.

Every rank ends with the same bytes. With two ranks they are gloo's bytes bit for bit (one
addition per element, and float addition is commutative; dividing by two first is exact, as in
gloo's path); with more ranks gloo's ring may add in another order, so the last bits can differ
(the sums are equally exact). The hook hands each bucket to one thread per DDP (started at the
first bucket) and returns at once: the thread runs the exchanges in the order DDP hands the buckets
over -- the same order on every rank -- while the backward goes on, mostly waiting on a futex for
the peer (no spinning on a core the backward needs); DDP waits for the futures at the end of the
backward, as it waits for gloo's.

Where it applies, when asked for (checked once, collectively, when the dense part is wrapped): every rank on this
host, gloo, CPU parameters, ``LIGHTREC_SHM`` and ``LIGHTREC_SHM_ALLREDUCE`` not ``0``, and room in
``/dev/shm`` (each rank's send arena grows to about twice the gradients it sends at once; a small
``/dev/shm`` -- docker's default is 64 MiB -- keeps gloo, with the reason logged). Elsewhere DDP keeps
its own all-reduce.
"""

# No `from __future__ import annotations` here: DDP's register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] themselves, and refuses strings.
import logging
import queue
import shutil
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lightrec import _switches
from lightrec.distributed.comm.shm_segments import SHM_DIR, ShmSpaceError
from lightrec.distributed.comm.shm_transport import _INITIAL_ARENA, ShmTransport, shm_transport

__all__ = ["ShmAllReduceState", "register_shm_allreduce", "shm_allreduce_", "shm_allreduce_hook", "shm_space_needed"]

_log = logging.getLogger(__name__)


class ShmAllReduceState:
    """What :func:`shm_allreduce_hook` needs: the DDP group's transport, and the thread that runs its
    exchanges one after the other, in the order the buckets were submitted.

    Args:
        transport: the shared-memory transport of DDP's process group.
    """

    def __init__(self, transport: ShmTransport) -> None:
        self.transport = transport
        self._queue: queue.SimpleQueue[tuple[torch.Tensor, torch.futures.Future[torch.Tensor]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, flat: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
        """Average ``flat`` over the ranks on the thread (in place); the future completes with ``flat``
        (or with the exchange's error: a dead or stuck peer)."""
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        if self._thread is None:
            # a daemon: one waiting for a peer that is gone must not hold the interpreter at exit
            self._thread = threading.Thread(target=self._run, name="lightrec-shm-allreduce", daemon=True)
            self._thread.start()
        self._queue.put((flat, future))
        return future

    def _run(self) -> None:
        while True:
            flat, future = self._queue.get()
            try:
                shm_allreduce_(self.transport, flat)
            except BaseException as exc:  # noqa: BLE001 - handed to DDP, which raises it in the backward
                future.set_exception(exc)  # type: ignore[arg-type]  # torch's stub types it as the result
            else:
                future.set_result(flat)


def _bounds(numel: int, world: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each rank's chunk of a flat ``[numel]`` bucket (near-equal, in rank order)."""
    return [(d * numel // world, (d + 1) * numel // world) for d in range(world)]


def shm_allreduce_(transport: ShmTransport, flat: torch.Tensor) -> torch.Tensor:
    """Average ``flat`` (a contiguous 1-D CPU tensor) over the transport's ranks, in place.

    Args:
        transport: the shared-memory transport of the process group (every rank calls this with a
            tensor of the same numel and dtype, in the same order).
        flat: ``[N]`` this rank's values; on return every rank holds the mean, summed in rank order.

    Returns:
        ``flat``.

    Raises:
        ValueError: ``flat`` is not a contiguous 1-D tensor.
        lightrec.distributed.comm.ShmPeerError: a peer died or did not answer within the timeout.
    """
    if flat.dim() != 1 or not flat.is_contiguous():
        raise ValueError(f"shm_allreduce_ needs a contiguous 1-D tensor, got shape {tuple(flat.shape)}")
    world, rank = transport.world, transport.rank
    flat.div_(world)
    bounds = _bounds(flat.numel(), world)
    item = flat.element_size()
    lo, hi = bounds[rank]
    own = flat[lo:hi]
    # reduce-scatter: chunk d to rank d; this rank sums the copies of its own chunk in rank order
    exchange = transport.start([(b - a) * item for a, b in bounds])
    for dest, (a, b) in enumerate(bounds):
        if dest != rank:
            exchange.send_view(dest, flat.dtype, b - a).copy_(flat[a:b])
    exchange.publish()
    parts = [own if src == rank else exchange.recv_view(src, flat.dtype, hi - lo) for src in range(world)]
    if rank == 0:
        for part in parts[1:]:
            own.add_(part)
    else:
        total = torch.add(parts[0], parts[1])
        for part in parts[2:]:
            total.add_(part)
        own.copy_(total)
    exchange.finish()
    # all-gather: this rank's sum to every peer
    exchange = transport.start([(hi - lo) * item] * world)
    for dest in range(world):
        if dest != rank:
            exchange.send_view(dest, flat.dtype, hi - lo).copy_(own)
    exchange.publish()
    for src, (a, b) in enumerate(bounds):
        if src != rank:
            flat[a:b].copy_(exchange.recv_view(src, flat.dtype, b - a))
    exchange.finish()
    return flat


def shm_allreduce_hook(state: ShmAllReduceState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's mean over the ranks through shared memory (module docstring)."""
    return state.submit(bucket.buffer())


def shm_space_needed(grad_bytes: int, world: int) -> int:
    """Bytes of ``/dev/shm`` the hook's transport may take on one host: per rank, a send arena that
    grows to about twice the largest bucket's chunks (bounded by all ``grad_bytes``) plus its floor."""
    return world * (_INITIAL_ARENA + 2 * grad_bytes)


def _local_refusal(ddp: DistributedDataParallel) -> str | None:
    """Why this rank cannot use the hook (None: it can), before asking the peers."""
    off = _switches.SHM_ALLREDUCE.off_reason() or _switches.SHM.off_reason()
    if off is not None:
        return off
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    if any(p.device.type != "cpu" for p in params):
        return "the dense parameters are not on the CPU"
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    needed = shm_space_needed(grad_bytes, ddp.process_group.size())
    try:
        free = shutil.disk_usage(SHM_DIR).free
    except OSError as exc:
        return f"{SHM_DIR} is not usable ({exc.strerror})"
    if free < needed:
        return (
            f"{SHM_DIR} has {free / 2**20:.0f} MiB free, the dense gradients' exchange may need "
            f"{needed / 2**20:.0f} MiB (enlarge it: docker run --shm-size=2g)"
        )
    return None


def register_shm_allreduce(ddp: DistributedDataParallel) -> str | None:
    """Register :func:`shm_allreduce_hook` on ``ddp`` where it applies (collective over DDP's group
    on gloo: every rank calls it, right after wrapping).

    Returns:
        None when registered; else why DDP keeps its own all-reduce (also logged at INFO on rank 0).

    Raises:
        RuntimeError: ``ddp`` already has a communication hook (DDP's own refusal).
    """
    group = ddp.process_group
    if group.size() == 1:
        return "one rank: nothing to all-reduce"
    if dist.get_backend(group) != "gloo":
        return f"the {dist.get_backend(group)} backend all-reduces by itself"
    reasons: list[str | None] = [None] * group.size()
    dist.all_gather_object(reasons, _local_refusal(ddp), group=group)
    reason = next((f"rank {r}: {why}" for r, why in enumerate(reasons) if why is not None), None)
    transport = None
    if reason is None:
        try:
            transport = shm_transport(group)
        except ShmSpaceError as exc:  # raised on every rank alike
            reason = str(exc)
        else:
            reason = None if transport is not None else "the ranks are not on one host (or not on one /dev/shm)"
    if transport is None:
        if dist.get_rank(group) == 0:
            _log.info("the dense gradients are all-reduced by gloo, not through shared memory: %s", reason)
        return reason
    ddp.register_comm_hook(ShmAllReduceState(transport), shm_allreduce_hook)
    return None
