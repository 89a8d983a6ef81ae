"""``PendingUpdate``: versions read and verified, applied to a loaded artifact in place, all or nothing.

Applying is two steps, so that the part a server runs between two batches is only copies:

* :meth:`PendingUpdate.prepare` (no mutation; may run off the serving thread): find the tensors
  (:mod:`lightrec.serving.deltas.targets`), convert every row into the artifact's row format on its
  device -- fp32 rows are quantized exactly as ``lightrec.inference.quantize`` does it, so a patched
  int8 artifact holds the very bytes a fresh export would -- and compute the new id maps of
  managed-collision tables (a row's new id maps to it; the id it held before, now nowhere, goes to
  the default row like any unknown id);
* :meth:`PendingUpdate.apply`: ``index_copy_`` / ``copy_`` into the artifact's tensors. The rows it
  overwrites are saved first and written back if anything fails, so the artifact is never left
  half-updated; a failure raises :class:`~lightrec.distributed.deltas.errors.DeltaApplyError`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NoReturn, Protocol

import torch

from lightrec.distributed.deltas import DeltaApplyError, DeltaState, TableRows, TableSpec
from lightrec.distributed.deltas.rows import payload_bytes, row_data_type
from lightrec.inference.predictor import Predictor

# managed collisions (being moved to lightrec.modules.managed_collision: update this import there)
from lightrec.modules.managed_collision.ops import EMPTY_ID
from lightrec.quant.row_codec import quantize_rows
from lightrec.serving.deltas.targets import ArtifactTargets, RemapperTarget, TableTarget, find_targets

__all__ = ["PendingUpdate", "UpdateListener", "artifact_rows"]

logger = logging.getLogger(__name__)


class UpdateListener(Protocol):
    """What follows an update's fate (:class:`~lightrec.serving.deltas.follower.DeltaFollower`)."""

    def check(self, update: PendingUpdate) -> None:
        """Raise ``DeltaApplyError`` when ``update`` no longer fits the served version (stale)."""

    def applied(self, update: PendingUpdate) -> None: ...

    def failed(self, update: PendingUpdate, error: DeltaApplyError) -> None: ...


@dataclass(frozen=True)
class _RowWrite:
    """``storage[ids] = rows`` (rows saved first)."""

    storage: torch.Tensor
    ids: torch.Tensor
    rows: torch.Tensor

    def save(self) -> torch.Tensor:
        return self.storage.index_select(0, self.ids)

    def write(self, rows: torch.Tensor | None = None) -> None:
        self.storage.index_copy_(0, self.ids, self.rows if rows is None else rows)


@dataclass(frozen=True)
class _Replace:
    """``target[:] = value`` (the whole tensor saved first)."""

    storage: torch.Tensor
    value: torch.Tensor

    def save(self) -> torch.Tensor:
        return self.storage.clone()

    def write(self, rows: torch.Tensor | None = None) -> None:
        self.storage.copy_(self.value if rows is None else rows)


def _pad(rows: torch.Tensor, width: int, table: str) -> torch.Tensor:
    if rows.shape[1] > width:
        raise DeltaApplyError(f"table {table!r}: {rows.shape[1]}-byte rows do not fit the artifact's {width}-byte rows")
    out = torch.zeros(rows.shape[0], width, dtype=torch.uint8)
    out[:, : rows.shape[1]] = rows
    return out


def artifact_rows(rows: TableRows, spec: TableSpec, target: TableTarget) -> torch.Tensor:
    """``rows.values`` as the artifact stores them (``[n, storage width]``, on the CPU).

    Rows in the artifact's format are copied (their padding adjusted); fp32 rows are converted
    (``quantize_rows``: the bytes ``quantize`` writes). Other pairs are refused.

    Raises:
        DeltaApplyError: different dims or row counts, or rows that cannot become the artifact's format.
    """
    if (spec.dim, spec.num_embeddings) != (target.dim, target.storage.shape[0]):
        raise DeltaApplyError(f"table {spec.name!r}: the version holds {spec.num_embeddings} x {spec.dim} rows, the "
                              f"artifact {target.storage.shape[0]} x {target.dim}")  # fmt: skip
    fmt, width, values = target.row_format, target.storage.shape[1], rows.values
    if spec.row_format == fmt == "fp32":
        return values
    if spec.row_format == fmt == "fp16":
        return _pad(values.contiguous().view(torch.uint8), width, spec.name)
    if spec.row_format == fmt:
        return _pad(values[:, : payload_bytes(spec.dim, fmt)], width, spec.name)
    if spec.row_format == "fp32" and fmt != "fp32":
        try:
            return _pad(quantize_rows(values, row_data_type(fmt), 1, spec.name), width, spec.name)
        except ValueError as exc:
            raise DeltaApplyError(str(exc)) from exc
    raise DeltaApplyError(f"table {spec.name!r}: {spec.row_format} rows cannot be served as {fmt}; publish it as "
                          f"{fmt} or fp32")  # fmt: skip


def _remapper_writes(remapper: RemapperTarget, rows: TableRows, table: str) -> list[_RowWrite | _Replace]:
    """The id map after rows ``rows.ids`` take ids ``rows.raw_ids`` (-1: empty)."""
    if rows.raw_ids is None:
        raise DeltaApplyError(f"table {table!r} is managed in the artifact but the version carries no raw ids")
    device = remapper.ids.device
    if remapper.kind == "hash":  # one id per row, -1 empty: as published
        return [_RowWrite(remapper.ids.view(-1, 1), rows.ids.to(device), rows.raw_ids.view(-1, 1).to(device))]
    assert remapper.rows is not None  # an "mch" target has both
    sorted_ids, sorted_rows = remapper.ids.cpu(), remapper.rows.cpu()
    first = int(sorted_rows.min())  # the table row of slot 0
    slot_ids = torch.empty_like(sorted_ids)
    slot_ids[sorted_rows - first] = sorted_ids
    slot_ids[rows.ids - first] = torch.where(rows.raw_ids < 0, torch.full_like(rows.raw_ids, EMPTY_ID), rows.raw_ids)
    new_ids, slots = torch.sort(slot_ids, stable=True)  # as FrozenMCHRemapper is built from the trained state
    return [_Replace(remapper.ids, new_ids.to(device)), _Replace(remapper.rows, (slots + first).to(device))]


