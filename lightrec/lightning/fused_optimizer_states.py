"""The state of fused embedding optimizers that a ``configure_optimizers`` override leaves out.

A ``RecModule`` whose ``configure_optimizers`` returns a dense optimizer only still trains its fused
tables inside backward, but Lightning saves and restores only the optimizers it was given, so a
resumed fit would restart the tables' Adagrad accumulators / Adam moments from zero. On one device
``RecModule`` keeps them in the checkpoint entry ``lightrec_unlisted_fused_optimizer_states``
(``{module path: state_dict}``); ``RecStrategy`` saves them itself, sharded, and is not given them.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from torch.optim import Optimizer

from lightrec.lightning.fused_tables_checks import unlisted_fused_optimizers

__all__ = ["UNLISTED_FUSED_STATES", "restore_unlisted_fused_states", "save_unlisted_fused_states"]

UNLISTED_FUSED_STATES = "lightrec_unlisted_fused_optimizer_states"


def save_unlisted_fused_states(
    checkpoint: MutableMapping[str, object], optimizers: list[Optimizer], fused: list[tuple[str, Optimizer]]
) -> None:
    """Put the states of the ``fused`` optimizers that none of ``optimizers`` (the trainer's) holds into
    ``checkpoint`` (nothing when every one is listed)."""
    unlisted = unlisted_fused_optimizers(optimizers, fused)
    if unlisted:
        checkpoint[UNLISTED_FUSED_STATES] = {path: opt.state_dict() for path, opt in unlisted}


def restore_unlisted_fused_states(
    checkpoint: Mapping[str, object], live: Mapping[str, Optimizer], owner: str
) -> None:
    """Load the states :func:`save_unlisted_fused_states` saved into the ``live`` fused optimizers (by
    module path); ``KeyError`` naming both sets when the checkpoint holds a path ``owner`` lacks."""
    saved = checkpoint.get(UNLISTED_FUSED_STATES)
    if not isinstance(saved, Mapping) or not saved:
        return
    missing = sorted(set(saved) - set(live))
    if missing:
        raise KeyError(
            f"the checkpoint holds the state of fused embedding optimizer(s) {missing} (checkpoint entry "
            f"{UNLISTED_FUSED_STATES!r}), which {owner} does not have (it has {sorted(live)}): resume with the "
            "module that wrote the checkpoint, or delete that entry to start the tables' optimizer state afresh"
        )
    for path, state in saved.items():
        live[path].load_state_dict(state)
