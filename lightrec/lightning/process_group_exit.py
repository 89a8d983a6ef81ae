"""Destroy the default process group at interpreter exit, on every backend.

A rank that exits with its gloo process group still alive can abort at the very end
("terminate called without an active exception", exit status 134) although training finished: gloo's
worker threads may still hold finished work whose tensors reference Python objects, and releasing
them while the interpreter is being torn down takes the GIL of a dying interpreter (pytorch#190489,
and the abandoned fix pytorch#179291). Lightning registers ``destroy_process_group`` at exit for NCCL
only (``lightning.fabric.utilities.distributed._init_dist_connection``); ``RecStrategy`` trains on
gloo on CPU, so it registers the same for every backend.

``atexit`` handlers run after the interpreter has joined its non-daemon threads and while it is
still whole, which is the moment to let the groups go. Destroying a gloo group makes no collective;
work still pending on it (an asynchronous op left unwaited against a dead peer) is waited for up to
the group's timeout, as with Lightning's handler for NCCL. Nothing here runs before exit: a
``Trainer`` that fits and then tests keeps its group.
"""

from __future__ import annotations

import atexit
import logging

import torch.distributed as dist

__all__ = ["destroy_process_groups_at_exit"]

_log = logging.getLogger(__name__)
_registered = False


def _destroy_process_groups() -> None:
    """``destroy_process_group()`` of every group still alive; never raises (the process is ending)."""
    if not (dist.is_available() and dist.is_initialized()):
        return  # the user (or a test) destroyed it already
    try:
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - an exit handler must not turn a clean exit into a traceback
        _log.debug("destroy_process_group() at exit failed: %r", exc)


def destroy_process_groups_at_exit() -> None:
    """Register :func:`_destroy_process_groups` with ``atexit``, once per process."""
    global _registered
    if not _registered:
        atexit.register(_destroy_process_groups)
        _registered = True
