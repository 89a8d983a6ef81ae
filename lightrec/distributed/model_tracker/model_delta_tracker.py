"""``ModelDeltaTrackerTrec``: which rows of a sharded model changed since a consumer last asked.

torchrec 1.8's tracker under its names and call shapes::

    dmp = DistributedModelParallel(model, ...)
    tracker = dmp.init_torchrec_delta_tracker(DeltaTrackerConfig(consumers=["publisher", "checkpoint"]))
    for batch in batches:
        dmp(batch).sum().backward()                      # each lookup records its ids
        if step % 100 == 0:
            changed = tracker.get_unique_ids("publisher")   # {fqn: unique global row ids on this rank}

Recording is a by-product of the lookup: every grouped lookup of every sharded collection calls
:meth:`ModelDeltaTrackerTrec.on_lookup` with the KJT it read (a list append of references; no
copy, no unique, no host read on an accelerator), and a managed-collision eviction reports the rows
it reset. On the CPU only the ids and the per-key offsets are kept until the read (the KJT's lengths
and offsets would double what the heap holds); on an accelerator, where the offsets would cost a
host sync per lookup, the KJT is kept and its offsets are read at the flush. At
read time (or at each step with ``auto_compact``) the recorded lookups become, per table FQN, the
global row ids of this rank's shards (``local id + shard row offset``), then unique.

Semantics (each consumer is independent; ``delete_on_read`` drops what all of them have read):

* a read returns the rows looked up since that consumer's previous read, on this rank: the rows
  of the shards it holds (row-wise: its row block; column-wise: every row of its column slice; a
  data-parallel table: the rows *this rank's* batches looked up -- every replica applies every
  rank's update, so the rows that changed are the union over ranks, which
  ``lightrec.distributed.deltas.publish_changes`` takes);
* ids are **global row indices** of the table (torchrec returns shard-local ones): one set of ids
  means the same rows on every rank, which is what a publisher gathers by;
* a managed-collision table reports rows (not raw ids) -- the rows ids were remapped to, and the
  rows an eviction reset -- the id each row now holds is in its id map;
* a read closes the current batch: lookups after it belong to the next window even when nothing
  calls :meth:`step` (``DistributedModelParallel.forward`` does, as torchrec's does). Read after
  the backward (rows are updated inside it), e.g. in ``on_train_batch_end``.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterable

import torch
from torch import nn

from lightrec.distributed.embedding import ShardedEmbeddingCollection
from lightrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from lightrec.distributed.model_tracker.delta_store import DeltaStoreTrec
from lightrec.distributed.model_tracker.row_states import check_mode, live_states, states_at_lookup
from lightrec.distributed.model_tracker.tables import LookupKeys, TrackedTable, find_tables
from lightrec.distributed.model_tracker.types import TrackingMode, UniqueRows, UpdateMode
from lightrec.distributed.sharding.collection import ShardedCollectionBase
from lightrec.distributed.sharding.lookups import GroupedLookup
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["SUPPORTED_MODULES", "UPDATE_MODE_MAP", "ModelDeltaTracker", "ModelDeltaTrackerTrec"]

logger = logging.getLogger(__name__)

UPDATE_MODE_MAP: dict[TrackingMode, UpdateMode] = {
    TrackingMode.ID_ONLY: UpdateMode.NONE,
    TrackingMode.EMBEDDING: UpdateMode.FIRST,  # the row before the window's updates
    TrackingMode.MOMENTUM_LAST: UpdateMode.LAST,  # read live when asked (the latest)
    TrackingMode.MOMENTUM_DIFF: UpdateMode.FIRST,  # the accumulator at the first lookup; minus it when read
    TrackingMode.ROWWISE_ADAGRAD: UpdateMode.FIRST,
}
"""torchrec's map from a tracking mode to the state a repeated id keeps."""

