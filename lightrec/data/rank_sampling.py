"""Rank-aware reading of batch-level datasets.

Every lightrec dataset is map-style with one whole batch per index. Ranks split the *batch
indices*: with ``world_size`` ranks, step ``t`` of rank ``r`` reads global batch ``t * world_size + r``
(after an optional seeded shuffle of all batch indices), so ranks see disjoint data, every rank
runs the same number of steps (a remainder of fewer than ``world_size`` batches is dropped: a rank
with one step more would wait forever in a collective), and the batches of one step across ranks
are consecutive batches of the single-process order.

:class:`RankBatchSampler` subclasses ``DistributedSampler`` on purpose: Lightning leaves a
``DistributedSampler`` in place instead of wrapping the loader in its own (which would shard the
already sharded indices a second time), and calls ``set_epoch`` on it at every epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any, Protocol, TypedDict

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from lightrec.data.errors import check_at_least

__all__ = [
    "RankBatchSampler",
    "RankDataLoader",
    "RankLoaderState",
    "RankedTrainer",
    "check_rank",
    "rank_dataloader",
    "resolve_rank",
]


def check_rank(rank: int, world_size: int) -> None:
    """Validate a ``(rank, world_size)`` pair."""
    check_at_least(1, world_size=world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}")


class RankedTrainer(Protocol):
    """What :func:`resolve_rank` reads of a Lightning ``Trainer``."""

    @property
    def global_rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...


class RankLoaderState(TypedDict):
    """:meth:`RankDataLoader.state_dict`: the epoch and the samples of it trained (all ranks)."""

    epoch: int
    samples: int


def resolve_rank(trainer: RankedTrainer | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` from a Lightning trainer, else ``torch.distributed``, else ``(0, 1)``."""
    if trainer is not None:
        return int(trainer.global_rank), int(trainer.world_size)
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class RankBatchSampler(DistributedSampler):
    """Yields this rank's batch indices of a dataset of ``len(dataset)`` whole batches.

    Args:
        dataset: anything with ``len()``: the number of batches; at least ``world_size`` unless empty
            (fewer would leave a rank without a batch: ``ValueError``).
        rank / world_size: this rank and the number of ranks.
        shuffle: permute the batch order each epoch (seeded by ``seed + epoch``; same on all ranks).
        seed: shuffle seed.
    """

    def __init__(
        self, dataset: Sized, rank: int = 0, world_size: int = 1, shuffle: bool = False, seed: int = 0
    ) -> None:
        check_rank(rank, world_size)
        ds: Any = dataset  # DistributedSampler only calls len() on it
        super().__init__(ds, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)
        self.steps = len(dataset) // world_size
        if self.steps == 0 and len(dataset) > 0:
            # Lightning would end the fit at once ("No training batches") and exit 0, untrained.
            raise ValueError(
                f"{len(dataset)} batch(es) cannot be shared by {world_size} ranks: every rank needs at least one "
                f"batch per epoch; use at most {len(dataset)} device(s), or more (smaller) batches"
            )
        self.skip = 0  # global batches of this epoch's order already consumed (set on resume)

    def __iter__(self) -> Iterator[int]:
        total = self.steps * self.num_replicas
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g)[:total].tolist()  # type: ignore[arg-type]
        else:
            order = list(range(total))
        start = min(self.skip, total)
        end = start + (total - start) // self.num_replicas * self.num_replicas
        return iter(order[start + self.rank : end : self.num_replicas])

    def __len__(self) -> int:
        return self.steps


