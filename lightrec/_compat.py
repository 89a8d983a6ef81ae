"""Every private Lightning import lightrec relies on, in one place.

Lightning moves private helpers between minor releases; when it does, this is the only file to
change. Public Lightning API is imported directly where it is used.
"""

from __future__ import annotations

from typing import Any

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.optimizer import _optimizers_to_device as optimizers_to_device
from lightning.pytorch.loops.fetchers import _PrefetchDataFetcher as PrefetchDataFetcher

__all__ = ["PrefetchDataFetcher", "default_pg_timeout", "fit_data_fetcher", "optimizers_to_device"]


def fit_data_fetcher(trainer: Any) -> PrefetchDataFetcher | None:
    """The fit loop's training data fetcher, or None (not set up yet, or a ``training_step`` that
    takes ``dataloader_iter`` and fetches its own batches).

    A ``PrefetchDataFetcher`` yields ``(batch, batch_idx, dataloader_idx)`` items read from its
    ``iterator``; when the loader has no length it holds the next item in ``batches`` (Lightning
    pre-reads one to know which batch is the last), otherwise ``batches`` stays empty.
    """
    fetcher = getattr(getattr(trainer, "fit_loop", None), "_data_fetcher", None)
    return fetcher if isinstance(fetcher, PrefetchDataFetcher) else None
