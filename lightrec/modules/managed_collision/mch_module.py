"""``MCHManagedCollisionModule``: torchrec's managed-collision hash, with a row for a new id at once.

Maps raw ids of one table (any int64 below ``input_hash_size``) to its rows, giving every live id
its own row: a new id takes a free row -- or the row of a resident that ranked lowest at the last
eviction round -- in the step it first appears; every ``eviction_interval`` steps a round ranks
residents and waiting ids with the eviction policy (``lightrec.modules.managed_collision.mch_step``). Rows whose id
was evicted are listed by ``evict()`` so that the embedding module re-initialises them and resets
their optimizer state before the lookup.

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
from collections.abc import Callable, Mapping

import torch

from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.modules.managed_collision.mch_eviction import MCHEvictionPolicy
from lightrec.modules.managed_collision.mch_index import SlotIndex
from lightrec.modules.managed_collision.mch_native import native_hash_bytes_per_row
from lightrec.modules.managed_collision.mch_slots import BucketLayout
from lightrec.modules.managed_collision.mch_state import to_slot_order
from lightrec.modules.managed_collision.mch_step import MCHSteps, StepStats
from lightrec.modules.managed_collision.ops import (
    EMPTY_ID,
    block_bucket,
    bucket_segments,
    check_input_hash_size,
    int64_ids,
)
from lightrec.modules.managed_collision.serving import FrozenMCHRemapper, check_servable_hash
from lightrec.sparse import JaggedTensor

__all__ = ["MCHManagedCollisionModule"]

logger = logging.getLogger(__name__)

_SEGMENTS_SLOTS = 1025  # torchrec's fixed-size segments buffer (up to 1024 shards)
InputHashFunc = Callable[[torch.Tensor, int], torch.Tensor]


def _positive_int(value: object, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"MCHManagedCollisionModule({name}=...) must be an int >= {minimum}, got {value!r}")
    return value


class MCHManagedCollisionModule(MCHSteps, ManagedCollisionModule):
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

    _output_segments: list[int]  # always set by the constructor (the base allows None)

    # Buffers (registered in _init_buffers; declared for the type checker).
    _mch_sorted_raw_ids: torch.Tensor
    _mch_remapped_ids_mapping: torch.Tensor
    _mch_last_access_iter: torch.Tensor
    _current_iter_tensor: torch.Tensor
    _output_segments_tensor: torch.Tensor
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
        self._index = SlotIndex(self._layout)  # built on first use (and again after a move or a load)
        self._pending_evictions: list[torch.Tensor] = []
        self._profiled: tuple[dict[str, JaggedTensor], torch.Tensor] | None = None
        self._stats = StepStats()

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

    def preprocess_is_identity(self) -> bool:
        return self._input_hash_func is None

    def preprocess_values(self, values: torch.Tensor) -> torch.Tensor:
        return values if self._input_hash_func is None else self._input_hash_func(values, self._input_hash_size)

    def profile(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        """Training: run the step on every feature's ids; ``remap`` of the same dict returns its rows."""
        if self.training:
            self._profiled = (features, self._train_step(self._admitted(features)))
        return features

    def remap(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        profiled, self._profiled = self._profiled, None
        if profiled is not None and profiled[0] is features:
            rows = profiled[1]
        else:
            rows = self._frozen(self._admitted(features))
        out: dict[str, JaggedTensor] = {}
        start = 0
        for name, jt in features.items():
            n = jt.values().numel()
            out[name] = JaggedTensor(values=rows[start : start + n], lengths=jt.lengths(), weights=jt.weights_or_none())
            start += n
        return out

    def forward(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        return self.remap(self.profile(self.preprocess(features)))

    def _admitted(self, features: dict[str, JaggedTensor]) -> torch.Tensor:
        """The ids of every feature of ``features``, one after the other, admitted (``admit_ids``).

        torchrec's dict interface takes any int64, as the collection does: an id outside the id
        space is folded into it here too -- left as it is, a negative id would sit in a row of
        another bucket (a state that no longer loads) and ``2**63 - 1`` is the free-slot marker.
        """
        if not features:
            return torch.zeros(0, dtype=torch.int64)
        values = int64_ids(torch.cat([jt.values() for jt in features.values()]))
        return self.admit_ids(values, list(features))

    def evict(self) -> torch.Tensor | None:
        if not self._pending_evictions:
            return None
        # each row once, sorted (as the hash module's): a row is listed again whenever the id that
        # took it is evicted too before this is called -- and callers count or reset what it lists
        rows: torch.Tensor = torch.unique(torch.cat(self._pending_evictions))
        self._pending_evictions = []
        return rows + self._output_global_offset if self._output_global_offset else rows

    def open_slots(self) -> torch.Tensor:
        return torch.tensor([self._ensure_index().total_free()], dtype=torch.int64)

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
    def eviction_policy(self) -> MCHEvictionPolicy:
        return self._eviction_policy

    def bucket_of(self, values: torch.Tensor) -> torch.Tensor:
        return block_bucket(values, self._input_hash_size, self._buckets)

    def remap_values(self, values: torch.Tensor, feature_splits: list[int] | None = None) -> torch.Tensor:
        values = values.long()
        return self._train_step(values) if self.training else self._frozen(values)

    def slot_state(self) -> dict[str, torch.Tensor]:
        self._sync_victim_ranks()
        return {name: buf for name, buf in self.named_buffers(recurse=False)
                if name not in ("_current_iter_tensor", "_output_segments_tensor")
                and name not in self._non_persistent_buffers_set}  # fmt: skip

    def current_iteration(self) -> int:
        return self._current_iter

    def reset_buckets(self) -> tuple[list[int], int]:
        return [b + self._output_global_offset for b in self._layout.bounds], self._layout.start_bucket

    def frozen_remapper(self) -> FrozenMCHRemapper:
        """The id map as a serving remapper: unknown ids go to their bucket's default row."""
        hashed = check_servable_hash(self, self._input_hash_func)
        offset = self._output_global_offset
        defaults = torch.tensor([self._layout.default_slot(b) + offset for b in range(self._layout.num_local)])
        sorted_ids, slots = torch.sort(self._mch_sorted_raw_ids.cpu(), stable=True)
        return FrozenMCHRemapper(
            sorted_ids, slots + offset, defaults, self._input_hash_size, self._buckets, self._layout.start_bucket, hashed
        )

    def index_bytes_per_row(self, device_type: str = "cpu") -> float:
        # The sorted index: an id and a slot (int64) per resident; on CPU the native step adds its hash.
        return 16.0 + (native_hash_bytes_per_row(self.output_size()) if device_type == "cpu" else 0.0)

    def mc_stats(self) -> dict[str, float]:
        capacity = sum(self._layout.capacity(b) for b in range(self._layout.num_local))
        s = self._stats
        return {
            "rows": float(capacity),
            "occupied": float(capacity - self._ensure_index().total_free()),
            "lookups": float(s.lookups),
            "default_lookups": float(s.default_lookups),
            "inserted": float(s.inserted),
            "evicted": float(s.evicted),
        }

    def copy_state_from(self, other: MCHManagedCollisionModule) -> None:
        """Take over the rows of ``other`` (the unsharded module) that this shard serves."""
        start = self._output_global_offset - other._output_global_offset
        source = other.slot_state()
        with torch.no_grad():
            for name, buf in self.slot_state().items():
                src = source.get(name)
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

    # ---- state ---------------------------------------------------------------------------------
    def _sync_victim_ranks(self) -> None:
        """Write the live victim queues into the saved per-slot buffer."""
        if self._index.device == self._mch_sorted_raw_ids.device and self._index.queues:
            self._index.write_victim_ranks(self._mch_victim_rank, self._mch_last_access_iter)

    def validate_state(self) -> None:
        """Check the slot state (default rows empty, ids unique and in their buckets) and rebuild the index.

        Raises:
            ValueError: naming the table and what is inconsistent.
        """
        slot_ids = self._mch_sorted_raw_ids
        if slot_ids.device.type == "meta":
            return
        self._check_slot_ids(slot_ids)
        counts = getattr(self, "_mch_counts", None)
        if counts is not None:  # torchrec keeps int64-max counts on its default row; they mean nothing
            counts.index_fill_(0, self._default_slots.to(counts.device), 0)
        self._current_iter = int(self._current_iter_tensor.item())
        self._history = []  # ids that waited since the last round are not saved: they wait again
        self._index.rebuild(self._mch_sorted_raw_ids, self._mch_victim_rank, self._last_round(self._current_iter))

    def _check_slot_ids(self, slot_ids: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``slot_ids`` (``[zch_size]``, slot order) fits this module: default
        rows empty, every id once, every id in a row of its bucket."""
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

    def check_state_dict(self, state_dict: Mapping[str, object], prefix: str) -> None:
        # On a scratch copy of our entries: to_slot_order rewrites the dict it is given.
        if self._mch_sorted_raw_ids.device.type == "meta":
            return  # a meta module loads nothing (torch skips its copies); validate_state skips it too
        scratch = {k: v for k, v in state_dict.items() if k.startswith(prefix) and isinstance(v, torch.Tensor)}
        to_slot_order(self, scratch, prefix, self._output_segments_tensor)
        slot_ids = scratch.get(prefix + "_mch_sorted_raw_ids")
        if isinstance(slot_ids, torch.Tensor):
            self._check_slot_ids(slot_ids)

    def _save_to_state_dict(self, destination: dict[str, object], prefix: str, keep_vars: bool) -> None:
        self._sync_victim_ranks()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(
        self, state_dict: dict[str, torch.Tensor], prefix: str, local_metadata: dict[str, object], strict: bool,
        missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str],
    ) -> None:  # fmt: skip
        to_slot_order(self, state_dict, prefix, self._output_segments_tensor)
        slot_ids = state_dict.get(prefix + "_mch_sorted_raw_ids")
        if isinstance(slot_ids, torch.Tensor) and self._mch_sorted_raw_ids.device.type != "meta":
            # checked before torch copies anything: a state of other buckets must not half-load
            self._check_slot_ids(slot_ids)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        self.validate_state()

    def extra_repr(self) -> str:
        return (
            f"name={self._name!r}, zch_size={self._zch_size}, offset={self._output_global_offset}, "
            f"buckets={self._buckets} (local {self._layout.start_bucket}..{self._layout.start_bucket + self._layout.num_local - 1}), "
            f"policy={self._eviction_policy!r}, eviction_interval={self._eviction_interval}, "
            f"immediate_eviction_fraction={self._immediate_fraction}, admission_threshold={self._admission_threshold}"
        )