# Every sharded collection is tracked (managed-collision and feature-processed ones derive from these).
SUPPORTED_MODULES: tuple[type[nn.Module], ...] = (ShardedEmbeddingCollection, ShardedEmbeddingBagCollection,
                                                  ShardedCollectionBase)  # fmt: skip


class ModelDeltaTracker(abc.ABC):
    """torchrec's interface of a delta tracker (``record_lookup``, reads by consumer, ``clear``, ``step``)."""

    DEFAULT_CONSUMER: str = "default"

    @abc.abstractmethod
    def record_lookup(self, kjt: KeyedJaggedTensor, states: torch.Tensor, emb_module: nn.Module | None = None,
                      raw_ids: torch.Tensor | None = None) -> None:  # fmt: skip
        """Record that ``emb_module`` looked up ``kjt`` and produced ``states``."""

    @abc.abstractmethod
    def get_unique_ids(self, consumer: str | None = None) -> dict[str, torch.Tensor]:
        """``{table fqn: unique ids}`` looked up since ``consumer`` last read."""

    @abc.abstractmethod
    def get_unique(self, consumer: str | None = None, top_percentage: float | None = 1.0,
                   per_table_percentage: dict[str, tuple[float, str]] | None = None,
                   sorted_by_indices: bool | None = True) -> dict[str, UniqueRows]:  # fmt: skip
        """``{table fqn: UniqueRows}`` since ``consumer`` last read."""

    @abc.abstractmethod
    def clear(self, consumer: str | None = None) -> None:
        """Forget what was recorded (for every consumer, or for ``consumer``)."""

    def step(self) -> None:  # noqa: B027 - torchrec's optional hook, a no-op by default
        """Advance the batch index (``DistributedModelParallel.forward`` calls it before each forward)."""


