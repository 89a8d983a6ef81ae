"""An unbounded stream of synthetic clicks, read in time order by every rank, resumable where it stopped.

:class:`~lightrec.data.SyntheticCriteoDataset` makes batch ``i`` of a split from ``(seed, split,
i)`` alone; a *stream* reads batches ``0, 1, 2, ...`` in order, with no end (or until
``max_batches``). With the drifting vocabulary (``vocabulary="drifting"``) batch ``i`` is also
*time* ``i``: its ids are the ones alive then, so reading in order is training online.

Ranks share the stream the way :class:`~lightrec.data.RankBatchSampler` shares an epoch::

    global batch:  0    1    2    3    4    5   ...      (W = 2 ranks)
    rank 0:        t=0       t=1       t=2
    rank 1:             t=0       t=1       t=2

so step ``t`` of rank ``r`` reads global batch ``start + t * W + r``, and with a fixed
``block_size`` two ranks of batch ``B`` see at every step the samples one rank of batch ``2B`` sees
-- with the fixed vocabulary; a drifting one drifts ``drift_per_batch`` per batch of ``B``, so it
takes ``2 * drift_per_batch`` at batch ``2B`` (the same drift per sample).

**The position** is the number of samples (all ranks) the model *trained on*: batches read minus
the one Lightning's fit loop holds read ahead of an unsized loader (``read_ahead``) minus those a
pipelining callback holds (``prefetched``, set by ``SparseDistPrefetch``). ``state_dict()`` returns
it with the batch size and a fingerprint of the stream's settings::

    {"samples": 204800, "batch_size": 512, "fingerprint": "3f9a0c..."}

Lightning saves it in every checkpoint and hands it back before the first batch of a resumed fit,
which then continues at global batch ``samples / batch_size``: no batch trained twice, none
skipped. Another number of ranks may resume it (the position is global), another batch size too
if it divides the position, ``block_size`` is fixed and -- with the drifting vocabulary -- the drift
per sample ``drift_per_batch / batch_size`` is the same; other stream settings may not
(:class:`~lightrec.data.errors.ResumeMismatchError`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypedDict

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lightrec.data.batch import Batch
from lightrec.data.errors import ResumeMismatchError
from lightrec.data.rank_sampling import check_rank
from lightrec.data.synthetic.criteo import SyntheticCriteoDataset

__all__ = ["UNBOUNDED_BATCHES", "StreamShard", "StreamState", "SyntheticStreamLoader", "stream_fingerprint"]

UNBOUNDED_BATCHES = 1 << 48
"""The length of an "unbounded" stream's dataset: ~2.8e14 batches, more than any run reads."""


class StreamState(TypedDict):
    """:meth:`SyntheticStreamLoader.state_dict`: the samples trained (all ranks), the batch size, the fingerprint."""

    samples: int
    batch_size: int
    fingerprint: str


