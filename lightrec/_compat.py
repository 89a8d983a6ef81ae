"""Everything lightrec uses that differs between the releases it supports, in one place.

Two kinds of things live here:

* **torch APIs that moved within the supported range** (``torch>=2.11,<2.15``, see
  ``pyproject.toml``): importing this module imports torch only, so every room may use these
  shims. When lightrec starts to use an API newer than the oldest supported torch, it goes here,
  with the release that introduced it;
* **private Lightning imports** -- Lightning moves private helpers between minor releases; when it
  does, this is the only file to change. They are resolved on first access (module
  ``__getattr__``), so the rooms below ``lightrec.lightning`` can import this module without
  importing Lightning. Public Lightning API is imported directly where it is used.

The torch APIs lightrec reads directly are checked against the running torch by
``tests/test_torch_compat.py`` (so running the suite on the oldest and newest supported torch
finds an API used outside this file that one of them lacks).
"""

from __future__ import annotations

import functools
import inspect
import logging
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch.fx import ProxyableClassMeta, _symbolic_trace
from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "PrefetchDataFetcher",
    "TORCH_VERSION",
    "all_gather_single",
    "ddp_buffer_sync",
    "default_pg_timeout",
    "fit_data_fetcher",
    "is_fx_symbolic_tracing",
    "logging_step",
    "optimizers_to_device",
    "proxyable_call",
    "set_logging_step",
    "reduce_scatter_single",
    "silence_known_warnings",
    "stop_hp_metric_placeholder",
    "timeout_of",
]

#: ``(major, minor)`` of the running torch.
TORCH_VERSION: tuple[int, int] = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])  # type: ignore[assignment]


# ---------------------------------------------------------------------------------------------- torch
# torch.fx: `is_fx_tracing()` is deprecated (2.11+ log "is_fx_tracing will return true for both
# fx.symbolic_trace and torch.export" once per process, from an lru_cache-d function) in favour of
# `is_fx_symbolic_tracing()` (only fx.symbolic_trace) and `torch.compiler.is_compiling()` (compile /
# export). torch's own `ProxyableClassMeta.__call__` -- the metaclass behind lightrec's sparse types --
# still calls the deprecated one, so building a KeyedJaggedTensor printed that line in every process.

if hasattr(_symbolic_trace, "is_fx_symbolic_tracing"):
    # torch's own function (scriptable as torch wrote it: callers keep their TorchScript behaviour)
    is_fx_symbolic_tracing = _symbolic_trace.is_fx_symbolic_tracing
else:  # pragma: no cover - a torch without the split names one flag for both kinds of tracing

    def is_fx_symbolic_tracing() -> bool:
        """Whether ``torch.fx.symbolic_trace`` is tracing (not ``torch.compile`` / ``torch.export``)."""
        return bool(getattr(_symbolic_trace, "_is_fx_tracing_flag", False)) and not torch.compiler.is_compiling()


def _consume_is_fx_tracing_deprecation() -> None:
    """Spend torch's once-per-process "is_fx_tracing will return true ..." log line with its logger muted.

    The line comes from an ``lru_cache``-d function: calling it once, muted, consumes it.
    """
    once = getattr(_symbolic_trace, "is_fx_tracing_warning", None)
    if callable(once):
        fx_log = logging.getLogger(_symbolic_trace.__name__)
        disabled, fx_log.disabled = fx_log.disabled, True
        try:
            once()
        finally:
            fx_log.disabled = disabled


