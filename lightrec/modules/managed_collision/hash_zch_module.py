"""``HashZchManagedCollisionModule``: torchrec's multi-probe zero-collision hash, in plain torch.

Each raw id is routed to a bucket (``TrainInputMapper``: ``id // ceil(input_hash_size / B)``, or
``id % B`` when ``input_hash_size == 0``), then hashed to a probe start inside that bucket's segment
of the table; training inserts it in the first free (or expired) probed slot, lookups find it there
(:mod:`lightrec.modules.managed_collision.hash_zch_probe`). State: ``_hash_zch_identities`` ``[Z, 1]`` (the id in each
slot, ``-1`` empty) and, with eviction, ``_hash_zch_metadata`` ``[Z, 1]`` -- torchrec's names and
layout, so its state dicts load; both are per row, so they shard and reshard with the table -- and
``_current_iter_tensor`` ``[1]``, the training steps taken (replicated when sharded; optional on load).

Where torchrec needs fbgemm's CUDA kernel to train (its CPU op is lookup-only), this runs on any
device; new ids racing for a slot are seated smallest first (deterministic). ``opt_in_prob`` draws
an id's admission from a hash of the id instead of ``torch.rand`` (the same id is always admitted
or never, on every rank). In eval mode the module is read-only: unknown ids fall back to their
first probe position.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
from torch import nn

from lightrec.modules.managed_collision.base import ManagedCollisionModule
from lightrec.modules.managed_collision.hash_zch_eviction import (
    HashZchEvictionConfig,
    HashZchEvictionModule,
    HashZchEvictionPolicyName,
    now_hours,
)
from lightrec.modules.managed_collision.hash_zch_probe import (
    EMPTY_IDENTITY,
    murmur3_2x64,
    probe_insert,
    probe_lookup,
    unsigned_mod,
)
from lightrec.modules.managed_collision.ops import block_bucket, check_input_hash_size, int64_ids, mix64
from lightrec.modules.managed_collision.serving import FrozenHashZchRemapper
from lightrec.sparse import JaggedTensor

__all__ = ["HashZchManagedCollisionModule", "TrainInputMapper"]

logger = logging.getLogger(__name__)


class TrainInputMapper(nn.Module):
    """Bucket of each id, and the id as the table stores it (torchrec's module and arguments).

    Args:
        input_hash_size: id space (0: unbounded, buckets by ``id % total_num_buckets``).
        total_num_buckets: buckets of the whole table.
        size_per_rank / train_rank_offsets: kept for torchrec's signature (segments are the module's).
        inference_dispatch_div_train_world_size: store ``id // B`` (or ``id % block``) instead of the
            id, as torchrec's inference dispatch does.
        name: the table.
    """

    def __init__(
        self,
        input_hash_size: int,
        total_num_buckets: int,
        size_per_rank: torch.Tensor | None = None,
        train_rank_offsets: torch.Tensor | None = None,
        inference_dispatch_div_train_world_size: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__()
        if total_num_buckets < 1:
            raise ValueError(f"total_num_buckets must be positive, got {total_num_buckets}")
        self._input_hash_size = input_hash_size
        self._buckets = total_num_buckets
        self._div = inference_dispatch_div_train_world_size
        self._name = name

    def forward(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values as stored [N], bucket [N])``."""
        bucket = block_bucket(values, self._input_hash_size, self._buckets)
        if self._div:
            if self._input_hash_size == 0:
                values = torch.div(values, self._buckets, rounding_mode="floor")
            else:
                values = torch.remainder(values, -(-self._input_hash_size // self._buckets))
        return values, bucket


class HashZchManagedCollisionModule(ManagedCollisionModule):
    """Multi-probe managed-collision hash of one table (see the module docstring).

    Args:
        zch_size: rows of the table (or of this shard).
        device: where the state lives.
        total_num_buckets: buckets of the whole table; ``zch_size`` must be a multiple of it, and a
            row-wise sharded table needs a multiple of the world size.
        max_probe: slots probed per id.
        input_hash_size: id space (0: any non-negative int64, bucketed by ``id % buckets``).
        output_segments: ``B + 1`` row offsets of the buckets (sharding passes them).
        is_inference: build read-only (serving).
        name: the table.
        tb_logging_frequency: accepted for torchrec's signature; log with
            ``lightrec.lightning.ManagedCollisionMonitor`` instead.
        eviction_policy_name / eviction_config: see :mod:`lightrec.modules.managed_collision.hash_zch_eviction`.
        inference_dispatch_div_train_world_size: see :class:`TrainInputMapper`.
        start_bucket / end_bucket: the buckets this module serves (sharding passes them).
        opt_in_prob: percentage (1-99) of new ids admitted; the others share ``percent_reserved_slots``
            of the rows at the end of each bucket (-1: admit all).
        percent_reserved_slots: see ``opt_in_prob``.

    State dict: ``_hash_zch_identities``, ``_hash_zch_metadata`` (with eviction) -- torchrec's keys --
    and ``_current_iter_tensor`` ``[1]``, the training steps taken, which seed the re-initialisation of
    evicted rows: a module restored from a checkpoint continues exactly as an uninterrupted run. A
    state dict saved without it (by torchrec, or by lightrec before it was saved) still loads, also
    strictly, and leaves the module's step count as it was (0 for a fresh module).

    Raises:
        ValueError: sizes that are not positive, ``zch_size`` not a multiple of the buckets,
            ``start_bucket`` / ``end_bucket`` outside ``[0, total_num_buckets]`` or not holding
            ``zch_size`` rows, or ``opt_in_prob`` with a bucket of fewer than 2 rows.
    """

    IDENTITY_BUFFER = "_hash_zch_identities"
    METADATA_BUFFER = "_hash_zch_metadata"
    ITER_BUFFER = "_current_iter_tensor"
    _current_iter_tensor: torch.Tensor
    _output_segments: list[int]  # always set by the constructor (the base allows None)

    def __init__(
        self,
        zch_size: int,
        device: torch.device | str | None,
        total_num_buckets: int,
        max_probe: int = 128,
        input_hash_size: int = 0,
        output_segments: list[int] | None = None,
        is_inference: bool = False,
        name: str | None = None,
        tb_logging_frequency: int = 0,
        eviction_policy_name: HashZchEvictionPolicyName | None = None,
        eviction_config: HashZchEvictionConfig | None = None,
        inference_dispatch_div_train_world_size: bool = False,
        start_bucket: int = 0,
        end_bucket: int | None = None,
        opt_in_prob: int = -1,
        percent_reserved_slots: float = 0,
    ) -> None:
        super().__init__(device)
        self._name = name
        where = f"HashZchManagedCollisionModule({name!r})" if name else "HashZchManagedCollisionModule"
        check_input_hash_size(input_hash_size, where)
        if total_num_buckets < 1 or max_probe < 1 or zch_size < 1:
            raise ValueError(f"{where}: zch_size, total_num_buckets and max_probe must be positive")
        if output_segments is None:
            if zch_size % total_num_buckets:
                raise ValueError(f"{where}: zch_size={zch_size} must be a multiple of total_num_buckets={total_num_buckets}")
            output_segments = [zch_size // total_num_buckets * b for b in range(total_num_buckets + 1)]
        if len(output_segments) != total_num_buckets + 1:
            raise ValueError(f"{where}: output_segments {output_segments} must have total_num_buckets + 1 entries")
        end_bucket = total_num_buckets if end_bucket is None else end_bucket
        if not 0 <= start_bucket < end_bucket <= total_num_buckets:
            raise ValueError(f"{where}: start_bucket={start_bucket}, end_bucket={end_bucket} must satisfy "
                             f"0 <= start_bucket < end_bucket <= total_num_buckets={total_num_buckets}; "
                             "leave them unset for an unsharded table")  # fmt: skip
        if output_segments[end_bucket] - output_segments[start_bucket] != zch_size:
            raise ValueError(f"{where}: buckets [{start_bucket}, {end_bucket}) of {output_segments} hold "
                             f"{output_segments[end_bucket] - output_segments[start_bucket]} rows, not zch_size={zch_size}")  # fmt: skip
        if opt_in_prob != -1 and not (0 < opt_in_prob < 100 and 0 < percent_reserved_slots < 100):
            raise ValueError(f"{where}: opt_in_prob must be in (0, 100) with percent_reserved_slots in (0, 100)")
        smallest = min(output_segments[b + 1] - output_segments[b] for b in range(start_bucket, end_bucket))
        if opt_in_prob != -1 and smallest < 2:
            # Each bucket reserves at least one row for ids not opted in; a bucket of one row would
            # leave none to probe for the admitted ids (a division by zero at the first batch).
            raise ValueError(f"{where}: opt_in_prob={opt_in_prob} needs at least 2 rows per bucket (one is "
                             f"reserved), got a bucket of {smallest} row(s); raise zch_size or lower "
                             f"total_num_buckets={total_num_buckets}")  # fmt: skip
        self._zch_size = zch_size
        self._buckets = total_num_buckets
        self._max_probe = max_probe
        self._input_hash_size = input_hash_size
        self._output_segments = list(output_segments)
        self._start_bucket, self._end_bucket = start_bucket, end_bucket
        self._is_inference = is_inference
        self._opt_in_prob = opt_in_prob
        self._percent_reserved_slots = float(percent_reserved_slots)
        self._eviction_policy_name = eviction_policy_name
        self._eviction_config = eviction_config
        self._eviction_module = (
            HashZchEvictionModule(eviction_policy_name, self._device, eviction_config)
            if eviction_policy_name is not None else None
        )  # fmt: skip
        if tb_logging_frequency:
            logger.info("%s: tb_logging_frequency is ignored; use lightrec.lightning.ManagedCollisionMonitor", where)
        self.input_mapper = TrainInputMapper(input_hash_size, total_num_buckets, None, None,
                                             inference_dispatch_div_train_world_size, name)  # fmt: skip
        dev = self._device
        self._hash_zch_identities = nn.Parameter(
            torch.full((zch_size, 1), EMPTY_IDENTITY, dtype=torch.int64, device=dev), requires_grad=False
        )
        metadata = torch.full((zch_size, 1), -1, dtype=torch.int32, device=dev) if self._eviction_module else None
        self.register_buffer(self.METADATA_BUFFER, metadata)
        start = output_segments[start_bucket]
        self._local_bounds = [s - start for s in output_segments[start_bucket : end_bucket + 1]]
        self._output_global_offset = start
        self._evicted: list[torch.Tensor] = []
        # Training steps taken: seeds the fresh values of evicted rows (a constant seed would give every
        # step's evicted rows the same values). Saved as ``_current_iter_tensor`` (MCH's key, replicated
        # when sharded) so a restored run re-initialises as an uninterrupted one; the int is its copy.
        self._current_iter = 0
        self.register_buffer(self.ITER_BUFFER, torch.zeros(1, dtype=torch.int64, device=dev))
        self._stats = {"lookups": 0.0, "default_lookups": 0.0, "inserted": 0.0, "evicted": 0.0}
        if is_inference:
            self.eval()

    # ---- torchrec's interface ----------------------------------------------------------------
    def preprocess(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        return features

    def preprocess_is_identity(self) -> bool:
        return True

    def profile(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        return features

    def remap(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        out: dict[str, JaggedTensor] = {}
        for name, jt in features.items():
            splits = [int(n) for n in jt.weights().tolist()] if jt.weights_or_none() is not None else None
            # torchrec's interface takes any id: fold it into the id space as the collection does (an
            # unadmitted -1 would match every empty slot, whose identity is -1)
            values = self.admit_ids(int64_ids(jt.values()), [name])
            out[name] = JaggedTensor(values=self.remap_values(values, splits), lengths=jt.lengths(),
                                     weights=jt.weights_or_none())  # fmt: skip
        return out

    def forward(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        return self.remap(features)

    def evict(self) -> torch.Tensor | None:
        if not self._evicted:
            return None
        out: torch.Tensor = torch.unique(torch.cat(self._evicted)) + self._output_global_offset
        self._evicted = []
        return out

    def open_slots(self) -> torch.Tensor:
        return (self._hash_zch_identities == EMPTY_IDENTITY).sum().reshape(1).cpu()

    def validate_state(self) -> None:
        """Identities are checked to be ids or -1; the step count is read from its saved buffer."""
        if self._hash_zch_identities.device.type != "meta":
            self._check_identities(self._hash_zch_identities)
        self._sync_iteration()

    def _sync_iteration(self) -> None:
        counter = self._current_iter_tensor
        if counter.device.type != "meta":
            self._current_iter = int(counter.item())

    def _load_from_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], prefix: str, local_metadata: dict[str, object], strict: bool,
        missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str],
    ) -> None:  # fmt: skip
        key = prefix + self.ITER_BUFFER
        absent = key not in state_dict
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)  # fmt: skip
        if absent:  # saved by torchrec or before the count was saved: the count stays as it is
            if key in missing_keys:
                missing_keys.remove(key)
            return
        self._sync_iteration()

    def _check_identities(self, identities: torch.Tensor) -> None:
        if bool((identities < EMPTY_IDENTITY).any()):
            raise ValueError(
                f"managed-collision table {self.table_name!r}: identities below -1 in the state (smallest "
                f"{int(identities.min())}); the state is corrupt -- load one this module saved"
            )

    def check_state_dict(self, state_dict: Mapping[str, object], prefix: str) -> None:
        identities = state_dict.get(prefix + self.IDENTITY_BUFFER)
        if isinstance(identities, torch.Tensor) and self._hash_zch_identities.device.type != "meta":
            self._check_identities(identities)

    def reset_inference_mode(self) -> None:
        self._is_inference = True
        self.eval()
        self._evicted = []

    def reset_training_mode(self) -> None:
        self._is_inference = False
        self.train()

    def rebuild_with_output_id_range(
        self,
        output_id_range: tuple[int, int],
        output_segments: list[int] | None = None,
        device: torch.device | None = None,
    ) -> HashZchManagedCollisionModule:
        segments = self._output_segments
        start, end = output_id_range
        if start not in segments or end not in segments:
            raise ValueError(
                f"rows [{start}, {end}) of table {self.table_name!r} do not cover whole buckets ({segments}); "
                f"total_num_buckets={self._buckets} must be a multiple of the world size"
            )
        return type(self)(
            zch_size=end - start, device=device or self._device, total_num_buckets=self._buckets,
            max_probe=self._max_probe, input_hash_size=self._input_hash_size, output_segments=segments,
            is_inference=self._is_inference, name=self._name, eviction_policy_name=self._eviction_policy_name,
            eviction_config=self._eviction_config,
            inference_dispatch_div_train_world_size=self.input_mapper._div,
            start_bucket=segments.index(start), end_bucket=segments.index(end),
            opt_in_prob=self._opt_in_prob, percent_reserved_slots=self._percent_reserved_slots,
        )  # fmt: skip

    # ---- lightrec's tensor-level interface -----------------------------------------------------
    def bucket_of(self, values: torch.Tensor) -> torch.Tensor:
        return block_bucket(values, self._input_hash_size, self._buckets)

    def reset_buckets(self) -> tuple[list[int], int]:
        return [b + self._output_global_offset for b in self._local_bounds], self._start_bucket

    def current_iteration(self) -> int:
        return self._current_iter

    def slot_state(self) -> dict[str, torch.Tensor]:
        out = {self.IDENTITY_BUFFER: self._hash_zch_identities.data}
        metadata = getattr(self, self.METADATA_BUFFER)
        if metadata is not None:
            out[self.METADATA_BUFFER] = metadata
        return out

    def frozen_remapper(self) -> FrozenHashZchRemapper:
        """The id map as a serving remapper: unknown ids fall back to their first probe position."""
        reserved = self._percent_reserved_slots if self._opt_in_prob != -1 else 0.0
        return FrozenHashZchRemapper(
            self._hash_zch_identities.data.cpu(), list(self._local_bounds), self._output_global_offset, self._max_probe,
            self._input_hash_size, self._buckets, self._start_bucket, reserved, self.input_mapper._div,
        )  # fmt: skip

    def mc_stats(self) -> dict[str, float]:
        free = float(self.open_slots().item()) if self._hash_zch_identities.device.type != "meta" else 0.0
        return {"rows": float(self._zch_size), "occupied": self._zch_size - free, **self._stats}

    def copy_state_from(self, other: HashZchManagedCollisionModule) -> None:
        """Take over the rows of ``other`` (the unsharded module) that this shard serves."""
        start = self._output_global_offset - other._output_global_offset
        with torch.no_grad():
            for name, buf in self.slot_state().items():
                src = other.slot_state().get(name)
                if src is not None and src.device.type != "meta":
                    buf.copy_(src[start : start + self._zch_size])
        self._current_iter = other._current_iter
        self._current_iter_tensor.fill_(other._current_iter)

    @torch.no_grad()
    def remap_values(self, values: torch.Tensor, feature_splits: list[int] | None = None) -> torch.Tensor:
        """Ids -> rows (training inserts new ids; eval and ``is_inference`` only look up).

        Args:
            values: ``[N]`` ids of the table's features, feature after feature.
            feature_splits: ids per feature (the per-feature TTL policy needs them).
        """
        values = values.long()
        training = self.training and not self._is_inference
        if training:  # (before the empty-batch return: every rank holding rows counts every step)
            self._current_iter += 1
            self._current_iter_tensor.fill_(self._current_iter)
        if values.numel() == 0:
            return values
        # Distinct *raw* ids, then their stored form: with inference_dispatch_div_train_world_size two
        # raw ids of different buckets may store the same value, and each must stay in its own bucket.
        raw, inverse = torch.unique(values, return_inverse=True)
        uniq, u_bucket = self.input_mapper(raw)
        local_b = (u_bucket - self._start_bucket).clamp_(0, len(self._local_bounds) - 2)
        bounds = torch.tensor(self._local_bounds, dtype=torch.int64, device=values.device)
        offset = bounds.index_select(0, local_b)
        size = bounds.index_select(0, local_b + 1) - offset
        hashed = murmur3_2x64(uniq)
        reserved = self._reserved_slots(size)
        block = size - reserved
        start = unsigned_mod(hashed, block)
        identities = self._hash_zch_identities.data.view(-1)
        slot = probe_lookup(identities, uniq, start, offset, block, self._max_probe)
        if training:
            slot = self._insert(identities, uniq, slot, start, offset, block, values, inverse, feature_splits)
        fallback = offset + torch.where(reserved > 0, block + unsigned_mod(hashed, reserved.clamp(min=1)),
                                        unsigned_mod(hashed, size))  # fmt: skip
        if self._opt_in_prob != -1:
            slot = torch.where(self._opted_in(uniq), slot, torch.full_like(slot, -1))
        rows = torch.where(slot >= 0, slot, fallback)
        if training:
            self._stats["lookups"] += values.numel()
            self._stats["default_lookups"] += float((slot < 0).index_select(0, inverse).sum())
        return rows.index_select(0, inverse) + self._output_global_offset

    def _reserved_slots(self, size: torch.Tensor) -> torch.Tensor:
        if self._opt_in_prob == -1:
            return torch.zeros_like(size)
        return (size.to(torch.float64) * self._percent_reserved_slots / 100).floor().long().clamp(min=1)

    def _opted_in(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.remainder(mix64(ids), 100) < self._opt_in_prob

    def _insert(
        self, identities: torch.Tensor, uniq: torch.Tensor, slot: torch.Tensor, start: torch.Tensor,
        offset: torch.Tensor, block: torch.Tensor, values: torch.Tensor, inverse: torch.Tensor,
        feature_splits: list[int] | None,
    ) -> torch.Tensor:  # fmt: skip
        metadata = getattr(self, self.METADATA_BUFFER)
        meta_flat = metadata.view(-1) if metadata is not None else None
        threshold = -1
        meta_new = None
        if self._eviction_module is not None and meta_flat is not None:
            per_value = self._eviction_module.ttl_per_value(values, feature_splits) + now_hours()
            meta_new = torch.zeros_like(uniq, dtype=torch.int32).scatter_reduce_(0, inverse, per_value, "amax",
                                                                               include_self=False)  # fmt: skip
            threshold = now_hours()
        missing = slot < 0
        if self._opt_in_prob != -1:
            missing &= self._opted_in(uniq)
        todo = torch.nonzero(missing).flatten()
        if meta_flat is not None and meta_new is not None:
            hits = slot >= 0
            meta_flat.scatter_reduce_(0, slot[hits], meta_new[hits], "amax")  # a lookup refreshes the expiry
        if todo.numel():
            lru = self._eviction_policy_name == HashZchEvictionPolicyName.LRU_EVICTION
            # The rows ids of this batch were found in are theirs for the whole step: no new id of the
            # batch may evict them (probe_insert adds the rows it seats).
            held = torch.zeros_like(identities, dtype=torch.bool).index_fill_(0, slot[slot >= 0], True)
            got, evicted = probe_insert(identities, meta_flat, uniq[todo], start[todo], offset[todo], block[todo],
                                        self._max_probe, threshold, lru,
                                        meta_new[todo] if meta_new is not None else None, held)  # fmt: skip
            slot = slot.clone()
            slot[todo] = got
            seated = got >= 0
            self._stats["inserted"] += float(seated.sum())
            if evicted.numel():
                self._evicted.append(evicted)
                self._stats["evicted"] += evicted.numel()
        return slot

    def extra_repr(self) -> str:
        return (f"name={self._name!r}, zch_size={self._zch_size}, buckets={self._buckets} "
                f"(local {self._start_bucket}..{self._end_bucket - 1}), max_probe={self._max_probe}, "
                f"eviction={self._eviction_policy_name}")  # fmt: skip
