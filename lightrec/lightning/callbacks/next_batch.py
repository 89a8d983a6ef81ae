"""``NextTrainingBatch``: read, and replace, the training batch that comes after the current one.

Pipelined training (``SparseDistPrefetch``) moves batch i+1 to the device and starts its input dist
while batch i trains, and hands Lightning the moved batch so it is not copied twice. Lightning 2.6
has **no public hook for this**: a callback's ``on_train_batch_start`` sees the current batch only,
and the public way to see further ahead -- a ``training_step(self, dataloader_iter)`` -- moves
fetching into the user's own step. So this one adapter reaches into the fit loop's data fetcher
(``lightrec._compat.fit_data_fetcher`` finds it; its ``batches``, ``iterator`` and ``done``
attributes are read and written here and nowhere else). Everything around it uses public hooks:
the callback's ``on_train_batch_start`` / ``on_before_backward`` / ``on_train_batch_end`` /
``on_train_epoch_end``, and ``strategy.batch_to_device`` to move the batch.

Where batch i+1 is: a loader without length makes Lightning read one item ahead (it holds it in
``fetcher.batches``); for a sized loader the adapter wraps the fetcher's iterator in a
:class:`PeekingIterator` that reads one item ahead. The fetcher still receives every item once, so
its accounting of which batch is the last is unchanged; a resumable loader (``RankDataLoader``)
is told that one batch is held, so its checkpointed position leaves that batch out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import lightning.pytorch as pl

from lightrec._compat import fit_data_fetcher

__all__ = ["NextTrainingBatch", "PeekingIterator", "UnsupportedFetch"]

_NOTHING = object()


class PeekingIterator(Iterator[object]):
    """An iterator whose next item can be read, and replaced, one step early.

    Args:
        inner: the wrapped iterator.
        loaders: resumable loaders (with a ``prefetched`` attribute) told how many items are held.
    """

    def __init__(self, inner: Iterator[object], loaders: Sequence[object] = ()) -> None:
        self.inner = inner
        self._next: object = _NOTHING
        self._exhausted = False
        # Resumable loaders count a batch as consumed when it is read; one held here has not been
        # trained on yet, so their checkpointed position must leave it out.
        self._loaders = list(loaders)

    def _holding(self, n: int) -> None:
        for loader in self._loaders:
            setattr(loader, "prefetched", n)  # noqa: B010 - RankDataLoader's count, on loaders that have one

    def __iter__(self) -> PeekingIterator:
        return self

    def __next__(self) -> object:
        if self._next is not _NOTHING:
            item, self._next = self._next, _NOTHING
            self._holding(0)
            return item
        if self._exhausted:
            raise StopIteration
        return next(self.inner)

    def peek(self) -> object:
        """The next item (read from the wrapped iterator now if needed), or None at the end."""
        if self._next is _NOTHING and not self._exhausted:
            try:
                self._next = next(self.inner)
                self._holding(1)
            except StopIteration:
                self._exhausted = True
        return None if self._next is _NOTHING else self._next

    def replace(self, item: object) -> None:
        self._next = item


def _resumable_loaders(trainer: pl.Trainer) -> list[object]:
    """The training loaders that checkpoint their position and can leave out a held batch."""
    loaders = trainer.train_dataloader
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    elif not isinstance(loaders, (list, tuple)):
        loaders = [loaders]
    return [loader for loader in loaders if hasattr(loader, "prefetched")]


class UnsupportedFetch(Exception):
    """The fit does not fetch its training batches the way this adapter can read ahead."""


class NextTrainingBatch:
    """The batch after the current one of a running fit, and a way to replace it (module docstring)."""

    def slot(self, trainer: pl.Trainer) -> tuple[object, Callable[[object], None]] | None:
        """``(next batch, function that replaces it)``, or None when the epoch has no next batch.

        Raises:
            UnsupportedFetch: ``training_step`` takes ``dataloader_iter``, or Lightning yields items of
                another shape than ``(batch, batch_idx, dataloader_idx)``.
        """
        fetcher = fit_data_fetcher(trainer)
        if fetcher is None:
            raise UnsupportedFetch("training_step takes dataloader_iter (it fetches its own batches)")
        if fetcher.batches:  # a loader without length: Lightning already holds the next item
            held = self._checked(fetcher.batches[0])

            def put_held(batch: object) -> None:
                fetcher.batches[0] = (batch, *held[1:])

            return held[0], put_held
        if fetcher.done or fetcher.iterator is None:
            return None
        if not isinstance(fetcher.iterator, PeekingIterator):  # a fresh iterator every epoch
            fetcher.iterator = PeekingIterator(fetcher.iterator, _resumable_loaders(trainer))
        peeking: PeekingIterator = fetcher.iterator
        item = peeking.peek()
        if item is None:
            return None
        peeked = self._checked(item)

        def put_peeked(batch: object) -> None:
            peeking.replace((batch, *peeked[1:]))

        return peeked[0], put_peeked

    @staticmethod
    def _checked(item: object) -> tuple[object, ...]:
        """A fetcher item ``(batch, batch_idx, dataloader_idx)``, checked."""
        if not (isinstance(item, tuple) and len(item) == 3):
            raise UnsupportedFetch(f"unexpected data fetcher item {type(item).__name__} (Lightning changed?)")
        return item
