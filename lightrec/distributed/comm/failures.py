"""A dead or stuck peer, reported as a lightrec error naming the collective and, where knowable, the rank.

gloo reports a killed peer as ``Connection closed by peer [127.0.0.1]:41234`` (an address, no
rank) and a stuck one, after the process group's timeout, as ``Timed out waiting 15000ms for recv
operation to complete``; NCCL's watchdog likewise names neither the collective's purpose nor the
peer. :func:`collective_guard` wraps the places where lightrec's collectives are waited for and
turns such errors into :class:`CollectiveError`::

    CollectiveError: all_reduce of data-parallel table gradients on rank 0 (group of ranks [0, 1])
    got no answer within the process group's timeout (0:00:15): its peer, rank 1, is stuck or dead.
    ...

The peer is named when the group has two ranks (it can only be the other one); with more ranks the
transport's message does not say which peer failed, so the group's ranks are listed. Every process
group lightrec creates takes the timeout of the group it is made from (:func:`timeout_of`), so the
user's ``timeout=`` (``RecStrategy``, ``init_process_group``) bounds every wait.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

from lightrec._compat import timeout_of

__all__ = ["CollectiveError", "ShmMismatchError", "ShmPeerError", "collective_guard", "timeout_of"]

# What the transports say when a peer died or did not answer (gloo, NCCL, the TCP store).
_PEER_FAILURE = re.compile(
    r"closed by peer|reset by peer|broken pipe|timed out|connection refused|gloo/|nccl",
    re.IGNORECASE,
)
_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)


class CollectiveError(RuntimeError):
    """A collective failed because a peer died, stopped, or cannot be reached."""


def _describe(name: str, pg: dist.ProcessGroup | None, exc: BaseException) -> str:
    try:
        ranks = dist.get_process_group_ranks(pg if pg is not None else dist.group.WORLD)
        me = dist.get_rank()
    except (RuntimeError, ValueError):
        ranks, me = [], -1
    peers = [r for r in ranks if r != me]
    who = f"its peer, rank {peers[0]}," if len(peers) == 1 else f"a peer among ranks {peers}"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if _TIMED_OUT.search(str(exc)):
        what = f"got no answer within the process group's timeout ({timeout_of(pg)}): {who} is stuck or dead"
    else:
        what = f"lost its connection: {who} died or closed its connection"
    return (
        f"{name} on rank {me} (group of ranks {ranks}) {what}. Look at that rank's log (killed by the OOM "
        f"killer, preempted, crashed, or hung); the transport said: {first}"
    )


@contextmanager
def collective_guard(name: str, pg: dist.ProcessGroup | None = None) -> Iterator[None]:
    """Re-raise a peer failure inside the block as :class:`CollectiveError` naming ``name``.

    Errors that are not about peers (wrong shapes, user errors) and ``CollectiveError`` raised by
    an inner guard pass through unchanged. Costs nothing unless an exception is raised.
    """
    try:
        yield
    except CollectiveError:
        raise
    except RuntimeError as exc:
        distributed = isinstance(exc, getattr(dist, "DistError", ()))
        if not (distributed or _PEER_FAILURE.search(str(exc))) or not dist.is_initialized():
            raise
        raise CollectiveError(_describe(name, pg, exc)) from exc


class ShmPeerError(CollectiveError):
    """A peer of the shared-memory transport died or stopped answering (a :class:`CollectiveError`)."""


class ShmMismatchError(ShmPeerError, ValueError):
    """A peer's chunk of an exchange does not fit what this rank expects: the ranks called the exchange
    with different inputs (a ``ValueError``; a :class:`ShmPeerError` too, as this was raised before).

    Attributes:
        src: the peer.
        sent: bytes the peer sent this rank.
        expected: bytes this rank expected from it.
        same_check: whether the peer's ``check`` (:meth:`ShmTransport.start`) equals this rank's.
    """

    def __init__(self, message: str, src: int, sent: int, expected: int, same_check: bool) -> None:
        super().__init__(message)
        self.src, self.sent, self.expected, self.same_check = src, sent, expected, same_check
