"""``RecThroughputMonitor`` callback: global samples/s, step time and memory every N training steps.

Named apart from Lightning's own ``lightning.pytorch.callbacks.ThroughputMonitor`` (samples/s and
FLOPs from a user-supplied ``batch_size_fn``, assuming a fixed batch size): this one counts each
batch's samples, times the slowest rank and reports embedding shard and optimizer-state memory,
gathered over ranks in one collective. ``ThroughputMonitor`` stays importable from
``lightrec.lightning`` as an alias of this class.

Every ``every_n_steps`` training steps each rank contributes one row
``[samples, seconds, peak RSS, CUDA max allocated, CUDA max reserved, embedding shard bytes,
embedding optimizer-state bytes]`` to one ``all_gather`` (a ``[W, 7]`` float64 tensor, so a
single small collective per window), and rank 0 logs, to every logger of the trainer, at the step of the
window's last batch (the step ``self.log`` gives that batch's ``train/loss``):

=========================================  ====================================================
tag (``prefix`` = ``"monitor/"``)          value
=========================================  ====================================================
``monitor/samples_per_sec``                samples of all ranks in the window / wall time of the
                                           slowest rank (data loading, forward, backward,
                                           optimizer, callbacks: everything but validation)
``monitor/step_time_ms``                   that wall time / steps in the window
``monitor/peak_rss_mib``                   max over ranks of the process's peak resident memory
                                           (``getrusage``; DataLoader workers not included)
``monitor/cuda_max_allocated_mib``         max over ranks of ``torch.cuda.max_memory_allocated``
``monitor/cuda_max_reserved_mib``          max over ranks of ``torch.cuda.max_memory_reserved``
``monitor/embedding_shard_mib``            max over ranks of the local embedding weights (this
                                           rank's shards, plus data-parallel replicas)
``monitor/embedding_optimizer_state_mib``  max over ranks of their fused optimizer state
=========================================  ====================================================

The two ``cuda_*`` tags are logged only when the model runs on a GPU, ``peak_rss_mib`` only
where ``resource`` exists (not Windows). Samples are counted from the batch (``Batch.labels``,
or the first dimension of the first tensor), so uneven last batches are counted exactly.

This is distinct from ``RecModule``'s ``train/samples_per_sec``: that one is logged every
``log_every_n_steps`` steps from one rank's batch size times the world size over the time between ``on_train_batch_start``
and ``on_train_batch_end`` (forward, backward and optimizer only), so it excludes data loading
and is a per-step figure; ``monitor/samples_per_sec`` is the end-to-end rate over a window.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import nn
from typing_extensions import override

from lightrec.distributed import ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from lightrec.lightning.callbacks.step_window import WindowedMonitor
from lightrec.lightning.contracts import FusedOptimizerModule
from lightrec.modules import EmbeddingBagCollection, EmbeddingCollection

__all__ = ["RecThroughputMonitor", "ThroughputMonitor", "embedding_memory_bytes"]

_COLLECTIONS = (
    ShardedEmbeddingBagCollection,
    ShardedEmbeddingCollection,
    EmbeddingBagCollection,
    EmbeddingCollection,
)
_MIB = 1024**2
_FIELDS = ("samples", "seconds", "rss", "cuda_alloc", "cuda_reserved", "shard", "optim")


def _batch_samples(batch: object) -> int:
    """Samples in ``batch``: its labels' first dimension, else the first tensor's (0 if none)."""
    labels = getattr(batch, "labels", None)  # any batch class with labels (lightrec's Batch, a user's)
    if isinstance(labels, torch.Tensor):
        return int(labels.shape[0]) if labels.dim() else 1
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        for item in batch:
            n = _batch_samples(item)
            if n:
                return n
    return 0


def _storage_bytes(tensors: Iterable[object], seen: set[int]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one flat buffer count once)."""
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.is_meta:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def embedding_memory_bytes(model: nn.Module) -> tuple[int, int]:
    """``(weights, fused optimizer state)`` bytes of the embedding collections held by this rank.

    Counts every outermost (sharded or plain) embedding collection of ``model``: the local shards
    and data-parallel replicas of a sharded one, all tables of a plain one.
    """
    seen: set[int] = set()  # shared: a state tensor that is a view of a weight is not counted twice
    weights = state = 0
    owners: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, _COLLECTIONS) or any(name.startswith(o + ".") for o in owners):
            continue
        owners.append(name)
        weights += _storage_bytes(list(module.parameters()) + list(module.buffers()), seen)
        optimizer = module.fused_optimizer if isinstance(module, FusedOptimizerModule) else None
        for per_param in (optimizer.state if optimizer is not None else {}).values():
            values = per_param.values() if isinstance(per_param, Mapping) else [per_param]
            state += _storage_bytes(values, seen)
    return weights, state


