"""Checks of a batched lookup's ids and offsets, at the cost of at most one host read per call.

A bad id must never reach a kernel that would read outside its table, and the user must get an
error naming the table, the feature and the id. Reading device values on the host stalls a CUDA
stream, so the checks come in two modes:

========  ======================================================================================
``sync``  (every backend, the default except below) all conditions are reduced on the device and
          read back in ONE host read; only when something is wrong does the precise check run
          again to word the error. On CPU the read is free; on CUDA it is one sync per call.
``async`` (Triton backend on CUDA) no host read at all: the Triton kernels check every offset and
          id themselves, skip bad ones (no out-of-bounds read) and raise a device flag that is
          copied to pinned memory behind the launch. The flag is looked at when the copy has
          landed, at the next call of the module or :meth:`LookupInputChecker.report_pending`,
          and then raises the same precise error, saying which earlier call it came from.
========  ======================================================================================

Shape and dtype checks use host-side sizes only and raise at once in both modes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lightrec._native import cpu_ops_loaded
from lightrec.modules.feature_checks import EmbeddingIdError
from lightrec.sparse import SparseValueError

__all__ = ["ID_CHECK_MODES", "LookupInputChecker"]

ID_CHECK_MODES = ("auto", "sync", "async")
_MAX_PENDING = 8  # async checks in flight before the oldest is waited for (the GPU ran far behind)


@dataclass
class _Pending:
    flag: torch.Tensor  # [1] int32 host copy of the kernels' error flag (pinned on CUDA)
    event: torch.cuda.Event | None  # completes when the copy has landed (None: already there)
    indices: torch.Tensor
    offsets: torch.Tensor
    batch: int
    call: int


class LookupInputChecker:
    """Validates ``(indices, offsets, per_sample_weights)`` of one batched module.

    Args:
        rows: rows of each table.
        feature_table_map: ``[T]`` table of each feature.
        table_names: names used in error messages.
        mode: ``"sync"`` or ``"async"`` (see the module docstring).
    """

    def __init__(
        self, rows: Sequence[int], feature_table_map: Sequence[int], table_names: Sequence[str], mode: str
    ) -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"id_check mode must be 'sync' or 'async', got {mode!r}")
        self.rows, self.ftm, self.table_names, self.mode = (
            list(rows),
            list(feature_table_map),
            list(table_names),
            mode,
        )
        self.num_features = len(self.ftm)
        feature_rows = [self.rows[t] for t in self.ftm]
        self._uniform_rows = feature_rows[0] if len(set(feature_rows)) == 1 else None
        self._feature_rows = feature_rows
        self._rows_per_feature: dict[torch.device, torch.Tensor] = {}  # per device, made once
        self._pending: deque[_Pending] = deque()
        self._calls = 0

    def __getstate__(self) -> dict[str, object]:
        # Copies (deepcopy, pickling) start with no pending async checks (CUDA events do not copy).
        state = dict(self.__dict__)
        state["_pending"], state["_rows_per_feature"] = deque(), {}
        return state

    # ---- host-only checks ----------------------------------------------------------------------

    def check_shapes(
        self, indices: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None
    ) -> int:
        """Dims, dtypes and sizes (no device read); returns the batch size ``B``."""
        if indices.dim() != 1 or offsets.dim() != 1:
            raise ValueError(
                f"indices and offsets must be 1-D, got shapes {tuple(indices.shape)}, {tuple(offsets.shape)}"
            )
        if indices.dtype not in (torch.int64, torch.int32) or offsets.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"indices/offsets must be int32 or int64, got {indices.dtype}/{offsets.dtype}")
        num_bags = offsets.numel() - 1
        if num_bags < 0 or num_bags % self.num_features:
            raise ValueError(
                f"offsets must have T*B + 1 entries for T={self.num_features} features, got {offsets.numel()}"
            )
        if per_sample_weights is not None and per_sample_weights.shape != indices.shape:
            raise ValueError(
                f"per_sample_weights must match indices {tuple(indices.shape)}, got {tuple(per_sample_weights.shape)}"
            )
        return num_bags // self.num_features

    # ---- sync mode -----------------------------------------------------------------------------

    def check_values(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        batch: int,
        want_singletons: bool = False,
        per_sample_weights: torch.Tensor | None = None,
    ) -> bool | None:
        """Offsets, id ranges and finite weights with one host read; raises the precise error when one fails.

        Returns whether every bag holds exactly one id (read in the same host read) when
        ``want_singletons``, else None.
        """
        n = indices.numel()
        if batch == 0 or n == 0:
            # No id to check, but the offsets must still all be 0 and there must be no id outside a
            # bag: a kernel reads ids by the offsets (past the end of an empty ``indices``).
            if n != 0 or bool((offsets != 0).any()):
                self.raise_precise(indices, offsets, batch)
            return None
        weights = per_sample_weights if per_sample_weights is not None and per_sample_weights.is_floating_point() else None
        if indices.device.type == "cpu" and offsets.device.type == "cpu" and _native_checks():
            return self._check_values_native(indices, offsets, batch, want_singletons, weights)
        starts = offsets[:-1]
        conditions = [
            (offsets[0] != 0) | (offsets[-1] != n),
            (offsets[1:] < starts).any(),
            self._any_bad_id(indices, offsets, batch),
            torch.logical_not(torch.isfinite(weights).all()) if weights is not None else offsets.new_zeros((), dtype=torch.bool),
        ]
        singletons = want_singletons and n == starts.numel()
        if singletons:
            conditions.append(
                (offsets == torch.arange(n + 1, device=offsets.device, dtype=offsets.dtype)).all()
            )
        found = torch.stack(conditions).tolist()  # the one host read
        if any(found[:4]):
            self.raise_precise(indices, offsets, batch, per_sample_weights=weights)
        return bool(found[4]) if singletons else (False if want_singletons else None)

    def _check_values_native(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        batch: int,
        want_singletons: bool,
        weights: torch.Tensor | None,
    ) -> bool | None:
        """:meth:`check_values` on CPU in one native pass (``lightrec/csrc/lookup_inputs.cpp``): the
        same conditions, ~20 us instead of ~190 us for 53k ids of 26 features."""
        offsets_ok, ids_ok, singletons = torch.ops.lightrec_cpu.check_lookup_inputs(
            indices.contiguous(), offsets.contiguous(), self._rows_on(indices.device), batch
        )
        if not (offsets_ok and ids_ok) or (weights is not None and not bool(torch.isfinite(weights).all())):
            self.raise_precise(indices, offsets, batch, per_sample_weights=weights)
        return bool(singletons) if want_singletons else None

    def _any_bad_id(self, indices: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
        if self._uniform_rows is not None:  # one min/max pass for all features
            low, high = torch.aminmax(indices)
            return (low < 0) | (high >= self._uniform_rows)
        # Each id's feature from the feature boundaries (safe even when offsets are malformed).
        bounds = offsets[::batch].contiguous()
        positions = torch.arange(indices.numel(), device=indices.device, dtype=bounds.dtype)
        feature = (torch.searchsorted(bounds, positions, right=True) - 1).clamp_(0, self.num_features - 1)
        limit = self._rows_on(indices.device).index_select(0, feature)
        return ((indices < 0) | (indices >= limit)).any()

    def _rows_on(self, device: torch.device) -> torch.Tensor:
        """``[T]`` rows of each feature's table on ``device`` (copied there once, not per call)."""
        if device not in self._rows_per_feature:
            self._rows_per_feature[device] = torch.tensor(self._feature_rows, dtype=torch.long, device=device)
        return self._rows_per_feature[device]

    def raise_precise(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        batch: int,
        suffix: str = "",
        per_sample_weights: torch.Tensor | None = None,
    ) -> None:
        """The check with host reads at every step, raising the error that names what is wrong."""
        n = indices.numel()
        if int(offsets[-1]) != n or int(offsets[0]) != 0:
            raise ValueError(
                f"offsets must start at 0 and end at len(indices)={n}, got {offsets[[0, -1]].tolist()}{suffix}"
            )
        decreasing = (offsets[1:] < offsets[:-1]).nonzero()
        if decreasing.numel() > 0:  # a negative length (bag k is indices[offsets[k]:offsets[k+1]])
            bag = int(decreasing[0, 0])
            raise SparseValueError(
                f"{self._feature_of_bag(bag, batch)} has a negative length: "
                f"{int(offsets[bag + 1] - offsets[bag])} ids for sample {bag % batch}; a length counts the ids of "
                f"one sample and must be non-negative{suffix}"
            )
        counts = offsets[::batch].diff()
        limit = torch.repeat_interleave(self._rows_on(indices.device), counts, output_size=n)
        bad = (indices < 0) | (indices >= limit)
        if bool(bad.any()):
            pos = int(bad.nonzero()[0])
            feature = (
                int(
                    torch.searchsorted(
                        offsets[::batch].contiguous(), torch.tensor(pos, device=offsets.device), right=True
                    )
                )
                - 1
            )
            table = self.ftm[feature]
            raise EmbeddingIdError(
                f"id {int(indices[pos])} (position {pos}, feature {feature}) is out of range for table "
                f"{self.table_names[table]!r} with {self.rows[table]} rows: ids must be in [0, {self.rows[table]}). "
                f"Hash or take the id modulo num_embeddings, or enlarge the table.{suffix}"
            )
        if per_sample_weights is not None:
            nonfinite = torch.logical_not(torch.isfinite(per_sample_weights)).nonzero()
            if nonfinite.numel() > 0:
                pos = int(nonfinite[0, 0])
                bag = int(torch.searchsorted(offsets, torch.tensor(pos, device=offsets.device), right=True)) - 1
                raise SparseValueError(
                    f"{self._feature_of_bag(bag, batch)} has a non-finite weight {float(per_sample_weights[pos])} "
                    f"for sample {bag % batch}; per-id weights must be finite numbers (a NaN or infinite weight "
                    f"makes the pooled embedding of the sample NaN){suffix}"
                )

    def _feature_of_bag(self, bag: int, batch: int) -> str:
        """``"feature f (table 'name')"`` of bag ``bag`` (``batch`` bags per feature)."""
        feature = min(bag // max(batch, 1), self.num_features - 1)
        return f"feature {feature} (table {self.table_names[self.ftm[feature]]!r})"

    # ---- async mode ----------------------------------------------------------------------------

    def arm(self, error_flag: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, batch: int) -> None:
        """Queue the kernels' error flag of this call for a later look, then clear it for the next."""
        self._calls += 1
        if error_flag.device.type == "cuda":
            flag = torch.empty(1, dtype=error_flag.dtype, pin_memory=True)
            flag.copy_(error_flag, non_blocking=True)
            recorded = torch.cuda.Event()
            recorded.record()
            event: torch.cuda.Event | None = recorded
        else:
            flag, event = error_flag.clone(), None
        error_flag.zero_()  # ordered after the copy on the same stream
        self._pending.append(_Pending(flag, event, indices, offsets, batch, self._calls))
        if len(self._pending) > _MAX_PENDING:
            first = self._pending[0].event
            if first is not None:
                first.synchronize()

    def report_pending(self) -> None:
        """Raise the error of the first earlier call whose kernels flagged bad input (copies that
        have not landed yet stay queued; nothing here waits for the device)."""
        while self._pending and (self._pending[0].event is None or self._pending[0].event.query()):
            item = self._pending.popleft()
            if item.flag.numpy()[0] == 0:  # host memory: reading it does not touch the device
                continue
            self._pending.clear()
            suffix = (
                f" [found by the Triton kernels in call {item.call} of this module and reported at the next call, "
                "since id checks on CUDA run on the device; the bad ids were skipped (they contributed zero and "
                "received no update)]"
            )
            self.raise_precise(item.indices, item.offsets, item.batch, suffix)
            raise ValueError(f"the Triton kernels flagged malformed offsets or ids{suffix}")


# Whether the native check pass runs (the torch ops run where it does not); a module attribute, so that
# tests can turn it off.
_native_checks = cpu_ops_loaded
