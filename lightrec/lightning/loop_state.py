"""Lightning's loop counters of a checkpoint, made to say where training really stopped.

Lightning restores its fit loop from counters of batches and epochs ``ready / started / processed
/ completed``. Two kinds of checkpoint hold counters that make a resumed run train the wrong
batches (Lightning 2.6; its issue #19617 is of the same family):

* **written when an epoch had been read to its end** -- ``ModelCheckpoint`` at the end of
  validation or of the training epoch, or at ``on_train_end`` after ``max_epochs``, which is where
  the recipes' ``last.ckpt`` (``save_last=True, save_top_k=0``) comes from. The training epoch
  loop's batch counters are those of the finished epoch (``current.ready == completed == batches
  per epoch``, ``is_last_batch``). A step-based resume (``max_steps``) counts them as already read
  in the *next* epoch: it ends that epoch after one batch, or none, so the run trains nothing (the
  recipes' ``lightrec run ... --trainer.max_steps 70 --ckpt_path last.ckpt`` showed ``Epoch 1:
  0/40``, stopped at "max_epochs reached" and wrote a checkpoint at step 40, epoch 2);
* **written at ``on_train_end`` after training stopped inside an epoch** (``max_steps``,
  ``max_time``, ``trainer.should_stop``): the fit loop counts the cut epoch as processed and
  completed, so a resume starts the *next* epoch at the cut epoch's batch index -- with the data of
  the next epoch's beginning, while the data loader's saved position (``RankDataLoader``) belongs to
  the cut epoch and is ignored. The rest of the cut epoch was never trained.

:func:`fix_resume_counters` rewrites the first to the start of the next epoch (the fit loop's epoch
counter already says one more epoch was processed) and the second to the middle of the cut epoch,
where the data loader then resumes from its saved position. Every other checkpoint is left alone:
mid-epoch checkpoints written by ``ModelCheckpoint(every_n_train_steps=...)`` and those written in
``on_train_batch_end`` of an epoch's last batch, which Lightning restores correctly itself.

A resumed run that restarts a loop this way may also find validation due at the first batch it
reads (Lightning then skips that validation, which was run or never due, and counts one more
stepped batch): training metrics would be logged one step later than the uninterrupted run logged
them. :func:`logging_step_of` is the step the run stopped at; the caller puts it back when the
first batch starts (``lightrec._compat.set_logging_step``).

It runs where lightrec sees the checkpoint before Lightning restores its loops:
``RecStrategy.load_checkpoint`` (any ``LightningModule`` under ``RecStrategy``) and
``RecModule.on_load_checkpoint`` (a ``RecModule`` under any strategy). A plain ``LightningModule``
under another strategy can call it from its own ``on_load_checkpoint``. Calling it twice changes
nothing the second time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["fix_resume_counters", "logging_step_of"]

Fix = Literal["finished epoch", "stopped mid-epoch"]


def _all_equal(counts: Mapping[str, object], value: int | None = None) -> bool:
    values = {counts.get(k, 0) for k in ("ready", "started", "processed", "completed")}
    return len(values) == 1 and (value is None or values == {value})


def _epoch_read_to_its_end(fit_loop: dict[str, Any]) -> bool:
    """The training epoch loop's batch counters are those of a whole epoch, read to its last batch."""
    batches = fit_loop.get("epoch_loop.batch_progress", {})
    current = batches.get("current", {})
    return bool(batches.get("is_last_batch")) and current.get("ready", 0) > 0 and _all_equal(current)


def _stopped_inside_an_epoch(fit_loop: dict[str, Any]) -> bool:
    """Batches of an epoch were trained but not its last one, and the epoch counts as completed."""
    batches = fit_loop.get("epoch_loop.batch_progress", {})
    current = batches.get("current", {})
    epoch = fit_loop.get("epoch_progress", {}).get("current", {})
    return (
        not batches.get("is_last_batch")
        and current.get("ready", 0) > 0
        and _all_equal(current)
        and epoch.get("processed", 0) > 0
        and _all_equal(epoch)
    )


def fix_resume_counters(checkpoint: dict[str, Any]) -> Fix | None:
    """Rewrite, in place, the loop counters of a checkpoint that would resume into the wrong batches.

    Args:
        checkpoint: a Lightning checkpoint dict (``checkpoint["loops"]["fit_loop"]``).

    Returns:
        ``"finished epoch"`` (the per-epoch batch counters were reset: the next epoch starts at its
        first batch), ``"stopped mid-epoch"`` (the cut epoch is no longer counted as processed: it
        resumes at its next batch), or None (nothing to change).
    """
    fit_loop = checkpoint.get("loops", {}).get("fit_loop")
    if not isinstance(fit_loop, dict):
        return None
    epoch = fit_loop.get("epoch_progress", {})
    if _epoch_read_to_its_end(fit_loop):
        current = epoch.get("current", {})
        processed_one_more = current.get("processed", 0) == current.get("started", 0) > 0
        if not processed_one_more or current.get("completed", 0) not in (current["processed"] - 1, current["processed"]):
            return None
        batches = fit_loop["epoch_loop.batch_progress"]
        batches["current"] = dict.fromkeys(batches["current"], 0)
        batches["is_last_batch"] = False
        return "finished epoch"
    if _stopped_inside_an_epoch(fit_loop):
        for counts in (epoch["current"], epoch.get("total", {})):
            for key in ("processed", "completed"):
                if counts.get(key, 0) > 0:
                    counts[key] -= 1
        if isinstance(checkpoint.get("epoch"), int):
            checkpoint["epoch"] = epoch["current"]["completed"]
        return "stopped mid-epoch"
    return None


def logging_step_of(checkpoint: dict[str, Any]) -> int | None:
    """The step at which the run that wrote ``checkpoint`` logged its next training metrics, or None."""
    state = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
    step = state.get("_batches_that_stepped") if isinstance(state, dict) else None
    return step if isinstance(step, int) else None