def _peak_rss_bytes() -> float:
    try:
        import resource
    except ImportError:  # Windows
        return math.nan
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


class RecThroughputMonitor(WindowedMonitor):
    """Log global samples/s, step time and memory every ``every_n_steps`` training steps.

    Args:
        every_n_steps: steps per window (optimizer steps: with ``accumulate_grad_batches=k`` a step is
            ``k`` batches); windows end at the steps ``every_n_steps - 1``, ``2 * every_n_steps - 1`` ...
            of the trainer's step counter (a resumed fit logs where an uninterrupted one does), and the
            last, shorter window of a fit is logged at train end.
        prefix: prefix of the logged keys.

    Every rank must run the callback (it all-gathers once per window); rank 0 writes the logs.
    :attr:`last_metrics` holds the values of the latest window on every rank.
    """

    def __init__(self, every_n_steps: int = 50, prefix: str = "monitor/") -> None:
        super().__init__("RecThroughputMonitor", every_n_steps)
        self.prefix = prefix
        self.last_metrics: dict[str, float] = {}
        self._reset()

    def _reset(self) -> None:
        self._samples = 0
        self._seconds = 0.0  # closed parts of the window (validation pauses it)
        self._started: float | None = None

    def _pause(self) -> None:
        if self._started is not None:
            self._seconds += time.perf_counter() - self._started
            self._started = None

    # ------------------------------------------------------------------ hooks
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        self._window.reset()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, batch_idx: int
    ) -> None:
        if self._started is None:
            self._started = time.perf_counter()
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: object, batch_idx: int
    ) -> None:
        self._samples += _batch_samples(batch)  # with accumulate_grad_batches=k, the samples of all k count
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()

    # ------------------------------------------------------------------ window
    def _local_row(self, pl_module: pl.LightningModule, device: torch.device) -> torch.Tensor:
        cuda = device.type == "cuda"
        shard, optim = embedding_memory_bytes(pl_module)
        row = [
            float(self._samples),
            self._seconds,
            _peak_rss_bytes(),
            float(torch.cuda.max_memory_allocated(device)) if cuda else math.nan,
            float(torch.cuda.max_memory_reserved(device)) if cuda else math.nan,
            float(shard),
            float(optim),
        ]
        return torch.tensor(row, dtype=torch.float64, device=device)

    @override
    def _flush(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()
        steps, step = self._window.steps, self._window.last_step
        self._window.reset()
        local = self._local_row(pl_module, trainer.strategy.root_device)
        rows = trainer.strategy.all_gather(local).reshape(-1, len(_FIELDS)).cpu()
        self._reset()
        # the next window starts now, so it includes the loading of its first batch
        self._started = time.perf_counter()
        col = {name: rows[:, i] for i, name in enumerate(_FIELDS)}
        seconds = max(float(col["seconds"].max()), 1e-9)
        metrics = {
            "samples_per_sec": float(col["samples"].sum()) / seconds,
            "step_time_ms": seconds / steps * 1e3,
            "peak_rss_mib": float(col["rss"].max()) / _MIB,
            "cuda_max_allocated_mib": float(col["cuda_alloc"].max()) / _MIB,
            "cuda_max_reserved_mib": float(col["cuda_reserved"].max()) / _MIB,
            "embedding_shard_mib": float(col["shard"].max()) / _MIB,
            "embedding_optimizer_state_mib": float(col["optim"].max()) / _MIB,
        }
        self.last_metrics = {self.prefix + k: v for k, v in metrics.items() if not math.isnan(v)}
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(self.last_metrics, step=step)


ThroughputMonitor = RecThroughputMonitor
"""The name ``RecThroughputMonitor`` had before 0.1; it shadowed Lightning's own ``ThroughputMonitor``."""
