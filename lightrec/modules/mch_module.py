"""``MCHManagedCollisionModule``: torchrec's managed-collision hash, with a row for a new id at once.

Maps raw ids of one table (any int64 below ``input_hash_size``) to its rows, giving every live id
its own row. A training step (``remap_values``, or torchrec's ``forward``/``profile``+``remap``)::

    1. look every id up (one searchsorted in the sorted index, see lightrec.modules.mc_ops)
    2. ids without a row, in priority order (more lookups first), take at once
         a free row of their bucket, else
         the row of the resident that ranked lowest at the last round and was not seen since
           (at most immediate_eviction_fraction of the bucket between two rounds), else
         wait in the bucket's default row
    3. every eviction_interval steps: a round -- the policy ranks residents and waiting ids per
       bucket; the best keep or get a row, the others are evicted or keep waiting
    4. ids -> rows; rows whose id was evicted are listed by evict() so the embedding module
       re-initialises them and resets their optimizer state before the lookup

Differences from torchrec, on purpose (docs/managed-collisions.md): step 2 (torchrec makes a new id
wait for the next round), evicted rows are reset (``ManagedCollisionEmbeddingBagCollection`` does
it; torchrec's unsharded module does not), ``admission_threshold`` (an id gets a row after being
seen that many times), ``TTL_EvictionPolicy``, and the state is kept slot-ordered (the buffer
``_mch_sorted_raw_ids`` holds slot ``i``'s id at index ``i``) so that it shards and reshards with
the table's rows. torchrec's state dicts (ids sorted, ``_mch_remapped_ids_mapping`` giving each
one's row) load as they are.

In eval mode the module is frozen: no insertion, no eviction, unknown ids go to the default row of
their bucket (the last row of its segment; row ``zch_size - 1`` with one bucket, as in torchrec).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lightrec.modules.mc_base import ManagedCollisionModule
from lightrec.modules.mc_eviction import MCHEvictionPolicy
from lightrec.modules.mc_ops import (
    EMPTY_ID,
    block_bucket,
    bucket_segments,
    check_input_hash_size,
    index_positions_of_free,
    lookup_sorted,
    mix64,
    rank_within_groups,
    replace_in_index,
    sort_slots,
)
from lightrec.modules.mc_serving import FrozenMCHRemapper, check_servable_hash
from lightrec.modules.mch_slots import (
    BucketLayout,
    priority_order,
    round_order,
    take_free_slots,
    take_victims,
)
from lightrec.sparse import JaggedTensor

__all__ = ["MCHManagedCollisionModule"]

logger = logging.getLogger(__name__)

_SEGMENTS_SLOTS = 1025  # torchrec's fixed-size segments buffer (up to 1024 shards)
InputHashFunc = Callable[[torch.Tensor, int], torch.Tensor]


@dataclass
class _Stats:
    lookups: int = 0
    default_lookups: int = 0
    inserted: int = 0
    evicted: int = 0
    rounds: int = 0


def _positive_int(value: object, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"MCHManagedCollisionModule({name}=...) must be an int >= {minimum}, got {value!r}")
    return value


class MCHManagedCollisionModule(ManagedCollisionModule):
    """Managed-collision hash of one table (see the module docstring).

    Args:
        zch_size: rows this module maps to (the table's ``num_embeddings``, or a shard's).
        device: where the state lives.
        eviction_policy: an ``MCHEvictionPolicy`` (``LFU_EvictionPolicy()``, ``LRU_EvictionPolicy()``,
            ``DistanceLFU_EvictionPolicy()``, ``TTL_EvictionPolicy(ttl)``).
        eviction_interval: training steps between eviction rounds.
        input_hash_size: raw ids must be in ``[0, input_hash_size)``; the id space is split into
            ``buckets`` equal blocks.
        input_hash_func: optional ``fn(ids, input_hash_size) -> ids`` applied first (e.g.
            ``mix64_hash`` for ids that are not spread over the id space).
        mch_size / mch_hash_func: deprecated in torchrec, ignored (a warning is logged).
        name: the table's name (set by ``ManagedCollisionCollection`` when None).
        output_global_offset: first table row of this module (sharding sets it).
        output_segments: ``buckets + 1`` row offsets of the table's bucket segments (sharding sets
            it; default ``[b * zch_size // buckets]``).
        buckets: buckets of the whole table. A row-wise sharded table needs a multiple of the world
            size (whole buckets per rank); e.g. 6 serves 1, 2, 3 and 6 ranks and resharding among them.
        immediate_eviction_fraction: share of each bucket's rows that new ids may take from
            low-ranked residents between two rounds (0: they wait for the round, as in torchrec).
        admission_threshold: an id gets a row only once it was looked up this many times (counted
            in a sketch of ``zch_size`` counters; 1 admits at first sight).
    """

    # Buffers (registered in _init_buffers; declared for the type checker).
    _mch_sorted_raw_ids: torch.Tensor
    _mch_remapped_ids_mapping: torch.Tensor
    _mch_last_access_iter: torch.Tensor
    _current_iter_tensor: torch.Tensor
    _output_segments_tensor: torch.Tensor
    _sorted_ids: torch.Tensor
    _sorted_slots: torch.Tensor
    _default_slots: torch.Tensor
    _mch_counts: torch.Tensor  # only when the policy reads counts
    _mch_admission_counts: torch.Tensor  # only with admission_threshold > 1
    _mch_victim_rank: torch.Tensor

    def __init__(
        self,
        zch_size: int,
        device: torch.device | str | None,
        eviction_policy: MCHEvictionPolicy,
        eviction_interval: int,
        input_hash_size: int = 2**63 - 1,
        input_hash_func: InputHashFunc | None = None,
        mch_size: int | None = None,
        mch_hash_func: InputHashFunc | None = None,
        name: str | None = None,
        output_global_offset: int = 0,
        output_segments: list[int] | None = None,
        buckets: int = 1,
        *,
        immediate_eviction_fraction: float = 0.25,
        admission_threshold: int = 1,
    ) -> None:
        super().__init__(device)
        self._name = name
        where = f"MCHManagedCollisionModule({name!r})" if name else "MCHManagedCollisionModule"
        self._zch_size = _positive_int(zch_size, "zch_size")
        if not isinstance(eviction_policy, MCHEvictionPolicy):
            raise TypeError(
                f"{where}: eviction_policy must be an MCHEvictionPolicy (e.g. LRU_EvictionPolicy()), "
                f"got {type(eviction_policy).__name__}"
            )
        self._eviction_policy = eviction_policy
        self._eviction_interval = _positive_int(eviction_interval, "eviction_interval")
        check_input_hash_size(input_hash_size, where)
        if input_hash_size == 0:
            raise ValueError(f"{where}: input_hash_size must be positive (0 is the hash module's 'unbounded')")
        self._input_hash_size = input_hash_size
        self._input_hash_func = input_hash_func
        if mch_size is not None or mch_hash_func is not None:
            logger.warning("%s: mch_size / mch_hash_func are deprecated (as in torchrec) and ignored", where)
        if not 0.0 <= float(immediate_eviction_fraction) <= 1.0:
            raise ValueError(f"{where}: immediate_eviction_fraction must be in [0, 1], got {immediate_eviction_fraction}")
        self._immediate_fraction = float(immediate_eviction_fraction)
        self._admission_threshold = _positive_int(admission_threshold, "admission_threshold")
        self._output_global_offset = int(output_global_offset)
        self._buckets = _positive_int(buckets, "buckets")
        if output_segments is None:
            output_segments = [self._output_global_offset + s for s in bucket_segments(self._zch_size, self._buckets)]
        self._output_segments = [int(s) for s in output_segments]
        self._layout = self._local_layout(where)
        self._init_buffers()
        self._current_iter = 0
        self._history: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._free = [self._layout.capacity(b) for b in range(self._layout.num_local)]
        self._pending_evictions: list[torch.Tensor] = []
        self._profiled: tuple[dict[str, JaggedTensor], torch.Tensor] | None = None
        self._stats = _Stats()

    # ---- construction ------------------------------------------------------------------------
    def _local_layout(self, where: str) -> BucketLayout:
        segs = self._output_segments
        if len(segs) != self._buckets + 1 or segs != sorted(segs) or len(segs) > _SEGMENTS_SLOTS:
            raise ValueError(f"{where}: output_segments {segs} must be {self._buckets + 1} ascending row offsets")
        start, end = self._output_global_offset, self._output_global_offset + self._zch_size
        if start not in segs or end not in segs:
            raise ValueError(
                f"{where}: rows [{start}, {end}) do not cover whole buckets of the table (bucket segments {segs}); "
                "a shard must hold whole buckets -- use a bucket count that the world size divides"
            )
        first, last = segs.index(start), segs.index(end)
        bounds = [s - start for s in segs[first : last + 1]]
        layout = BucketLayout(bounds, first, self._buckets)
        for b in range(layout.num_local):
            if layout.capacity(b) < 1:
                raise ValueError(f"{where}: bucket {first + b} has {bounds[b + 1] - bounds[b]} rows; it needs at least 2")
        return layout

    def _init_buffers(self) -> None:
        z, dev = self._zch_size, self._device
        self.register_buffer("_mch_sorted_raw_ids", torch.full((z,), EMPTY_ID, dtype=torch.int64, device=dev))
        self.register_buffer(
            "_mch_remapped_ids_mapping",
            torch.arange(self._output_global_offset, self._output_global_offset + z, dtype=torch.int64, device=dev),
        )
        names = self._eviction_policy.metadata_names
        if "counts" in names:
            self.register_buffer("_mch_counts", torch.zeros(z, dtype=torch.int64, device=dev))
        # Last lookup of every slot: saved when the policy reads it (torchrec's buffer), else kept
        # only in memory (immediate evictions skip residents seen since the last round).
        self.register_buffer(
            "_mch_last_access_iter", torch.zeros(z, dtype=torch.int64, device=dev),
            persistent="last_access_iter" in names,
        )  # fmt: skip
        if self._admission_threshold > 1:
            self.register_buffer("_mch_admission_counts", torch.zeros(z, dtype=torch.int64, device=dev))
        # Rank of each row in its bucket's queue of rows new ids may take before the next round (-1: none).
        self.register_buffer(
            "_mch_victim_rank", torch.full((z,), -1, dtype=torch.int64, device=dev), persistent=self._immediate_fraction > 0
        )
        self.register_buffer("_current_iter_tensor", torch.zeros(1, dtype=torch.int64, device=dev))
        padded = self._output_segments + [-1] * (_SEGMENTS_SLOTS - len(self._output_segments))
        self.register_buffer("_output_segments_tensor", torch.tensor(padded, dtype=torch.int64, device=dev))
        self.register_buffer("_sorted_ids", torch.full((z,), EMPTY_ID, dtype=torch.int64, device=dev), persistent=False)
        self.register_buffer("_sorted_slots", torch.arange(z, dtype=torch.int64, device=dev), persistent=False)
        self.register_buffer("_default_slots", self._layout.default_slots(dev), persistent=False)

    # ---- torchrec's interface ----------------------------------------------------------------
    def preprocess(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        if self._input_hash_func is None:
            return features
        return {
            name: JaggedTensor(
                values=self._input_hash_func(jt.values(), self._input_hash_size),
                lengths=jt.lengths(), weights=jt.weights_or_none(),
            )  # fmt: skip
            for name, jt in features.items()
        }

    def preprocess_values(self, values: torch.Tensor) -> torch.Tensor:
        return values if self._input_hash_func is None else self._input_hash_func(values, self._input_hash_size)

    def profile(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        """Training: run the step on every feature's ids; ``remap`` of the same dict returns its rows."""
        if self.training:
            values = torch.cat([jt.values() for jt in features.values()]) if features else torch.zeros(0, dtype=torch.int64)
            self._profiled = (features, self._train_step(values.long()))
        return features

    def remap(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        profiled, self._profiled = self._profiled, None
        if profiled is not None and profiled[0] is features:
            rows = profiled[1]
        else:
            values = torch.cat([jt.values() for jt in features.values()]) if features else torch.zeros(0, dtype=torch.int64)
            rows = self._frozen(values.long())
        out: dict[str, JaggedTensor] = {}
        start = 0
        for name, jt in features.items():
            n = jt.values().numel()
            out[name] = JaggedTensor(values=rows[start : start + n], lengths=jt.lengths(), weights=jt.weights_or_none())
            start += n
        return out

    def forward(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        return self.remap(self.profile(self.preprocess(features)))

    def evict(self) -> torch.Tensor | None:
        if not self._pending_evictions:
            return None
        rows = torch.cat(self._pending_evictions) + self._output_global_offset
        self._pending_evictions = []
        unique: torch.Tensor = torch.unique(rows)
        return unique

    def output_size(self) -> int:
        return self._zch_size

    def input_size(self) -> int:
        return self._input_hash_size

    def buckets(self) -> int:
        return self._buckets

    def open_slots(self) -> torch.Tensor:
        return torch.tensor([sum(self._free)], dtype=torch.int64)

    def reset_inference_mode(self) -> None:
        """torchrec's switch to serving: eval mode, no pending evictions or waiting ids."""
        self.eval()
        self._pending_evictions = []
        self._history = []

    def rebuild_with_output_id_range(
        self,
        output_id_range: tuple[int, int],
        output_segments: list[int],
        device: torch.device | None = None,
    ) -> MCHManagedCollisionModule:
        start, end = output_id_range
        return type(self)(
            zch_size=end - start,
            device=device or self._device,
            eviction_policy=self._eviction_policy,
            eviction_interval=self._eviction_interval,
            input_hash_size=self._input_hash_size,
            input_hash_func=self._input_hash_func,
            name=self._name,
            output_global_offset=start,
            output_segments=list(output_segments),
            buckets=len(output_segments) - 1,
            immediate_eviction_fraction=self._immediate_fraction,
            admission_threshold=self._admission_threshold,
        )

    def with_buckets(self, buckets: int) -> MCHManagedCollisionModule:
        """This module's twin with ``buckets`` buckets (only while it holds no id: ids would move).

        Raises:
            ValueError: the module already holds ids.
        """
        if self._mch_sorted_raw_ids.device.type != "meta" and bool((self._mch_sorted_raw_ids != EMPTY_ID).any()):
            raise ValueError(
                f"managed-collision table {self.table_name!r} holds ids with buckets={self._buckets}; it cannot be "
                f"re-bucketed to {buckets} (its ids would change rows); build it with buckets={buckets}"
            )
        twin = type(self)(
            zch_size=self._zch_size, device=self._device, eviction_policy=self._eviction_policy,
            eviction_interval=self._eviction_interval, input_hash_size=self._input_hash_size,
            input_hash_func=self._input_hash_func, name=self._name, buckets=buckets,
            immediate_eviction_fraction=self._immediate_fraction, admission_threshold=self._admission_threshold,
        )  # fmt: skip
        twin.train(self.training)
        return twin

    # ---- lightrec's tensor-level interface -----------------------------------------------------
    @property
    def output_global_offset(self) -> int:
        return self._output_global_offset

    @property
    def output_segments(self) -> list[int]:
        return list(self._output_segments)

    @property
    def eviction_policy(self) -> MCHEvictionPolicy:
        return self._eviction_policy

    def bucket_of(self, values: torch.Tensor) -> torch.Tensor:
        return block_bucket(values, self._input_hash_size, self._buckets)

    def remap_values(self, values: torch.Tensor, feature_splits: list[int] | None = None) -> torch.Tensor:
        values = values.long()
        return self._train_step(values) if self.training else self._frozen(values)

    def slot_state(self) -> dict[str, torch.Tensor]:
        return {name: buf for name, buf in self.named_buffers(recurse=False)
                if name not in ("_current_iter_tensor", "_output_segments_tensor")
                and name not in self._non_persistent_buffers_set}  # fmt: skip

    def current_iteration(self) -> int:
        return self._current_iter

    def frozen_remapper(self) -> FrozenMCHRemapper:
        """The id map as a serving remapper: unknown ids go to their bucket's default row."""
        hashed = check_servable_hash(self, self._input_hash_func)
        offset = self._output_global_offset
        defaults = torch.tensor([self._layout.default_slot(b) + offset for b in range(self._layout.num_local)])
        return FrozenMCHRemapper(
            self._sorted_ids.cpu(), self._sorted_slots.cpu() + offset, defaults, self._input_hash_size,
            self._buckets, self._layout.start_bucket, hashed,
        )  # fmt: skip

    def mc_stats(self) -> dict[str, float]:
        capacity = sum(self._layout.capacity(b) for b in range(self._layout.num_local))
        s = self._stats
        return {
            "rows": float(capacity),
            "occupied": float(capacity - sum(self._free)),
            "lookups": float(s.lookups),
            "default_lookups": float(s.default_lookups),
            "inserted": float(s.inserted),
            "evicted": float(s.evicted),
        }

    def copy_state_from(self, other: MCHManagedCollisionModule) -> None:
        """Take over the rows of ``other`` (the unsharded module) that this shard serves."""
        start = self._output_global_offset - other._output_global_offset
        with torch.no_grad():
            for name, buf in self.slot_state().items():
                src = getattr(other, name, None)
                if isinstance(src, torch.Tensor) and src.device.type != "meta":
                    buf.copy_(src[start : start + self._zch_size])
            last = other._mch_last_access_iter
            if last.device.type != "meta":
                self._mch_last_access_iter.copy_(last[start : start + self._zch_size])
            self._current_iter_tensor.copy_(other._current_iter_tensor)
            self._mch_remapped_ids_mapping.copy_(
                torch.arange(self._zch_size, device=self._mch_remapped_ids_mapping.device) + self._output_global_offset
            )
        self.validate_state()

    # ---- the training step ---------------------------------------------------------------------
    def _default_of(self, values: torch.Tensor) -> torch.Tensor:
        if self._layout.num_local == 1:
            return torch.full_like(values, self._layout.default_slot(0))
        return self._default_slots.index_select(0, self._local_bucket(values))

    def _local_bucket(self, values: torch.Tensor) -> torch.Tensor:
        return (self.bucket_of(values) - self._layout.start_bucket).clamp_(0, self._layout.num_local - 1)

    @torch.no_grad()
    def _frozen(self, values: torch.Tensor) -> torch.Tensor:
        slots, hit = lookup_sorted(self._sorted_ids, self._sorted_slots, values)
        return torch.where(hit, slots, self._default_of(values)) + self._output_global_offset

    @torch.no_grad()
    def _train_step(self, values: torch.Tensor) -> torch.Tensor:
        it = self._current_iter + 1
        self._current_iter = it
        self._current_iter_tensor.fill_(it)
        default = self._default_of(values)
        local = default
        if values.numel():
            local = self._lookup_and_insert(values, default, it)
        if it % self._eviction_interval == 0:  # on a fixed schedule: a resumed run keeps it
            self._round(it)
            if values.numel():
                slots, hit = lookup_sorted(self._sorted_ids, self._sorted_slots, values)
                local = torch.where(hit, slots, default)
        if values.numel():
            self._stats.lookups += values.numel()
            self._stats.default_lookups += int((local == default).sum())
        return local + self._output_global_offset

    def _lookup_and_insert(self, values: torch.Tensor, default: torch.Tensor, it: int) -> torch.Tensor:
        slots, hit = lookup_sorted(self._sorted_ids, self._sorted_slots, values)
        local = torch.where(hit, slots, default)
        self._mch_last_access_iter.index_fill_(0, local, it)  # default rows too: they are never victims
        counts = getattr(self, "_mch_counts", None)
        if counts is not None:
            counts.index_add_(0, local, hit.to(torch.int64))
        if bool(hit.all()):
            return local
        miss = ~hit
        uniq, inverse, cnt = torch.unique(values[miss], return_inverse=True, return_counts=True)
        got = self._insert(uniq, cnt, it).index_select(0, inverse)
        local[miss] = torch.where(got >= 0, got, local[miss])
        return local

    def _insert(self, uniq: torch.Tensor, cnt: torch.Tensor, it: int) -> torch.Tensor:
        """Rows for new ids ``uniq`` (ascending) seen ``cnt`` times: ``[U]`` local slot, or -1."""
        assigned = torch.full_like(uniq, -1)
        cand = torch.arange(uniq.numel(), device=uniq.device)
        if self._admission_threshold > 1:
            sketch = self._sketch_index(uniq)
            self._mch_admission_counts.index_add_(0, sketch, cnt)
            cand = torch.nonzero(self._mch_admission_counts.index_select(0, sketch) >= self._admission_threshold).flatten()
            if cand.numel() == 0:
                return assigned
        nb = self._layout.num_local
        buckets = self._local_bucket(uniq.index_select(0, cand)) if nb > 1 else None
        order = priority_order(cnt.index_select(0, cand), buckets)
        cand = cand.index_select(0, order)
        per_bucket = [cand.numel()] if buckets is None else torch.bincount(buckets, minlength=nb).tolist()
        slot_ids = self._mch_sorted_raw_ids
        taken, victims, placed, waiting = [], [], [], []
        start = 0
        for b, n in enumerate(per_bucket):
            if n == 0:
                continue
            free = take_free_slots(slot_ids, self._layout, b, min(n, self._free[b]))
            self._free[b] -= free.numel()
            got = [free]
            if free.numel() < n:
                last_round = it - it % self._eviction_interval
                evict = take_victims(self._mch_victim_rank, slot_ids, self._mch_last_access_iter, last_round,
                                     self._layout, b, n - free.numel())  # fmt: skip
                victims.append(evict)
                got.append(evict)
            slots = torch.cat(got)
            taken.append(slots)
            placed.append(cand[start : start + slots.numel()])
            waiting.append(cand[start + slots.numel() : start + n])
            start += n
        self._add_waiting(uniq, cnt, torch.cat(waiting), it)
        slots, who = torch.cat(taken), torch.cat(placed)
        if slots.numel() == 0:
            return assigned
        evicted = torch.cat(victims) if victims else slots[:0]
        removed = index_positions_of_free(self._sorted_ids, self._sorted_slots, slots)
        if evicted.numel():
            old = slot_ids.index_select(0, evicted)
            removed[torch.searchsorted(self._sorted_ids, old)] = True
            self._release(evicted)
        ids, counts_new = uniq.index_select(0, who), cnt.index_select(0, who)
        self._occupy(slots, ids, counts_new, torch.full_like(ids, it))
        by_id = torch.sort(ids).indices
        self._sorted_ids, self._sorted_slots = replace_in_index(
            self._sorted_ids, self._sorted_slots, removed, ids.index_select(0, by_id), slots.index_select(0, by_id)
        )
        assigned[who] = slots
        return assigned

    def _sketch_index(self, ids: torch.Tensor) -> torch.Tensor:
        """Admission counter of each id: a hashed slot inside its bucket's segment (so that the
        counters shard and reshard with the rows)."""
        bounds = torch.tensor(self._layout.bounds, dtype=torch.int64, device=ids.device)
        b = self._local_bucket(ids) if self._layout.num_local > 1 else torch.zeros_like(ids)
        lo = bounds.index_select(0, b)
        size = bounds.index_select(0, b + 1) - lo
        return lo + torch.remainder(mix64(ids), size)

    def _add_waiting(self, uniq: torch.Tensor, cnt: torch.Tensor, which: torch.Tensor, it: int) -> None:
        if which.numel():
            self._history.append((uniq.index_select(0, which), cnt.index_select(0, which), torch.full_like(which, it)))

    def _occupy(self, slots: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor, last: torch.Tensor) -> None:
        self._mch_sorted_raw_ids[slots] = ids
        self._mch_last_access_iter[slots] = last
        if hasattr(self, "_mch_counts"):
            self._mch_counts[slots] = counts
        self._stats.inserted += slots.numel()

    def _release(self, slots: torch.Tensor) -> None:
        """Evict the ids of ``slots`` (their rows are reset before the next lookup)."""
        if slots.numel() == 0:
            return
        self._mch_sorted_raw_ids[slots] = EMPTY_ID
        self._mch_last_access_iter[slots] = 0
        if hasattr(self, "_mch_counts"):
            self._mch_counts[slots] = 0
        self._pending_evictions.append(slots.clone())
        self._stats.evicted += slots.numel()

    # ---- eviction rounds -----------------------------------------------------------------------
    def _round(self, it: int) -> None:
        layout, policy = self._layout, self._eviction_policy
        slot_ids, last_seen = self._mch_sorted_raw_ids, self._mch_last_access_iter
        counts_buf = getattr(self, "_mch_counts", None)
        resident = torch.nonzero(slot_ids != EMPTY_ID).flatten()
        r_ids, r_last = slot_ids.index_select(0, resident), last_seen.index_select(0, resident)
        r_cnt = counts_buf.index_select(0, resident) if counts_buf is not None else torch.zeros_like(r_ids)
        c_ids, c_cnt, c_last = self._waiting_ids()
        r_score = policy.scores(r_cnt, r_last, it)
        expired = policy.expired(r_last, it)
        forced = expired if expired is not None else torch.zeros_like(r_ids, dtype=torch.bool)
        r_score = torch.where(forced, torch.full_like(r_score, -float("inf")), r_score)
        n_res = resident.numel()
        buckets = torch.cat([layout.bucket_of_slot(resident), self._local_bucket(c_ids) if layout.num_local > 1
                             else torch.zeros_like(c_ids)])  # fmt: skip
        scores = torch.cat([r_score, policy.scores(c_cnt, c_last, it)])
        waiting = torch.cat([torch.zeros_like(r_ids), torch.ones_like(c_ids)])
        order = round_order(buckets, scores, waiting, torch.cat([r_ids, c_ids]))
        rank, _ = rank_within_groups(buckets.index_select(0, order), layout.num_local)
        caps = torch.tensor([layout.capacity(b) for b in range(layout.num_local)], device=rank.device)
        keep_sorted = rank < caps.index_select(0, buckets.index_select(0, order))
        keep = torch.empty_like(keep_sorted)
        keep[order] = keep_sorted
        keep[:n_res] &= ~forced
        self._release(resident[~keep[:n_res]])
        self._build_victims(order, keep, buckets, resident, n_res, it)
        admitted = torch.nonzero(keep[n_res:]).flatten()
        self._admit(c_ids.index_select(0, admitted), c_cnt.index_select(0, admitted), c_last.index_select(0, admitted),
                    scores[n_res:].index_select(0, admitted))  # fmt: skip
        self._history = []
        self._stats.rounds += 1
        self._rebuild_index()

    def _waiting_ids(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(ids, counts, last seen)`` of the ids that waited since the last round, still without a row."""
        empty = torch.zeros(0, dtype=torch.int64, device=self._mch_sorted_raw_ids.device)
        if not self._history:
            return empty, empty, empty
        ids = torch.cat([h[0] for h in self._history])
        uniq, inverse = torch.unique(ids, return_inverse=True)
        cnt = torch.zeros_like(uniq).index_add_(0, inverse, torch.cat([h[1] for h in self._history]))
        last = torch.zeros_like(uniq).scatter_reduce_(0, inverse, torch.cat([h[2] for h in self._history]), "amax")
        _, resident = lookup_sorted(self._sorted_ids, self._sorted_slots, uniq)
        keep = ~resident
        kept = self._eviction_policy.filter_candidates(cnt[keep])
        uniq, cnt, last = uniq[keep], cnt[keep], last[keep]
        if kept is not None:
            uniq, cnt, last = uniq[kept], cnt[kept], last[kept]
        return uniq, cnt, last

    def _build_victims(
        self, order: torch.Tensor, keep: torch.Tensor, buckets: torch.Tensor, resident: torch.Tensor, n_res: int, it: int
    ) -> None:
        """The lowest-ranked residents that keep their row: rows new ids may take before the next round."""
        self._mch_victim_rank.fill_(-1)
        if self._immediate_fraction <= 0.0:
            return
        kept_res = order[(order < n_res) & keep.index_select(0, order)]  # residents kept, best first
        kept_buckets = buckets.index_select(0, kept_res)
        for b in range(self._layout.num_local):
            budget = int(self._immediate_fraction * self._layout.capacity(b))
            mine = kept_res[kept_buckets == b]
            if budget and mine.numel():
                victims = resident.index_select(0, mine[-budget:].flip(0))  # lowest first
                self._mch_victim_rank[victims] = torch.arange(victims.numel(), device=victims.device)

    def _admit(self, ids: torch.Tensor, cnt: torch.Tensor, last: torch.Tensor, scores: torch.Tensor) -> None:
        """Give waiting ids that won the round a free row of their bucket (best first)."""
        if ids.numel() == 0:
            return
        nb = self._layout.num_local
        b = self._local_bucket(ids) if nb > 1 else torch.zeros_like(ids)
        order = torch.sort(-scores, stable=True).indices
        order = order.index_select(0, torch.sort(b.index_select(0, order), stable=True).indices)
        ids, cnt, last, b = ids[order], cnt[order], last[order], b[order]
        per_bucket = torch.bincount(b, minlength=nb).tolist()
        slots, start = [], 0
        for bucket, n in enumerate(per_bucket):
            if n:
                slots.append(take_free_slots(self._mch_sorted_raw_ids, self._layout, bucket, n))
            start += n
        got = torch.cat(slots)
        assert got.numel() == ids.numel()  # the round kept at most `capacity` ids per bucket
        self._occupy(got, ids, cnt, last)

    # ---- state ---------------------------------------------------------------------------------
    def _rebuild_index(self) -> None:
        slot_ids = self._mch_sorted_raw_ids
        self._sorted_ids, self._sorted_slots = sort_slots(slot_ids)
        free = (slot_ids == EMPTY_ID).to(torch.int64)
        per_bucket = torch.zeros(self._layout.num_local, dtype=torch.int64, device=slot_ids.device)
        per_bucket.index_add_(0, self._layout.bucket_of_slot(torch.arange(slot_ids.numel(), device=slot_ids.device)), free)
        self._free = [int(n) - 1 for n in per_bucket.tolist()]  # minus each bucket's default row

    def validate_state(self) -> None:
        """Check the slot state (default rows empty, ids unique and in their buckets) and rebuild the index.

        Raises:
            ValueError: naming the table and what is inconsistent.
        """
        slot_ids = self._mch_sorted_raw_ids
        if slot_ids.device.type == "meta":
            return
        where = f"managed-collision table {self.table_name!r}"
        defaults = slot_ids.index_select(0, self._default_slots.to(slot_ids.device))
        if bool((defaults != EMPTY_ID).any()):
            raise ValueError(f"{where}: a default row (the last row of a bucket) holds an id; the state is corrupt")
        occupied = torch.nonzero(slot_ids != EMPTY_ID).flatten()
        ids = slot_ids.index_select(0, occupied)
        if ids.numel() != torch.unique(ids).numel():
            raise ValueError(f"{where}: an id occupies several rows; the state is corrupt")
        if self._layout.num_local > 1 or self._buckets > 1:
            wrong = self.bucket_of(ids) - self._layout.start_bucket != self._layout.bucket_of_slot(occupied)
            if bool(wrong.any()):
                raise ValueError(
                    f"{where}: ids sit in rows of another bucket (the state was saved with other buckets than "
                    f"this module's {self._buckets}); build the module with the buckets it was trained with"
                )
        counts = getattr(self, "_mch_counts", None)
        if counts is not None:  # torchrec keeps int64-max counts on its default row; they mean nothing
            counts.index_fill_(0, self._default_slots.to(counts.device), 0)
        self._current_iter = int(self._current_iter_tensor.item())
        self._history = []  # ids that waited since the last round are not saved: they wait again
        self._rebuild_index()

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any], strict: bool,
        missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str],
    ) -> None:  # fmt: skip
        _to_slot_order(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        self.validate_state()

    def extra_repr(self) -> str:
        return (
            f"name={self._name!r}, zch_size={self._zch_size}, offset={self._output_global_offset}, "
            f"buckets={self._buckets} (local {self._layout.start_bucket}..{self._layout.start_bucket + self._layout.num_local - 1}), "
            f"policy={self._eviction_policy!r}, eviction_interval={self._eviction_interval}, "
            f"immediate_eviction_fraction={self._immediate_fraction}, admission_threshold={self._admission_threshold}"
        )


def _to_slot_order(module: MCHManagedCollisionModule, state_dict: dict[str, Any], prefix: str) -> None:
    """Rewrite a torchrec- or lightrec-format entry set of ``module`` in place into slot order.

    Accepts ids in any order with ``_mch_remapped_ids_mapping`` giving each one's row (torchrec
    keeps them sorted), ``[zch, 1]`` columns (a gathered sharded state), and fills lightrec-only
    keys a torchrec state dict lacks.
    """
    where = f"managed-collision table {module.table_name!r}"
    z, offset = module._zch_size, module._output_global_offset
    per_slot = list(module.slot_state())
    _check_segments(module, state_dict, prefix, where)
    slot_order(state_dict, prefix, per_slot, z, offset, where)
    if "_mch_admission_counts" in per_slot and prefix + "_mch_admission_counts" not in state_dict:
        state_dict[prefix + "_mch_admission_counts"] = torch.zeros(z, dtype=torch.int64)  # lightrec's, not torchrec's
    if "_mch_victim_rank" in per_slot and prefix + "_mch_victim_rank" not in state_dict:
        state_dict[prefix + "_mch_victim_rank"] = torch.full((z,), -1, dtype=torch.int64)


def slot_order(state_dict: dict[str, Any], prefix: str, per_slot: list[str], z: int, offset: int, where: str) -> None:
    """Put the per-slot entries ``per_slot`` of ``state_dict`` (rows ``[offset, offset + z)``) in slot
    order, in place: flatten ``[z, 1]`` columns and apply ``_mch_remapped_ids_mapping`` (any order).

    Raises:
        ValueError: a wrong shape, or a mapping that does not cover every row once.
    """
    for name in per_slot:
        value = state_dict.get(prefix + name)
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[1] == 1:
            state_dict[prefix + name] = value = value.reshape(-1)
        if isinstance(value, torch.Tensor) and value.shape != (z,):
            raise ValueError(f"{where}: state_dict[{prefix + name!r}] has shape {tuple(value.shape)}, expected ({z},)")
    mapping = state_dict.get(prefix + "_mch_remapped_ids_mapping")
    if not isinstance(mapping, torch.Tensor):
        return
    slots = mapping.reshape(-1).long() - offset
    if bool(((slots < 0) | (slots >= z)).any()) or torch.unique(slots).numel() != z:
        raise ValueError(
            f"{where}: state_dict[{prefix}_mch_remapped_ids_mapping] must map every row of [{offset}, {offset + z}) once"
        )
    identity = torch.arange(z, dtype=torch.int64)
    if not torch.equal(slots.cpu(), identity):
        for name in per_slot:
            value = state_dict.get(prefix + name)
            if isinstance(value, torch.Tensor) and name != "_mch_remapped_ids_mapping":
                state_dict[prefix + name] = torch.empty_like(value).index_copy_(0, slots.to(value.device), value)
    state_dict[prefix + "_mch_remapped_ids_mapping"] = identity + offset


def _check_segments(module: MCHManagedCollisionModule, state_dict: dict[str, Any], prefix: str, where: str) -> None:
    """The saved bucket segments must be this module's (any, for a single-bucket unsharded module)."""
    offset = module._output_global_offset
    segments = state_dict.get(prefix + "_output_segments_tensor")
    if isinstance(segments, torch.Tensor):
        saved = [int(s) for s in segments.tolist() if s >= 0]
        if saved and saved[-1] != module._output_segments[-1] and module._buckets == 1 and offset == 0:
            raise ValueError(f"{where}: the saved table has {saved[-1]} rows, this one {module._output_segments[-1]}")
        if saved and saved != module._output_segments and module._buckets > 1:
            raise ValueError(
                f"{where}: the state was saved with bucket segments {saved}, this module has "
                f"{module._output_segments} (buckets={module._buckets}); build it with the same zch_size and buckets"
            )
        state_dict[prefix + "_output_segments_tensor"] = module._output_segments_tensor.detach().clone().cpu()
