"""A strategy other than ``RecStrategy`` given a RecStrategy checkpoint folder: a clear error, not
``torch.load``'s ``IsADirectoryError``.

``RecModule.setup`` wraps such a strategy's ``CheckpointIO`` in :class:`ShardedFolderRefusal`
(Lightning reads ``ckpt_path`` through the strategy, after the module's ``setup`` and before any hook
that sees the checkpoint); ``RecModule.teardown`` -- or the refusal itself -- puts the wrapped one back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.strategies import Strategy
from typing_extensions import override

from lightrec.distributed.checkpoint import CheckpointError, is_sharded_checkpoint
from lightrec.lightning.contracts import EmbeddingShardingStrategy

__all__ = ["ShardedCheckpointFolderError", "ShardedFolderRefusal"]


class ShardedCheckpointFolderError(CheckpointError):
    """A sharded checkpoint folder written by ``RecStrategy`` was given to a Trainer whose strategy reads
    single-file checkpoints only (``Trainer(strategy="auto").fit(ckpt_path=folder)``): pass
    ``strategy=RecStrategy(...)``, or consolidate the folder into one file with ``lightrec consolidate``."""


class ShardedFolderRefusal(CheckpointIO):
    """A strategy's ``CheckpointIO`` that refuses a ``RecStrategy`` checkpoint folder with a
    :class:`ShardedCheckpointFolderError` and leaves everything else to the ``CheckpointIO`` it wraps."""

    def __init__(self, strategy: Strategy, wrapped: CheckpointIO) -> None:
        self.strategy = strategy
        self.wrapped = wrapped

    @classmethod
    def install(cls, strategy: Strategy) -> None:
        """Wrap ``strategy``'s ``CheckpointIO`` unless it reads folders itself (``RecStrategy``) or is wrapped."""
        if isinstance(strategy, EmbeddingShardingStrategy) or isinstance(strategy.checkpoint_io, cls):
            return
        strategy.checkpoint_io = cls(strategy, strategy.checkpoint_io)  # Lightning's getter: a default one

    @classmethod
    def uninstall(cls, strategy: Strategy) -> None:
        """Undo :meth:`install` (nothing when it did not wrap)."""
        if isinstance(strategy.checkpoint_io, cls):
            strategy.checkpoint_io.release()

    def release(self) -> None:
        """Give the strategy its own ``CheckpointIO`` back (if this one is still in place)."""
        if self.strategy.checkpoint_io is self:
            self.strategy.checkpoint_io = self.wrapped

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: object | None = None
    ) -> None:
        self.wrapped.save_checkpoint(checkpoint, path, storage_options=storage_options)

    @override
    def load_checkpoint(
        self, path: str | Path, map_location: object | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if is_sharded_checkpoint(path):
            self.release()
            name = type(self.strategy).__name__
            raise ShardedCheckpointFolderError(
                f"{os.fspath(path)!r} is a sharded checkpoint folder written by RecStrategy, which this Trainer's "
                f"strategy ({name}) cannot read: it reads single-file checkpoints. Pass strategy=RecStrategy(...) "
                "(it reads the folder on any number of devices), or consolidate it into one file with "
                f"`lightrec consolidate {os.fspath(path)} full.ckpt` and pass full.ckpt"
            )
        loaded: dict[str, Any] = self.wrapped.load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        return loaded

    @override
    def remove_checkpoint(self, path: str | Path) -> None:
        self.wrapped.remove_checkpoint(path)

    @override
    def teardown(self) -> None:
        self.wrapped.teardown()

    def __getattr__(self, name: str) -> object:  # the wrapped one's own attributes (AsyncCheckpointIO's ...)
        if name in ("strategy", "wrapped"):  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.wrapped, name)
