"""The states the tracking modes keep per row, read from the kernels (``EmbeddingKernel.read_rows``).

==================  =====================  ==============================================================
mode                needs                   state of a row in a read
==================  =====================  ==============================================================
EMBEDDING           a sequence collection  ``[cols]`` the row as first looked up in the window (the
                                           lookup's own output, so no extra read)
MOMENTUM_LAST       ``momentum1 [rows, D]``  ``[]`` the L2 norm of the row's first moment when read
MOMENTUM_DIFF /     one value per row      ``[]`` the per-row accumulator when read minus its value at
ROWWISE_ADAGRAD     (``[rows]``)           the row's first lookup in the window (read before the update)
==================  =====================  ==============================================================

``read_rows`` goes through a tiered table's cache, so SSD / host-memory tables give their current
values. A table must have one shard on the rank (a rank holding two column slices of one table
would need its states joined; plan one slice per rank) and, for the optimizer modes, a fused
kernel (a data-parallel table's optimizer state lives in its gradient sync, not in a kernel).
"""

from __future__ import annotations

import torch

from lightrec.distributed.model_tracker.tables import LookupKeys, TrackedTable
from lightrec.distributed.model_tracker.types import TrackingMode, UnsupportedTrackingError
from lightrec.optim.fused_spec import EmbOptimType
from lightrec.sparse import KeyedJaggedTensor

__all__ = ["check_mode", "live_states", "states_at_lookup"]

# Optimizers with a [rows, dim] first moment (MOMENTUM_LAST) and with one value per row (the DIFF modes).
_FIRST_MOMENT = frozenset({EmbOptimType.ADAM, EmbOptimType.LAMB, EmbOptimType.LARS_SGD,
                           EmbOptimType.PARTIAL_ROWWISE_ADAM, EmbOptimType.PARTIAL_ROWWISE_LAMB})  # fmt: skip
_ROW_STATE = {
    EmbOptimType.ROWWISE_ADAGRAD: "momentum1",
    EmbOptimType.PARTIAL_ROWWISE_ADAM: "momentum2",
    EmbOptimType.PARTIAL_ROWWISE_LAMB: "momentum2",
}
_DIFF_MODES = (TrackingMode.MOMENTUM_DIFF, TrackingMode.ROWWISE_ADAGRAD)


def check_mode(mode: TrackingMode, tables: dict[str, TrackedTable]) -> None:
    """Raise ``UnsupportedTrackingError`` naming the first table that cannot give ``mode``'s state."""
    if mode == TrackingMode.ID_ONLY:
        return
    for fqn, table in tables.items():
        where = f"TrackingMode.{mode.name} cannot track table {fqn!r}"
        if len(table.local) > 1:
            raise UnsupportedTrackingError(f"{where}: this rank holds {len(table.local)} column slices of it; plan at "
                                           "most one slice per rank, or track it with TrackingMode.ID_ONLY")  # fmt: skip
        if mode == TrackingMode.EMBEDDING:
            if table.pooled:
                raise UnsupportedTrackingError(
                    f"{where}: a pooled (EmbeddingBagCollection) lookup returns bags, not rows, so it has no row "
                    "values to keep (as in torchrec); track EmbeddingCollection tables, or use ID_ONLY and read the "
                    "rows when needed (lightrec.distributed.deltas.publish_changes does)")
            continue
        if table.data_parallel or table.optimizer is None:
            raise UnsupportedTrackingError(f"{where}: it has no fused kernel holding optimizer state "
                                           f"({table.sharding_type}, optimizer {table.optimizer}); skip its collection "
                                           "(fqns_to_skip) or use ID_ONLY / EMBEDDING")  # fmt: skip
        kind = table.optimizer.optimizer
        if mode == TrackingMode.MOMENTUM_LAST and kind not in _FIRST_MOMENT:
            raise UnsupportedTrackingError(f"{where}: its optimizer {kind.name} keeps no [rows, dim] first moment; "
                                           f"MOMENTUM_LAST needs one of {sorted(k.name for k in _FIRST_MOMENT)}")
        if mode in _DIFF_MODES and kind not in _ROW_STATE:
            raise UnsupportedTrackingError(f"{where}: its optimizer {kind.name} keeps no per-row accumulator; "
                                           f"{mode.name} needs one of {sorted(k.name for k in _ROW_STATE)}")


def _read(table: TrackedTable, ids: torch.Tensor, state: str | None) -> torch.Tensor:
    """Weights ``[n, cols]`` (``state`` None) or state ``state`` of global rows ``ids`` of this rank's shard."""
    shard = table.local[0]
    found = shard.kernel.kernel.read_rows(shard.kernel_table, ids - shard.row_offset)
    return found.weights if state is None else found.states[state]


def live_states(mode: TrackingMode, table: TrackedTable, ids: torch.Tensor, first: bool) -> torch.Tensor:
    """The state ``mode`` keeps for global rows ``ids`` of ``table``, read now.

    Args:
        first: read as a lookup would record it (EMBEDDING: the row; DIFF modes: the accumulator),
            else as a read reports it (MOMENTUM_LAST: the first moment's norm; DIFF: the accumulator).
    """
    if not table.local or ids.numel() == 0:
        width = table.dim if mode == TrackingMode.EMBEDDING else None
        return torch.zeros((ids.numel(), width) if width else (ids.numel(),))
    if mode == TrackingMode.EMBEDDING:
        return _read(table, ids, None).float()
    if mode == TrackingMode.MOMENTUM_LAST:
        return _read(table, ids, "momentum1").float().reshape(ids.numel(), -1).norm(dim=1)
    assert table.optimizer is not None  # check_mode refused tables without one
    return _read(table, ids, _ROW_STATE[table.optimizer.optimizer]).float().reshape(-1)


def states_at_lookup(tables: dict[str, TrackedTable], keys: LookupKeys, features: KeyedJaggedTensor) -> torch.Tensor:
    """DIFF modes: ``[N]`` the per-row accumulator of each id ``features`` holds (in value order), read
    before the lookup's backward updates it (0 for keys that are not tracked)."""
    values = features.values()
    out = torch.zeros(values.numel(), dtype=torch.float32, device=values.device)
    offsets = features.offset_per_key()
    for k, key in enumerate(keys.keys):
        if key is None or offsets[k] == offsets[k + 1]:
            continue
        ids = values[offsets[k] : offsets[k + 1]].to(torch.int64) + key.row_offset
        out[offsets[k] : offsets[k + 1]] = live_states(TrackingMode.MOMENTUM_DIFF, tables[key.fqn], ids, first=True)
    return out
