"""``ManagedCollisionModule``: the interface of every managed-collision module (torchrec's ABC).

A managed-collision module maps raw ids (any int64 below ``input_hash_size``) of one table to its
rows ``[output_global_offset, output_global_offset + output_size())``. torchrec's methods --
``preprocess`` / ``profile`` / ``remap`` / ``forward`` on ``{name: JaggedTensor}`` dicts,
``evict()``, ``open_slots()``, ``rebuild_with_output_id_range`` -- are kept, and lightrec adds the
tensor-level calls its collections, sharders and serving code use:

* ``remap_values(values [N]) -> rows [N]`` -- one training (or, in eval mode, frozen) step;
* ``bucket_of(values) -> [N]`` -- the bucket of each raw id, which decides its rank when sharded;
* ``admit_ids(values, features)`` -- the ids the table maps: as torchrec's modules take any raw
  id, an id outside ``[0, input_hash_size)`` is folded into it (``id mod input_hash_size``, a
  warning once per table) -- or, with ``set_strict_checks(True)``, ``check_ids`` raises
  :class:`ManagedCollisionIdError` naming the table;
* ``slot_state()`` -- the per-slot tensors that are saved and resharded with the table's rows.

Subclasses written against torchrec's interface alone work too: the default ``remap_values`` goes
through their dict methods.
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Mapping

import torch
from torch import nn

from lightrec.modules.feature_checks import EmbeddingIdError, strict_checks_enabled
from lightrec.sparse import JaggedTensor

__all__ = ["ManagedCollisionIdError", "ManagedCollisionModule", "ids_in_range"]


class ManagedCollisionIdError(EmbeddingIdError):
    """A raw id outside ``[0, input_hash_size)`` of a managed-collision table."""


class ManagedCollisionModule(nn.Module, abc.ABC):
    """Base class of managed-collision modules (see the module docstring).

    Args:
        device: where the module's state lives.
    """

    # The sizes every module has; its constructor sets them (read by output_size, input_size, buckets).
    _zch_size: int
    _input_hash_size: int
    _buckets: int
    # Where its rows sit in the table (a shard's); a module of the whole table may leave the defaults.
    _output_global_offset: int = 0
    _output_segments: list[int] | None = None

    def __init__(self, device: torch.device | str | None = None) -> None:
        super().__init__()
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._name: str | None = None

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def table_name(self) -> str:
        """The table this module serves (set by ``ManagedCollisionCollection``), for messages."""
        return self._name or "<unnamed>"

    # ---- torchrec's interface ----------------------------------------------------------------
    @abc.abstractmethod
    def preprocess(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        """Apply ``input_hash_func`` (if any) to the raw ids."""

    @abc.abstractmethod
    def profile(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        """Record the ids of a training step (and evict/insert); returns ``features``."""

    @abc.abstractmethod
    def remap(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        """Raw ids -> rows."""

    @abc.abstractmethod
    def forward(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        """``preprocess`` + ``profile`` + ``remap``."""

    @abc.abstractmethod
    def evict(self) -> torch.Tensor | None:
        """Rows evicted since the last call (global indices), whose weights and optimizer state the
        embedding module must reset; None when there are none."""

    def output_size(self) -> int:
        """Number of rows this module maps to (its table's rows, or its shard's)."""
        return self._zch_size

    def input_size(self) -> int:
        """Size of the raw id space (``input_hash_size``)."""
        return self._input_hash_size

    def buckets(self) -> int:
        """Number of buckets of the whole table (the unit of resharding)."""
        return self._buckets

    @abc.abstractmethod
    def validate_state(self) -> None:
        """Check the state after a load and rebuild what is derived from it."""

    def check_state_dict(self, state_dict: Mapping[str, object], prefix: str) -> None:
        """Raise what loading this module's entries of ``state_dict`` (keys under ``prefix``) would
        raise, changing nothing (neither the module nor ``state_dict``).

        Loads call it before copying anything -- the collections for their embedding tables too --
        so a state of other buckets or a corrupt id map fails before any weight changes. The
        default checks nothing (a module whose load cannot fail on its values).

        Raises:
            ValueError: naming the table, the key and what does not fit.
        """

    @abc.abstractmethod
    def open_slots(self) -> torch.Tensor:
        """Number of free rows (a 1-element tensor)."""

    @abc.abstractmethod
    def rebuild_with_output_id_range(
        self,
        output_id_range: tuple[int, int],
        output_segments: list[int],
        device: torch.device | None = None,
    ) -> ManagedCollisionModule:
        """This module's twin serving rows ``[start, end)`` of the table (one shard of it)."""

    # ---- lightrec's tensor-level interface -----------------------------------------------------
    @property
    def output_global_offset(self) -> int:
        """First table row this module maps to (0 unless it serves a shard)."""
        return self._output_global_offset

    @property
    def output_segments(self) -> list[int]:
        """Global row offsets of the table's buckets (``buckets() + 1`` of them; without buckets set by
        the constructor, the one segment of this module's rows)."""
        if self._output_segments is not None:
            return list(self._output_segments)
        return [self.output_global_offset, self.output_global_offset + self.output_size()]

    def on_device(self, device: torch.device | str) -> ManagedCollisionModule:
        """This module's twin with the same configuration and fresh state on ``device`` (e.g. a
        ``meta`` module made real before a state dict is loaded into it)."""
        start = self.output_global_offset
        twin = self.rebuild_with_output_id_range((start, start + self.output_size()), self.output_segments,
                                                 torch.device(device))  # fmt: skip
        twin._name = self._name
        twin.train(self.training)
        return twin

    def bucket_of(self, values: torch.Tensor) -> torch.Tensor:
        """``[N]`` global bucket of each (preprocessed) raw id."""
        return torch.zeros_like(values)

    def preprocess_values(self, values: torch.Tensor) -> torch.Tensor:
        """``preprocess`` on a flat id tensor."""
        return self.preprocess({"ids": JaggedTensor(values=values, lengths=_one_bag(values))})["ids"].values()

    def remap_values(self, values: torch.Tensor, feature_splits: list[int] | None = None) -> torch.Tensor:
        """One step on the (preprocessed) ids of every feature of the table: ``[N]`` -> rows ``[N]``.

        ``feature_splits``: ids of each feature of the table, in order (modules that treat features
        differently read it; ``None``: one feature).
        """
        features = {self.table_name: JaggedTensor(values=values, lengths=_one_bag(values))}
        return self.remap(self.profile(features))[self.table_name].values()

    def preprocess_is_identity(self) -> bool:
        """Whether ``preprocess`` leaves ids as they are (no ``input_hash_func``): a collection may then
        check the ids of several tables at once. False unless a subclass knows better."""
        return False

    def check_ids(self, values: torch.Tensor, features: list[str]) -> None:
        """Raise :class:`ManagedCollisionIdError` for ids outside ``[0, input_size())``.

        ``input_size() == 0`` (the hash module's "unbounded") accepts every non-negative id.
        """
        if values.numel() == 0 or ids_in_range(values, self.input_size()):
            return
        limit = self.input_size()
        bad = values < 0 if limit == 0 else (values < 0) | (values >= limit)
        value = int(values[torch.nonzero(bad)[0, 0]])
        space = "[0, 2**63)" if limit == 0 else f"[0, {limit})"
        raise ManagedCollisionIdError(
            f"managed-collision table {self.table_name!r} (features {features}) got raw id {value}, outside its "
            f"id space {space} (input_hash_size={limit}); map ids into that range (e.g. input_hash_func="
            "lightrec.modules.mc_modules.mix64_hash) or raise input_hash_size"
        )

    def admit_ids(self, values: torch.Tensor, features: list[str]) -> torch.Tensor:
        """``values`` (``[N]`` raw ids, after ``preprocess``) as this table maps them.

        Ids in ``[0, input_size())`` pass unchanged. torchrec's modules take any int64, so by default
        an id outside is folded into the id space (``id mod input_size()``; for the hash module's
        unbounded 0, whose ids are all of ``[0, 2**63)``, a negative id ``mod 2**63 - 1``) with one
        warning per table; with the strict checks on
        (``lightrec.modules.feature_checks.set_strict_checks(True)``) :meth:`check_ids` raises.
        """
        if values.numel() == 0 or ids_in_range(values, self.input_size()):
            return values
        if strict_checks_enabled():
            self.check_ids(values, features)
        limit = self.input_size() or _INT64_ID_SPACE
        folded = torch.remainder(values, limit)
        if self.input_size() == 0:  # 2**63 - 1 is an id of the unbounded space: only negative ids fold
            folded = torch.where(values < 0, folded, values)
        warnings.warn(
            f"managed-collision table {self.table_name!r} got raw ids outside [0, {limit}): folded into it "
            f"(id mod {limit}), as torchrec takes any id; set_strict_checks(True) makes them an error",
            UserWarning,
            stacklevel=2,
        )
        return folded

    def slot_state(self) -> dict[str, torch.Tensor]:
        """``{buffer name: [output_size()] tensor}`` of the per-row state saved with the table."""
        return {}

    def frozen_remapper(self) -> nn.Module:
        """A copy of the current id map as a serving remapper (``lightrec.modules.managed_collision.serving``).

        Raises:
            TypeError: this module type has no frozen form.
        """
        raise TypeError(
            f"managed-collision table {self.table_name!r}: {type(self).__name__} has no frozen serving form; "
            "serve MCHManagedCollisionModule or HashZchManagedCollisionModule tables"
        )

    def current_iteration(self) -> int:
        """Training steps taken (seeds the re-initialisation of evicted rows)."""
        return 0

    def reset_buckets(self) -> tuple[list[int], int]:
        """``(global row offsets of this module's buckets, global index of the first)``: the
        re-initialisation of evicted rows draws each bucket's rows from a generator of its own."""
        return [self.output_global_offset, self.output_global_offset + self.output_size()], 0

    def index_bytes_per_row(self, device_type: str = "cpu") -> float:
        """Memory per row of what the module derives from its state and keeps beside its buffers
        (a search index) when it trains on ``device_type``; the planner adds it to the table's memory."""
        return 0.0

    def mc_stats(self) -> dict[str, float]:
        """Counters for monitoring (occupancy, evictions, default-row lookups...); see subclasses."""
        return {}


#: The id space of a table whose ``input_size()`` is 0 ("unbounded": any non-negative int64).
_INT64_ID_SPACE = 2**63 - 1


def ids_in_range(values: torch.Tensor, limit: int) -> bool:
    """Whether every id of ``values`` (non-empty) is in ``[0, limit)`` (``limit == 0``: any id >= 0);
    one pass over the ids."""
    low, high = torch.aminmax(values)
    return int(low) >= 0 and (limit == 0 or int(high) < limit)


def _one_bag(values: torch.Tensor) -> torch.Tensor:
    return torch.tensor([values.numel()], dtype=torch.int64, device=values.device)
