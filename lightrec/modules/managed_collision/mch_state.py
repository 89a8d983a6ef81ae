"""State dicts of ``MCHManagedCollisionModule``: torchrec's sorted form in, slot order kept.

lightrec keeps a module's per-slot state slot-ordered (``_mch_sorted_raw_ids[i]`` is the id in slot
``i`` and ``_mch_remapped_ids_mapping`` is the identity), so that it shards and reshards with the
table's rows. torchrec keeps the ids sorted with ``_mch_remapped_ids_mapping`` giving each one's row;
``to_slot_order`` rewrites such an entry set (or a gathered sharded one, ``[zch, 1]`` columns) into
slot order before the module loads it, and fills lightrec-only keys a torchrec state dict lacks.
"""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["check_segments", "slot_order", "to_slot_order"]


class _SlotModule(Protocol):
    """What the conversions read of a module."""

    @property
    def table_name(self) -> str: ...

    @property
    def output_global_offset(self) -> int: ...

    @property
    def output_segments(self) -> list[int]: ...

    def output_size(self) -> int: ...

    def buckets(self) -> int: ...

    def slot_state(self) -> dict[str, torch.Tensor]: ...


def to_slot_order(module: _SlotModule, state_dict: dict[str, torch.Tensor], prefix: str, segments: torch.Tensor) -> None:
    """Rewrite the entries of ``module`` (under ``prefix``) in ``state_dict`` into slot order, in place.

    Args:
        module: the module about to load them.
        state_dict: torchrec's or lightrec's entries.
        prefix: the module's key prefix.
        segments: the module's ``_output_segments_tensor`` (stored in place of the saved one).

    Raises:
        ValueError: naming the table, for a wrong shape, a mapping that does not cover every row
            once, or other bucket segments.
    """
    where = f"managed-collision table {module.table_name!r}"
    z, offset = module.output_size(), module.output_global_offset
    per_slot = list(module.slot_state())
    check_segments(module, state_dict, prefix, where, segments)
    slot_order(state_dict, prefix, per_slot, z, offset, where)
    if "_mch_admission_counts" in per_slot and prefix + "_mch_admission_counts" not in state_dict:
        state_dict[prefix + "_mch_admission_counts"] = torch.zeros(z, dtype=torch.int64)  # lightrec's, not torchrec's
    if "_mch_victim_rank" in per_slot and prefix + "_mch_victim_rank" not in state_dict:
        state_dict[prefix + "_mch_victim_rank"] = torch.full((z,), -1, dtype=torch.int64)


def slot_order(state_dict: dict[str, torch.Tensor], prefix: str, per_slot: list[str], z: int, offset: int, where: str) -> None:
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


def check_segments(
    module: _SlotModule, state_dict: dict[str, torch.Tensor], prefix: str, where: str, segments: torch.Tensor
) -> None:
    """The saved bucket segments must be this module's (any, for a single-bucket unsharded module)."""
    offset, mine = module.output_global_offset, module.output_segments
    saved_tensor = state_dict.get(prefix + "_output_segments_tensor")
    if isinstance(saved_tensor, torch.Tensor):
        saved = [int(s) for s in saved_tensor.tolist() if s >= 0]
        if saved and saved[-1] != mine[-1] and module.buckets() == 1 and offset == 0:
            raise ValueError(f"{where}: the saved table has {saved[-1]} rows, this one {mine[-1]}")
        if saved and saved != mine and module.buckets() > 1:
            raise ValueError(
                f"{where}: the state was saved with bucket segments {saved}, this module has "
                f"{mine} (buckets={module.buckets()}); build it with the same zch_size and buckets"
            )
        state_dict[prefix + "_output_segments_tensor"] = segments.detach().clone().cpu()
