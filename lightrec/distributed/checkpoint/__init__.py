"""Sharded checkpoints: every rank writes its own shards; any number of ranks reads them back.

::

    from lightrec.distributed.checkpoint import save_sharded_checkpoint, load_sharded_checkpoint

    ckpt = {"state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()], "step": step}
    save_sharded_checkpoint("ckpt/step=100.ckpt", ckpt, model, [opt])          # collective, atomic
    ...                                                                         # any world size / plan
    ckpt = load_sharded_checkpoint("ckpt/step=100.ckpt", model, [opt])          # this rank's slices
    model.load_state_dict(ckpt["state_dict"]); opt.load_state_dict(ckpt["optimizer_states"][0])

``consolidate_checkpoint(dir, "full.ckpt")`` gathers a directory into one file of full tables
(for export, for an unsharded model, or to resume anywhere). ``RecStrategy`` uses these for
Lightning's ``save_checkpoint`` / ``load_checkpoint``. Layout: ``files.py``; crash-safe publishing:
``publish.py``; run id and checksums: ``integrity.py``; loading without running code from files
(``weights_only=True``): ``safe_load.py``; resharding rules (including row-wise optimizer state of
column shards): ``blocks.py``. ``docs/checkpoints.md`` gives the guarantees and their cost.
"""

from lightrec.distributed.checkpoint.blocks import CheckpointError
from lightrec.distributed.checkpoint.consolidate import consolidate_checkpoint
from lightrec.distributed.checkpoint.files import is_sharded_checkpoint
from lightrec.distributed.checkpoint.load import (
    CheckpointSource,
    ForeignCheckpointError,
    load_sharded_checkpoint,
    open_checkpoint,
)
from lightrec.distributed.checkpoint.safe_load import UnsafeCheckpointError, load_file
from lightrec.distributed.checkpoint.save import save_sharded_checkpoint

__all__ = [
    "CheckpointError",
    "CheckpointSource",
    "ForeignCheckpointError",
    "UnsafeCheckpointError",
    "consolidate_checkpoint",
    "is_sharded_checkpoint",
    "load_file",
    "load_sharded_checkpoint",
    "open_checkpoint",
    "save_sharded_checkpoint",
]