class PendingUpdate:
    """Verified versions ready to apply (see the module docstring).

    Args:
        state: the merged versions (``DeltaReader.state`` or the follower's reads).
        from_version: the version the artifact must serve for this update to apply (None: any; a
            state starting from a snapshot fits every artifact of the same model).
        listener: told when it is applied or fails (a ``DeltaFollower``).
    """

    def __init__(self, state: DeltaState, from_version: int | None = None, listener: UpdateListener | None = None) -> None:
        self.state = state
        self.from_version = from_version
        self._listener = listener
        self._plans: dict[int, list[_RowWrite | _Replace]] = {}

    @property
    def version(self) -> int:
        """The version the artifact serves once this update is applied."""
        return self.state.version

    @property
    def versions(self) -> range:
        """The versions this update holds, oldest first."""
        return range(self.state.first, self.state.version + 1)

    def __repr__(self) -> str:
        rows = sum(r.ids.numel() for r in self.state.rows.values())
        return (f"PendingUpdate(version={self.version}, from={self.from_version}, first={self.state.first}, "
                f"rows={rows}, dense={len(self.state.dense)})")  # fmt: skip

    def prepare(self, predictor: Predictor) -> None:
        """Compute every write for ``predictor`` (idempotent; nothing in the artifact changes).

        Raises:
            DeltaApplyError: a table or dense weight does not fit the artifact (logged, and the
                listener told: its versions are refused).
        """
        if id(predictor.module) in self._plans:
            return
        try:
            self._plans[id(predictor.module)] = self._plan(find_targets(predictor))
        except Exception as exc:
            self._fail(exc)

    def _plan(self, targets: ArtifactTargets) -> list[_RowWrite | _Replace]:
        writes: list[_RowWrite | _Replace] = []
        for name, rows in self.state.rows.items():
            target = targets.tables.get(name)
            if target is None:
                raise DeltaApplyError(f"the version has table {name!r}, the artifact does not (its tables: "
                                      f"{sorted(targets.tables)}); serve the model the trainer publishes")  # fmt: skip
            spec = self.state.tables[name]
            if spec.managed != (target.remapper is not None):
                raise DeltaApplyError(f"table {name!r} is {'' if spec.managed else 'not '}managed in the version but "
                                      f"{'not ' if target.remapper is None else ''}in the artifact")  # fmt: skip
            device = target.storage.device
            values = artifact_rows(rows, spec, target).to(device, target.storage.dtype)
            writes.append(_RowWrite(target.storage, rows.ids.to(device), values))
            if target.remapper is not None:
                writes.extend(_remapper_writes(target.remapper, rows, name))
        if self.state.complete:
            missing = sorted(set(targets.tables) - set(self.state.rows))
            if missing:
                logger.warning("version %d has no rows for the artifact's tables %s; they keep their rows",
                               self.version, missing)  # fmt: skip
        found = {k: v for k, v in self.state.dense.items() if k in targets.dense}
        if self.state.dense and not found:
            raise DeltaApplyError(f"none of the version's {len(self.state.dense)} dense weights (e.g. "
                                  f"{sorted(self.state.dense)[:3]}) is in the artifact (e.g. {sorted(targets.dense)[:3]})")
        if len(found) < len(self.state.dense):  # e.g. a weight the traced artifact dropped as unused
            logger.warning("dense weights %s are not in the artifact; skipped", sorted(set(self.state.dense) - set(found)))
        for key, value in found.items():
            storage = targets.dense[key]
            if storage.shape != value.shape:
                raise DeltaApplyError(f"dense weight {key!r}: the version holds {list(value.shape)}, the artifact "
                                      f"{list(storage.shape)}")  # fmt: skip
            writes.append(_Replace(storage, value.to(storage.device, storage.dtype)))
        return writes

    def apply(self, predictor: Predictor) -> int:
        """Write the update into ``predictor``'s artifact (prepared first if needed); all or nothing.

        Returns:
            The version the artifact now serves.

        Raises:
            DeltaApplyError: the update does not fit the artifact or the served version (stale), or a
                write failed; the artifact is unchanged.
        """
        if self._listener is not None:
            self._listener.check(self)
        self.prepare(predictor)
        saved: list[tuple[_RowWrite | _Replace, torch.Tensor]] = []
        try:
            with torch.no_grad():
                for write in self._plans[id(predictor.module)]:
                    saved.append((write, write.save()))
                    write.write()
        except Exception as exc:
            with torch.no_grad():
                for write, rows in reversed(saved):
                    write.write(rows)
            self._fail(exc)
        if self._listener is not None:
            self._listener.applied(self)
        return self.version

    def _fail(self, exc: Exception) -> NoReturn:
        """Log, tell the listener, raise ``DeltaApplyError`` (``exc`` itself when it is one)."""
        error = exc if isinstance(exc, DeltaApplyError) else DeltaApplyError(
            f"applying version {self.version} failed ({type(exc).__name__}: {exc}); the artifact is unchanged")
        logger.error("version %d not applied: %s", self.version, error)
        if self._listener is not None:
            self._listener.failed(self, error)
        if error is exc:
            raise error
        raise error from exc
