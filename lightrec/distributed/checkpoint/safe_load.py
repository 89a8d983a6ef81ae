"""Read checkpoint files without running code from them.

Every ``torch.load`` lightrec does goes through :func:`load_file`, which unpickles with
``weights_only=True``: tensors, containers, numbers, strings, and the types torch and lightrec list
as safe -- nothing in the file can name a function for the unpickler to call. lightrec's own types
that checkpoints hold (table configs and their enums in hyper-parameters, sharding metadata,
``ShardedTableState`` values of a sharded state dict) are registered with
``torch.serialization.add_safe_globals`` when this module is imported -- also under the names they
had before the layout of issue 32 moved them, which older files store -- so Lightning's own loads
(``load_from_checkpoint``, a plain ``Trainer.fit(ckpt_path=...)``) accept them under
``weights_only=True`` as well.

A file that needs anything else to load is refused with a ``CheckpointError`` naming the file and
the type; load it yourself with ``weights_only=False`` only if you trust where it came from.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Callable
from typing import Any

import torch

from lightrec.distributed.checkpoint.blocks import CheckpointError
from lightrec.distributed.planner import plan
from lightrec.distributed.sharding.state_dict import FORMER_NAMES, ShardedTableState
from lightrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType

__all__ = ["SAFE_TYPES", "UnsafeCheckpointError", "load_file"]

_PLAN_TYPES: list[type] = list(plan.SAFE_PLAN_TYPES)
#: lightrec's types that may appear in a checkpoint and carry no code of their own -- under their
#: names, and under the names files written before they moved store: the plan types of the one
#: module ``lightrec.distributed.planner.plan`` was (now the package that re-exports them) and
#: ``ShardedTableState`` of ``lightrec.distributed.state_dict`` (``sharding/state_dict.py``).
SAFE_TYPES: list[Callable[..., object] | tuple[Callable[..., object], str]] = [
    ShardedTableState,
    *_PLAN_TYPES,
    EmbeddingBagConfig,
    EmbeddingConfig,
    PoolingType,
    DataType,
    *[(t, f"lightrec.distributed.planner.plan.{t.__name__}") for t in _PLAN_TYPES],
    *FORMER_NAMES,
]
torch.serialization.add_safe_globals(SAFE_TYPES)


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file names Python objects that ``weights_only=True`` does not load."""


def load_file(path: str | os.PathLike, mmap: bool = False, weights_only: bool = True) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)`` with errors that name the file.

    Args:
        path: a file written by ``torch.save``.
        mmap: memory-map tensor data (only the bytes used are read).
        weights_only: keep True; False runs whatever the pickle names (``RecStrategy.load_checkpoint``
            passes a user's explicit ``weights_only=False`` through for plain Lightning files).

    Raises:
        UnsafeCheckpointError: the file names a type that is not safe to load.
        CheckpointError: the file is not a readable
            ``torch.save`` file (truncated, corrupt, not a checkpoint).
        FileNotFoundError: nothing at ``path``.
    """
    shown = os.fspath(path)
    try:
        return torch.load(shown, map_location="cpu", mmap=mmap, weights_only=weights_only)
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as exc:
        named = re.search(r"GLOBAL ([\w.]+)", str(exc))
        refused = f"it names {named.group(1)}" if named else str(exc).strip().splitlines()[0]
        raise UnsafeCheckpointError(
            f"{shown} was not loaded: it holds Python objects that are not safe to unpickle ({refused}). lightrec "
            "loads checkpoints with weights_only=True; if you trust the file, load it yourself with "
            "torch.load(..., weights_only=False) or register the type with torch.serialization.add_safe_globals"
        ) from exc
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        raise CheckpointError(
            f"{shown} is not a readable checkpoint file (truncated or corrupt?): {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        ) from exc
