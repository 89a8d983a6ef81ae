"""Whether this process has received SIGTERM during the running fit: one flag, written by a signal handler.

``RecStrategy``'s SIGTERM handler (``lightrec.lightning.sigterm_agreement``) only notes the signal here;
the ranks turn it into Lightning's ``trainer.received_sigterm`` together, at a training batch's start. A
reader that must react before the next batch -- ``ParquetDataModule`` waiting for files, where no batch
starts -- reads this flag (on rank 0, whose answer the wait sends to every rank).

A plain module-level bool: a Python signal handler runs on the main thread between two bytecodes, so
assigning it is atomic, and no lock is taken inside the handler (one the interrupted code holds would
deadlock it).
"""

from __future__ import annotations

__all__ = ["forget_sigterm", "note_sigterm", "sigterm_noted"]

_noted = False


def note_sigterm() -> None:
    """Record that SIGTERM came (called from the signal handler)."""
    global _noted
    _noted = True


def sigterm_noted() -> bool:
    """Whether SIGTERM came since the last :func:`forget_sigterm` (the running fit's start)."""
    return _noted


def forget_sigterm() -> None:
    """Clear the record: a fit registering its handlers starts without one, and its teardown leaves none."""
    global _noted
    _noted = False
