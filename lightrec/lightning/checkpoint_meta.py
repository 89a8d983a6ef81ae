"""What a checkpoint says about the run that wrote it, read without its tables.

``lightrec run`` checks ``--ckpt_path`` against the command line before any rank starts
(``lightrec.lightning.recipe_preflight``): the module class that wrote it, its hyperparameters, the world size
and the DataModule's batch size. Reading them must stay cheap: for a sharded folder only ``meta.pt``
(verified against the manifest); a file is memory-mapped, so its tensors are not read. Nothing is
unpickled with code execution (``weights_only=True``).
"""

from __future__ import annotations

import os
from typing import Any

from lightrec.distributed.checkpoint import is_sharded_checkpoint, load_file
from lightrec.distributed.checkpoint.files import read_meta

__all__ = ["checkpoint_entries", "is_sharded_checkpoint"]


def checkpoint_entries(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's top-level entries (``lightrec_module``, ``hyper_parameters``,
    ``datamodule_hyper_parameters``, ``lightrec_sharded`` with the world size of a folder, ...).

    Raises:
        CheckpointError: a damaged or foreign sharded folder, or a file that is not a safe checkpoint.
        OSError: the path cannot be read.
    """
    meta = read_meta(path) if is_sharded_checkpoint(path) else load_file(path, mmap=True)
    return meta if isinstance(meta, dict) else {}