def stream_fingerprint(settings: Mapping[str, object]) -> str:
    """A short hash of the settings that fix a stream's samples (seed, tables, vocabulary, drift per sample, ...)."""
    text = json.dumps(dict(settings), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class StreamShard(IterableDataset):
    """One rank's batches of a stream from global batch ``start`` on; in loader worker ``w`` of ``n``,
    this rank's steps ``w, w + n, ...`` (the loader hands them out round-robin, so in order).

    Args:
        dataset: the batches (item ``i`` = global batch ``i``).
        start: the first global batch of the stream part read.
        rank / world_size: this rank and the number of ranks.
        steps: this rank's batches to read.
    """

    def __init__(self, dataset: SyntheticCriteoDataset, start: int, rank: int, world_size: int, steps: int) -> None:
        self.dataset, self.start, self.rank, self.world_size, self.steps = dataset, start, rank, world_size, steps

    def __iter__(self) -> Iterator[Batch]:
        worker = get_worker_info()
        first, step = (0, 1) if worker is None else (worker.id, worker.num_workers)
        for t in range(first, self.steps, step):
            yield self.dataset[self.start + t * self.world_size + self.rank]


class SyntheticStreamLoader:
    """This rank's batches of a synthetic stream, in time order, with a checkpointable position.

    An iterable without ``len()`` (Lightning runs it as one endless epoch; ``max_steps`` or
    ``max_batches`` ends it). Each iteration continues where the trained part of the stream ends.

    Args:
        dataset: the stream's batches (item ``i`` = global batch ``i``); its ``len()`` bounds the stream.
        rank / world_size: this rank and the number of ranks.
        num_workers: loader processes (0: make the batches in the training process).
        pin_memory: pin the batches (for asynchronous copies to a GPU).
        prefetch_factor: batches each worker makes ahead.
        fingerprint: :func:`stream_fingerprint` of the settings; a checkpoint of another stream is refused.

    Attributes:
        read_ahead: batches the consumer reads before training the first one and keeps one ahead
            after (1: Lightning's fit loop over an unsized loader; 0 when iterating by hand).
        prefetched: batches a pipelining callback holds and has not trained (``SparseDistPrefetch``).
    """

    def __init__(
        self,
        dataset: SyntheticCriteoDataset,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int = 2,
        fingerprint: str = "",
    ) -> None:
        check_rank(rank, world_size)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0 (0: make batches in the training process), got {num_workers!r}")
        self.dataset, self.rank, self.world_size = dataset, rank, world_size
        self.num_workers, self.pin_memory, self.prefetch_factor = num_workers, pin_memory, prefetch_factor
        self.fingerprint = fingerprint
        self.batch_size = dataset.batch_size
        self.read_ahead = 1
        self.prefetched = 0
        self._start = 0  # global batch this iteration started at
        self._yielded = 0
        self._ended = False

    @property
    def trained_batches(self) -> int:
        """Global batches (all ranks) trained on so far: the stream position in batches."""
        held = 0 if self._ended or self._yielded == 0 else self.read_ahead
        return self._start + max(self._yielded - held - self.prefetched, 0) * self.world_size

    def __iter__(self) -> Iterator[Batch]:
        start = self.trained_batches
        steps = max(len(self.dataset) - start, 0) // self.world_size
        self._start, self._yielded, self._ended, self.prefetched = start, 0, False, 0
        shard = StreamShard(self.dataset, start, self.rank, self.world_size, steps)
        if self.num_workers == 0:
            batches: Iterable[Batch] = shard
        else:
            batches = DataLoader(
                shard, batch_size=None, num_workers=self.num_workers, prefetch_factor=self.prefetch_factor,
                pin_memory=self.pin_memory and torch.cuda.is_available(),
            )  # fmt: skip
        pin = self.pin_memory and self.num_workers == 0 and torch.cuda.is_available()
        for batch in batches:
            self._yielded += 1
            yield batch.pin_memory() if pin else batch
        self._ended = True

    def state_dict(self) -> StreamState:
        """The position: samples trained (all ranks), the batch size and the stream's fingerprint."""
        return {
            "samples": self.trained_batches * self.batch_size,
            "batch_size": self.batch_size,
            "fingerprint": self.fingerprint,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after the samples ``state`` says were trained (at the next iteration).

        Raises:
            ResumeMismatchError: the state is not a stream position, belongs to another stream, or
                its samples are not a whole number of this loader's batches.
        """
        if "samples" not in state:
            raise ResumeMismatchError(
                f"the checkpoint's data position has no 'samples' (keys {sorted(state)}): it was not written by a "
                "synthetic stream; resume with the data it was trained on"
            )
        theirs = str(state.get("fingerprint", ""))
        if theirs and self.fingerprint and theirs != self.fingerprint:
            hint = ""
            if self.dataset.vocabulary == "drifting" and int(state.get("batch_size", self.batch_size)) != self.batch_size:
                hint = (
                    f"; its batch size was {state['batch_size']}, not {self.batch_size}, and the drifting vocabulary "
                    "drifts drift_per_batch per batch: resume with its batch size, or scale drift_per_batch with it"
                )
            raise ResumeMismatchError(
                "the checkpoint trained on a synthetic stream with other settings (seed, tables, vocabulary, drift per "
                "sample, block_size ...), so its position means other samples here; resume with the same data "
                f"settings{hint}"
            )
        samples = int(state["samples"])
        if samples % self.batch_size:
            raise ResumeMismatchError(
                f"the checkpoint stopped after {samples} samples of the stream, not a whole number of batches of "
                f"{self.batch_size}; resume with a batch size that divides it (and a fixed block_size)"
            )
        self._start, self._yielded, self._ended, self.prefetched = samples // self.batch_size, 0, False, 0