class ModelDeltaTrackerTrec(ModelDeltaTracker):
    """The tracker of lightrec's sharded collections (see the module docstring).

    Args:
        model: a ``DistributedModelParallel`` or a module holding sharded collections.
        consumers: names of the readers (None: ``["default"]``).
        delete_on_read: drop what every consumer has read.
        auto_compact: merge the recorded lookups into unique ids at every :meth:`step` (bounded
            memory; a unique per step) instead of at read time only.
        mode: what is kept besides the ids (:class:`TrackingMode`).
        fqns_to_skip: path components of collections not to track.

    Raises:
        ValueError: no sharded collection, or consumers that repeat.
        UnsupportedTrackingError: ``mode`` needs state a tracked table does not have.
    """

    def __init__(
        self,
        model: nn.Module,
        consumers: list[str] | None = None,
        delete_on_read: bool = True,
        auto_compact: bool = False,
        mode: TrackingMode = TrackingMode.ID_ONLY,
        fqns_to_skip: Iterable[str] = (),
    ) -> None:
        names = list(consumers) if consumers else [self.DEFAULT_CONSUMER]
        if len(set(names)) != len(names) or not all(isinstance(c, str) and c for c in names):
            raise ValueError(f"consumers must be distinct non-empty names, got {consumers!r}")
        if not isinstance(mode, TrackingMode):
            raise ValueError(f"mode must be a TrackingMode, got {mode!r}; one of {[m.name for m in TrackingMode]}")
        self._model = model
        self._mode = mode
        self._delete_on_read = delete_on_read
        self._auto_compact = auto_compact
        self._fqns_to_skip = list(fqns_to_skip)
        self._tables, self._lookups = find_tables(model, self._fqns_to_skip)
        check_mode(mode, self._tables)
        # MOMENTUM_LAST reads its state live when asked; the store keeps ids only then.
        stored = UpdateMode.NONE if mode == TrackingMode.MOMENTUM_LAST else UPDATE_MODE_MAP[mode]
        self.store = DeltaStoreTrec(stored)
        self.per_consumer_batch_idx: dict[str, int] = dict.fromkeys(names, -1)
        self.curr_batch_idx = 0
        self.curr_compact_index = 0
        # Per training lookup until the next read: (batch, lookup, ids, states). The ids are
        # (values [n], offset per key [keys + 1]) where the offsets are known without a host sync
        # (module docstring), else the KJT itself.
        self._pending: list[tuple[int, GroupedLookup, _RecordedIds, torch.Tensor | None]] = []
        self._resets: list[tuple[int, str, torch.Tensor, torch.Tensor | None]] = []
        self._removers: list[Callable[[], None]] = [lk.register_lookup_tracker(self) for lk, _ in self._lookups.values()]
        self._closed = False
        logger.info("delta tracker (%s) on %d tables, consumers %s", mode.name, len(self._tables), names)

    # ---- what is tracked ---------------------------------------------------------------------
    @property
    def mode(self) -> TrackingMode:
        return self._mode

    @property
    def tables(self) -> dict[str, TrackedTable]:
        """``{fqn: TrackedTable}`` of every tracked table (where this rank holds it)."""
        return dict(self._tables)

    def get_tracked_modules(self) -> dict[str, nn.Module]:
        """``{collection path: sharded collection}`` of the tracked collections."""
        out: dict[str, nn.Module] = {}
        for fqn, table in self._tables.items():
            out.setdefault(fqn.rsplit(".", 2)[0].removesuffix("._embedding_module"), table.collection)
        return out

    def fqn_to_feature_names(self) -> dict[str, list[str]]:
        """``{table fqn: the features read through it}``."""
        out: dict[str, list[str]] = {}
        for fqn, table in self._tables.items():
            configs = {c.name: c for c in table.collection._configs}
            out[fqn] = list(configs[table.name].feature_names)
        return out

    def close(self) -> None:
        """Stop recording (unregister from every lookup); what was recorded stays readable."""
        for remove in self._removers:
            remove()
        self._removers = []
        self._closed = True

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called: lookups are no longer recorded."""
        return self._closed

    # ---- recording (called by the lookups) ----------------------------------------------------
    def on_lookup(self, lookup: GroupedLookup, features: KeyedJaggedTensor, output: torch.Tensor) -> None:
        entry = self._lookups.get(id(lookup))
        if entry is None or entry[0] is not lookup:
            return
        states: torch.Tensor | None = None
        if self._mode == TrackingMode.EMBEDDING:
            states = output.detach()
        elif self._mode in (TrackingMode.MOMENTUM_DIFF, TrackingMode.ROWWISE_ADAGRAD):
            states = states_at_lookup(self._tables, entry[1], features)  # before the backward's update
        self._pending.append((self.curr_batch_idx, lookup, _recorded_ids(features), states))

    def on_rows_reset(self, lookup: GroupedLookup, table: str, rows: torch.Tensor) -> None:
        entry = self._lookups.get(id(lookup))
        if entry is None:
            return
        for key in entry[1].keys:
            if key is not None and key.table == table:
                fqn = key.fqn
                ids = rows.to(torch.int64) + key.row_offset
                states = None
                if self.store.updateMode != UpdateMode.NONE:  # the reset row's state, as a lookup would see it
                    states = live_states(self._mode, self._tables[fqn], ids, first=True)
                self._resets.append((self.curr_batch_idx, fqn, ids, states))
                return

    def record_lookup(self, kjt: KeyedJaggedTensor, states: torch.Tensor, emb_module: nn.Module | None = None,
                      raw_ids: torch.Tensor | None = None) -> None:  # fmt: skip
        """torchrec's recording entry: ``emb_module`` (a grouped lookup of a tracked collection)
        read ``kjt`` (its slot keys, shard-local ids) and returned ``states``."""
        if not isinstance(emb_module, GroupedLookup) or id(emb_module) not in self._lookups:
            raise ValueError("record_lookup needs emb_module= a grouped lookup of a tracked collection (lookups "
                             "record themselves; this entry exists for torchrec's call shape)")  # fmt: skip
        self.on_lookup(emb_module, kjt, states)

    def _flush(self) -> None:
        """Turn the recorded lookups into per-table global ids in the store (batch order kept)."""
        pending, resets = self._pending, self._resets
        self._pending, self._resets = [], []
        events: list[tuple[int, int, dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]]]] = []
        for order, (batch, lookup, recorded, states) in enumerate(pending):
            values, offsets = recorded if isinstance(recorded, tuple) else (recorded.values(), recorded.offset_per_key())
            events.append((batch, order, _per_table(self._lookups[id(lookup)][1], values, offsets, states)))
        for order, (batch, fqn, reset, reset_states) in enumerate(resets):
            events.append((batch, -len(resets) + order, {fqn: ([reset], [] if reset_states is None else [reset_states])}))
        events.sort(key=lambda e: (e[0], e[1]))  # resets of a batch came before its lookups
        for batch, _, per_table in events:
            for fqn, (ids, states_list) in per_table.items():
                cat = ids[0] if len(ids) == 1 else torch.cat(ids)
                joined = None if not states_list else states_list[0] if len(states_list) == 1 else torch.cat(states_list)
                self.store.append(batch, fqn, cat, joined)

    # ---- batch index and compaction ------------------------------------------------------------
    def step(self) -> None:
        if self._auto_compact:
            self.trigger_compaction()
        self.curr_batch_idx += 1

    def trigger_compaction(self) -> None:
        """Merge what was recorded since the newest consumer read into one unique entry per table."""
        if self.curr_compact_index > self.curr_batch_idx:
            return
        self._flush()
        start, end = max(self.per_consumer_batch_idx.values()), self.curr_batch_idx + 1
        if start < end:
            self.compact(start, end)
        self.curr_compact_index = end

    def compact(self, start_idx: int, end_idx: int) -> None:
        """Merge the entries of batches ``[start_idx, end_idx)`` into one unique entry per table."""
        self._flush()
        self.store.compact(start_idx, end_idx)

    # ---- reads -----------------------------------------------------------------------------------
    def _check_consumer(self, consumer: str | None) -> str:
        name = consumer or self.DEFAULT_CONSUMER
        if name not in self.per_consumer_batch_idx:
            raise KeyError(f"consumer {name!r} is not one of this tracker's consumers {list(self.per_consumer_batch_idx)}; "
                           "name it in DeltaTrackerConfig(consumers=[...])")  # fmt: skip
        return name

    def get_unique_ids(self, consumer: str | None = None) -> dict[str, torch.Tensor]:
        """``{table fqn: int64 unique global row ids}`` looked up on this rank since ``consumer``'s
        previous read (every tracked table, empty when none). A read: the consumer's window moves on."""
        return {fqn: rows.ids for fqn, rows in self.get_unique(consumer).items()}

    def get_unique(
        self,
        consumer: str | None = None,
        top_percentage: float | None = 1.0,
        per_table_percentage: dict[str, tuple[float, str]] | None = None,
        sorted_by_indices: bool | None = True,
    ) -> dict[str, UniqueRows]:
        """``{table fqn: UniqueRows(ids, states)}`` since ``consumer``'s previous read (module docstring).

        Args:
            consumer: which reader (None: ``"default"``).
            top_percentage: keep this fraction of each table's rows, those with the largest state
                (its L2 norm per row); 1.0 keeps all. Needs a mode with states.
            per_table_percentage: torchrec's per-table form of it; not supported (must be None).
            sorted_by_indices: ids ascending (True) or, with ``top_percentage``, largest state first.

        Raises:
            KeyError: an unknown consumer. ValueError: a percentage this mode cannot apply.
        """
        name = self._check_consumer(consumer)
        fraction = 1.0 if top_percentage is None else float(top_percentage)
        if per_table_percentage is not None:
            raise ValueError("per_table_percentage is not supported by lightrec's tracker; use top_percentage")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"top_percentage must be in (0, 1], got {top_percentage!r}")
        if fraction < 1.0 and self._mode == TrackingMode.ID_ONLY:
            raise ValueError("top_percentage < 1 ranks rows by their state; TrackingMode.ID_ONLY keeps none")
        self._flush()
        end = self.curr_batch_idx + 1
        start = max(self.per_consumer_batch_idx.values())
        if start < end:
            self.store.compact(start, end)
        found = self.store.get_unique(from_idx=self.per_consumer_batch_idx[name])
        self.per_consumer_batch_idx[name] = end
        self.curr_batch_idx = max(self.curr_batch_idx, end)  # later lookups belong to the next window
        if self._delete_on_read:
            self.store.delete(up_to_idx=min(self.per_consumer_batch_idx.values()))
        out: dict[str, UniqueRows] = {}
        for fqn, table in self._tables.items():
            rows = found.get(fqn) or UniqueRows(torch.zeros(0, dtype=torch.int64), None)
            ids = rows.ids.to(torch.int64)
            states = rows.states
            if self._mode == TrackingMode.MOMENTUM_LAST:
                states = live_states(self._mode, table, ids, first=False)
            elif self._mode in (TrackingMode.MOMENTUM_DIFF, TrackingMode.ROWWISE_ADAGRAD) and ids.numel():
                assert states is not None  # recorded with every lookup in these modes
                states = live_states(self._mode, table, ids, first=False) - states.to(torch.float32)
            if states is None and self._mode != TrackingMode.ID_ONLY:  # no row: an empty state, not None
                states = live_states(self._mode, table, ids, first=True)
            out[fqn] = _top(UniqueRows(ids, states), fraction, bool(sorted_by_indices))
        return out

    def clear(self, consumer: str | None = None) -> None:
        """Forget what was recorded: for every consumer (None), or what ``consumer`` has not read yet
        (its window moves to now; entries every consumer has passed are dropped)."""
        self._flush()
        if consumer is None:
            self.store.delete()
            return
        name = self._check_consumer(consumer)
        self.per_consumer_batch_idx[name] = self.curr_batch_idx + 1
        self.curr_batch_idx += 1
        self.store.delete(up_to_idx=min(self.per_consumer_batch_idx.values()))