class RankDataLoader(DataLoader):
    """A ``DataLoader`` over a :class:`RankBatchSampler` that Lightning checkpoints mid-epoch.

    ``state_dict()`` records how far the epoch got in *samples* over all ranks (``{"epoch",
    "samples"}``); ``load_state_dict`` makes the next iteration *of that epoch* start right after
    them. Counting samples rather than steps lets a run resume on another number of ranks: with the
    same global batch (``batch_size`` per rank scaled by ``old_world / new_world``) the remaining
    batches of the epoch are the same samples, split over the new ranks. Lightning finds the two
    methods and saves the state in the checkpoint (its loops call them; nothing to do by hand).

    The position belongs to its epoch: a checkpoint written at the end of epoch ``e`` (the whole
    epoch read) resumes into epoch ``e + 1``, which Lightning announces with ``set_epoch(e + 1)``
    on the sampler before the first batch is read, and that epoch starts from its beginning.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.sampler, RankBatchSampler):
            raise TypeError(f"RankDataLoader needs a RankBatchSampler, got {type(self.sampler).__name__}")
        self._yielded = 0
        self._resume_skip = 0
        self._resume_epoch: int | None = None  # the epoch the loaded position belongs to
        # Batches read ahead by a pipelining callback (SparseDistPrefetch) and not trained on yet:
        # the checkpointed position leaves them out, so a resume trains them.
        self.prefetched = 0
        self._workers_epoch: int | None = None  # the epoch the dataset of persistent workers was set to

    @property
    def _rank_sampler(self) -> RankBatchSampler:
        """The loader's sampler (``rank_dataloader`` always gives it a ``RankBatchSampler``)."""
        sampler = self.sampler
        if not isinstance(sampler, RankBatchSampler):
            raise TypeError(f"RankDataLoader needs a RankBatchSampler, got {type(sampler).__name__}")
        return sampler

    def _samples_per_batch(self) -> int:
        return int(getattr(self.dataset, "batch_size", 1) or 1)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        sampler = self._rank_sampler
        # Read at the first batch, after Lightning's set_epoch: a position saved in another epoch
        # (the checkpoint of a finished epoch) says nothing about this one.
        resumes_this_epoch = self._resume_epoch is None or self._resume_epoch == sampler.epoch
        sampler.skip = self._resume_skip if resumes_this_epoch else 0
        self._resume_skip, self._resume_epoch = 0, None
        self._yielded = self.prefetched = 0
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):  # a dataset that reshuffles its rows per epoch (MovieLensDataset)
            set_epoch(sampler.epoch)
            if self._workers_epoch != sampler.epoch:
                # Persistent workers hold a copy of the dataset made when they started, which the
                # set_epoch above does not reach: start them again, with this epoch's dataset.
                self._iterator = None
            self._workers_epoch = sampler.epoch
        for batch in super().__iter__():
            self._yielded += 1  # counted as handed out: the loop consumed it
            yield batch

    def state_dict(self) -> RankLoaderState:
        sampler = self._rank_sampler
        batches = sampler.skip + (self._yielded - self.prefetched) * sampler.num_replicas
        return {"epoch": int(sampler.epoch), "samples": batches * self._samples_per_batch()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        per_batch = self._samples_per_batch()
        samples = int(state["samples"])
        if samples % per_batch:
            raise ValueError(
                f"the checkpoint stopped after {samples} samples of the epoch, which is not a whole number of "
                f"batches of {per_batch}; resume with a global batch size that divides it (keep "
                "batch_size x world size as it was)"
            )
        self._resume_skip = samples // per_batch
        self._resume_epoch = int(state["epoch"]) if "epoch" in state else None


def rank_dataloader(
    dataset: Sized,
    rank: int = 0,
    world_size: int = 1,
    shuffle: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
) -> DataLoader:
    """A ``DataLoader(batch_size=None)`` over this rank's batches of a batch-level dataset.

    Output order (and content) does not depend on ``num_workers``: the loader reassembles the
    batches in sampler order.
    """
    check_at_least(0, num_workers=num_workers)
    kwargs: dict[str, bool | int] = {}
    if num_workers > 0:
        kwargs["persistent_workers"] = persistent_workers
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
    return RankDataLoader(
        dataset,
        batch_size=None,
        sampler=RankBatchSampler(dataset, rank, world_size, shuffle=shuffle, seed=seed),
        num_workers=num_workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        **kwargs,
    )
