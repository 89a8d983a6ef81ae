"""Lightning's loop counters in a checkpoint written when an epoch had been read to its end.

A checkpoint written after the last batch of an epoch -- ``ModelCheckpoint`` at the end of
validation or of the training epoch, the recipes' ``last.ckpt`` -- holds the training epoch loop's
batch counters of that finished epoch (``current.ready == completed == batches per epoch``,
``is_last_batch``). When the run that resumes it is step-based (``max_steps`` set), Lightning counts
the restored batches as already read in the *next* epoch: it ends that epoch after one batch, or
after none when the loader is empty, so a resumed run trains (almost) nothing and exits 0.

:func:`start_next_epoch_counters` sets those counters to the start of an epoch, which is what the
fit loop's epoch counter (one epoch processed) already says. It leaves every other checkpoint
alone: mid-epoch ones (the data loader resumes them where they stopped) and those written in
``on_train_batch_end`` of an epoch's last batch (Lightning handles that case itself).
"""

from __future__ import annotations

from typing import Any

__all__ = ["start_next_epoch_counters"]


def _finished_epoch(fit_loop: dict[str, Any]) -> bool:
    epoch = fit_loop.get("epoch_progress", {}).get("current", {})
    batches = fit_loop.get("epoch_loop.batch_progress", {})
    current = batches.get("current", {})
    epoch_processed = epoch.get("processed", 0) == epoch.get("started", 0) == epoch.get("completed", 0) + 1
    batches_done = (
        bool(batches.get("is_last_batch"))
        and current.get("ready", 0) > 0
        and current.get("ready")
        == current.get("started")
        == current.get("processed")
        == current.get("completed")
    )
    return epoch_processed and batches_done


def start_next_epoch_counters(checkpoint: dict[str, Any]) -> bool:
    """Reset the per-epoch batch counters of a checkpoint written at the end of an epoch, in place.

    Args:
        checkpoint: a Lightning checkpoint dict (``checkpoint["loops"]["fit_loop"]``).

    Returns:
        Whether the counters were reset (the checkpoint was written at the end of an epoch).
    """
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    if not isinstance(fit_loop, dict) or not _finished_epoch(fit_loop):
        return False
    batches = fit_loop["epoch_loop.batch_progress"]
    batches["current"] = dict.fromkeys(batches["current"], 0)
    batches["is_last_batch"] = False
    return True