def proxyable_call(cls: ProxyableClassMeta, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Construct ``cls(*args, **kwargs)``, ``cls`` being a class of metaclass ``torch.fx.ProxyableClassMeta``.

    Outside ``torch.fx.symbolic_trace`` (eager, ``torch.compile``, ``torch.export``) the class is
    built as any class is (``type.__call__``): what ``ProxyableClassMeta`` does there too, minus its
    call of the deprecated ``is_fx_tracing``. While fx traces, ``ProxyableClassMeta``'s own path runs
    (a constructor call with proxy arguments becomes one graph node), with torch's deprecation line
    consumed silently first.
    """
    if not is_fx_symbolic_tracing():
        return type.__call__(cls, *args, **kwargs)
    _consume_is_fx_tracing_deprecation()
    return ProxyableClassMeta.__call__(cls, *args, **kwargs)


@functools.cache
def silence_known_warnings() -> None:
    """Silence two warnings about Lightning's internals that every training process repeats.

    Lightning 2.6 on torch 2.13+ warns "``isinstance(treespec, LeafSpec)`` is deprecated" from
    its own ``utilities/_pytree.py`` on every stage of every rank, and that
    ``torch.distributed.nn.functional.all_gather`` is deprecated from its own ``all_gather``.
    (torch's "is_fx_tracing will return true ..." line is not silenced here: lightrec no longer
    calls ``is_fx_tracing``, see :func:`proxyable_call`.)

    Idempotent; called on import of ``lightrec.lightning``. Other warnings are left alone.
    """
    warnings.filterwarnings(
        "ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated", category=Warning
    )
    warnings.filterwarnings(
        "ignore",
        message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated",
        module=r"lightning\.fabric\.utilities\.distributed",
    )


class SingleCollective(Protocol):
    """A tensor-shaped collective: fills ``output`` from every rank's ``input``; returns a work handle
    when ``async_op`` (else None)."""

    def __call__(
        self, output: torch.Tensor, input: torch.Tensor, *, group: dist.ProcessGroup | None = ..., async_op: bool = ...
    ) -> Any: ...


def _single_collective(new_name: str, old: Callable[..., Any]) -> SingleCollective:
    """``torch.distributed.<new_name>`` where this torch has it, else ``old`` (same signature)."""
    chosen: SingleCollective = getattr(dist, new_name, old)
    return chosen


# torch 2.13 renamed the tensor-shaped collectives: `reduce_scatter_single` / `all_gather_single`
# (the old `reduce_scatter_tensor` / `all_gather_into_tensor` still exist there, deprecated with a
# FutureWarning); torch 2.11 and 2.12 only have the old names. Same signatures; chosen at import.

#: Sum ``input`` ``[W * n, ...]`` over the ranks of ``group``; rank r receives rows ``[r * n, (r + 1) * n)``
#: in ``output`` ``[n, ...]``. ``dist.reduce_scatter_single`` on torch >= 2.13, else ``dist.reduce_scatter_tensor``.
reduce_scatter_single: SingleCollective = _single_collective("reduce_scatter_single", dist.reduce_scatter_tensor)
#: Concatenate every rank's ``input`` ``[n, ...]`` into ``output`` ``[W * n, ...]`` in rank order.
#: ``dist.all_gather_single`` on torch >= 2.13, else ``dist.all_gather_into_tensor``.
all_gather_single: SingleCollective = _single_collective("all_gather_single", dist.all_gather_into_tensor)


# torch 2.13 added DistributedDataParallel(forward_sync_buffers=...) and deprecated
# broadcast_buffers (FutureWarning); torch 2.11 only has broadcast_buffers, which with False also
# leaves buffers out of DDP's initial sync (lightrec passes False only for buffers that are the same
# on every rank by construction: integer index tables).
@functools.lru_cache(maxsize=1)
def _ddp_parameters() -> frozenset[str]:
    return frozenset(inspect.signature(DistributedDataParallel.__init__).parameters)


def ddp_buffer_sync(every_forward: bool) -> dict[str, bool]:
    """The ``DistributedDataParallel`` keyword that (de)activates broadcasting the module's buffers
    at every forward: ``forward_sync_buffers`` where torch has it (>= 2.13), else ``broadcast_buffers``."""
    if "forward_sync_buffers" in _ddp_parameters():
        return {"forward_sync_buffers": every_forward}
    return {"broadcast_buffers": every_forward}


# ------------------------------------------------------------------------------------------ Lightning
if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
    from lightning.fabric.utilities.optimizer import _optimizers_to_device as optimizers_to_device
    from lightning.pytorch.loops.fetchers import _PrefetchDataFetcher as PrefetchDataFetcher


def _lightning_private(name: str) -> Any:
    if name == "default_pg_timeout":
        from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

        return default_pg_timeout
    if name == "optimizers_to_device":
        from lightning.fabric.utilities.optimizer import _optimizers_to_device

        return _optimizers_to_device
    if name == "PrefetchDataFetcher":
        from lightning.pytorch.loops.fetchers import _PrefetchDataFetcher

        return _PrefetchDataFetcher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    value = _lightning_private(name)
    globals()[name] = value  # resolved once
    return value


def logging_step(trainer: pl.Trainer) -> int:
    """The step ``LightningModule.log`` uses for the current training batch.

    It counts batches that stepped the optimizer (the training epoch loop's private
    ``_batches_that_stepped``; ``global_step`` counts optimizer steps, which differs with several
    optimizers and is already incremented in ``on_train_batch_end``). Lightning's own
    ``DeviceStatsMonitor`` and ``LearningRateMonitor`` read the same counter.
    """
    return int(getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step))


def set_logging_step(trainer: pl.Trainer, step: int) -> None:
    """Set the step Lightning logs training metrics at (the training epoch loop's private
    ``_batches_that_stepped``: one per optimizer step, restored from checkpoints)."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = step


def stop_hp_metric_placeholder(logger: object) -> None:
    """Stop a ``TensorBoardLogger`` from writing Lightning's ``hp_metric = -1`` placeholder when its
    next stage starts (the private ``_default_hp_metric``; only settable at construction otherwise).
    Other loggers are left alone."""
    if isinstance(getattr(logger, "_default_hp_metric", None), bool):
        setattr(logger, "_default_hp_metric", False)  # noqa: B010 (a private attribute, not in the type)


def fit_data_fetcher(trainer: pl.Trainer) -> PrefetchDataFetcher | None:
    """The fit loop's training data fetcher (a ``PrefetchDataFetcher``), or None (not set up yet,
    or a ``training_step`` that takes ``dataloader_iter`` and fetches its own batches).

    A ``PrefetchDataFetcher`` yields ``(batch, batch_idx, dataloader_idx)`` items read from its
    ``iterator``; when the loader has no length it holds the next item in ``batches`` (Lightning
    pre-reads one to know which batch is the last), otherwise ``batches`` stays empty.
    """
    fetcher = getattr(getattr(trainer, "fit_loop", None), "_data_fetcher", None)
    return fetcher if isinstance(fetcher, _lightning_private("PrefetchDataFetcher")) else None


def timeout_of(pg: dist.ProcessGroup | None) -> timedelta | None:
    """The timeout ``pg`` (default: the world) was created with; None when torch does not say.

    torch has no public getter (torch 2.11-2.14 keep it on the backend's private ``options``): groups that
    lightrec makes beside the user's take that group's timeout from here instead of torch's 30-minute default.
    """
    try:
        group = pg if pg is not None else dist.group.WORLD
        if group is None:
            return None
        device = torch.device("cuda" if dist.get_backend(group) == "nccl" else "cpu")
        timeout: timedelta = group._get_backend(device).options._timeout
        return timeout
    except (AttributeError, RuntimeError, ValueError):
        return None