_RecordedIds = tuple[torch.Tensor, list[int]] | KeyedJaggedTensor


def _recorded_ids(features: KeyedJaggedTensor) -> _RecordedIds:
    """What a training lookup leaves until the next read (module docstring): ``(values, offset per
    key)`` where the offsets are cached or cost no host sync (CPU), else the KJT."""
    offsets = features.offset_per_key_or_none()
    if offsets is None and features.values().device.type == "cpu":
        offsets = features.offset_per_key()
    return features if offsets is None else (features.values(), offsets)


def _per_table(
    keys: LookupKeys, values: torch.Tensor, offsets: list[int], states: torch.Tensor | None
) -> dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """``{fqn: ([global ids per key], [states per key])}`` of one recorded lookup: ``values`` its
    shard-local ids, key ``k``'s at ``offsets[k]:offsets[k + 1]``."""
    out: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for k, key in enumerate(keys.keys):
        if key is None or offsets[k] == offsets[k + 1]:
            continue
        ids, table_states = out.setdefault(key.fqn, ([], []))
        ids.append(values[offsets[k] : offsets[k + 1]].to(torch.int64) + key.row_offset)
        if states is not None:
            part = states[offsets[k] : offsets[k + 1]]
            table_states.append(part[:, : key.cols] if part.dim() == 2 else part)
    return out


def _top(rows: UniqueRows, fraction: float, sort_by_id: bool) -> UniqueRows:
    if fraction >= 1.0 or rows.states is None or rows.ids.numel() == 0:
        return rows
    score = rows.states.float().reshape(rows.ids.numel(), -1).norm(dim=1)
    keep = max(1, int(round(fraction * rows.ids.numel())))
    order = torch.topk(score, keep).indices
    if sort_by_id:
        order = order.sort().values  # ids are ascending, so positions in order are ids in order
    return UniqueRows(rows.ids.index_select(0, order), rows.states.index_select(0, order))
