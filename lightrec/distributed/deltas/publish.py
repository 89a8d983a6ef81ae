"""Publish an unsharded model on one process: its tables, chosen rows and dense weights, as versions.

For tests, notebooks and single-process trainers (the sharded gather over ranks is the
``DeltaPublisher``'s)::

    from lightrec.distributed.deltas import DeltaWriter, publish_rows, publish_snapshot, table_specs

    writer = DeltaWriter("publish/", table_specs(model, row_format="int8"), retention=2)
    publish_snapshot(model, writer, global_step=0)                 # v1: every row + dense
    ...train...
    publish_rows(model, writer, {"t_cat_0": touched_ids}, global_step=100)   # v2: those rows now

The model may hold ``EmbeddingBagCollection`` / ``EmbeddingCollection`` (plain or fused) and their
managed-collision forms. Tables are read through their state-dict keys
(``<collection>.embedding_bags.<t>.weight``; managed: ``<collection>._embedding_module...``), the
managed-collision rows' ids from the id maps' state (``_mch_sorted_raw_ids`` / ``_hash_zch_identities``,
one id per row, as the id map keeps it: after its ``input_hash_func``, -1 for an empty row). Dense
weights are every floating-point state-dict entry outside the embedding collections, by the model's
own names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from lightrec.distributed.deltas.errors import DeltaFormatError
from lightrec.distributed.deltas.manifest import TableSpec
from lightrec.distributed.deltas.rows import TableRows
from lightrec.distributed.deltas.writer import DeltaWriter
from lightrec.kernels import FusedEmbeddingBagCollection, FusedEmbeddingCollection
from lightrec.modules.embedding_configs import BaseEmbeddingConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from lightrec.modules.managed_collision.embedding_collections import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from lightrec.modules.managed_collision.ops import EMPTY_ID

__all__ = ["dense_weights", "publish_rows", "publish_snapshot", "table_rows", "table_specs"]

_POOLED = (EmbeddingBagCollection, FusedEmbeddingBagCollection, ManagedCollisionEmbeddingBagCollection)
_SEQUENCE = (EmbeddingCollection, FusedEmbeddingCollection, ManagedCollisionEmbeddingCollection)
_MANAGED = (ManagedCollisionEmbeddingBagCollection, ManagedCollisionEmbeddingCollection)
# the id map's state: one id per row (slot order), and what marks an empty row
_IDENTITY_KEYS = {"_mch_sorted_raw_ids": EMPTY_ID, "_hash_zch_identities": -1}


@dataclass(frozen=True)
class _Table:
    config: BaseEmbeddingConfig
    weight_key: str  # the model's state-dict key of the float table
    identity_key: str | None  # managed: the key of the id map's per-row ids
    empty_id: int


def _collections(model: nn.Module) -> list[tuple[str, nn.Module]]:
    found: list[tuple[str, nn.Module]] = []
    for path, module in model.named_modules():
        if any(path.startswith(f"{p}.") or p == "" for p, _ in found):
            continue  # inside a collection already found (a managed one holds a plain one)
        if isinstance(module, _POOLED + _SEQUENCE):
            found.append((path, module))
    if not found:
        raise DeltaFormatError(
            f"{type(model).__name__} holds no unsharded EmbeddingBagCollection / EmbeddingCollection (or their "
            "managed-collision forms); publish a sharded model with the DMP publisher, which gathers its rows"
        )
    return found


def _tables(model: nn.Module, state: Mapping[str, torch.Tensor]) -> dict[str, _Table]:
    tables: dict[str, _Table] = {}
    for path, module in _collections(model):
        prefix = f"{path}." if path else ""
        pooled = isinstance(module, _POOLED)
        configs: list[BaseEmbeddingConfig] = list(
            module.embedding_bag_configs() if pooled else module.embedding_configs()  # type: ignore[operator]
        )
        inner = "_embedding_module." if isinstance(module, _MANAGED) else ""
        attr = "embedding_bags" if pooled else "embeddings"
        for config in configs:
            identity_key, empty = None, -1
            if inner:
                stem = f"{prefix}_managed_collision_collection._managed_collision_modules.{config.name}."
                identity_key = next((stem + k for k in _IDENTITY_KEYS if stem + k in state), None)
                if identity_key is None:
                    raise DeltaFormatError(f"managed table {config.name!r}: its id map keeps no per-row ids "
                                           f"({list(_IDENTITY_KEYS)}); it cannot be published")  # fmt: skip
                empty = _IDENTITY_KEYS[identity_key.rsplit(".", 1)[1]]
            weight_key = f"{prefix}{inner}{attr}.{config.name}.weight"
            if config.name in tables:  # the publish folder keys tables by name: one would hide the other
                raise DeltaFormatError(f"two collections hold a table named {config.name!r} "
                                       f"({tables[config.name].weight_key}, {weight_key}); the publish folder keys "
                                       "tables by name: rename one")  # fmt: skip
            tables[config.name] = _Table(config, weight_key, identity_key, empty)
    return tables


def table_specs(model: nn.Module, row_format: str | Mapping[str, str] = "fp32") -> list[TableSpec]:
    """The ``TableSpec`` of every table of ``model``.

    Args:
        row_format: the serving artifact's rows for every table, or ``{table: format}`` (tables not
            named: ``"fp32"``): ``"fp32"``, ``"fp16"``, ``"int8"`` or ``"int4"``.

    Raises:
        DeltaFormatError: no embedding collection, or ``row_format`` names an unknown table or format.
    """
    tables = _tables(model, model.state_dict())
    formats = {n: row_format for n in tables} if isinstance(row_format, str) else dict(row_format)
    unknown = sorted(set(formats) - set(tables))
    if unknown:
        raise DeltaFormatError(f"row_format names tables {unknown} the model does not have; its tables: {sorted(tables)}")
    return [
        TableSpec(n, t.config.num_embeddings, t.config.embedding_dim, formats.get(n, "fp32"), t.identity_key is not None)
        for n, t in tables.items()
    ]


def table_rows(model: nn.Module, table_ids: Mapping[str, torch.Tensor] | None = None) -> dict[str, TableRows]:
    """float32 rows of ``model``'s tables: the rows ``table_ids`` names (any order, repeats allowed),
    or every row of every table when None; managed tables with the ids their rows hold.

    Raises:
        DeltaFormatError: an unknown table, or ids outside a table.
    """
    state = model.state_dict()
    tables = _tables(model, state)
    wanted = {n: torch.arange(t.config.num_embeddings) for n, t in tables.items()} if table_ids is None else table_ids
    unknown = sorted(set(wanted) - set(tables))
    if unknown:
        raise DeltaFormatError(f"table_ids names tables {unknown} the model does not have; its tables: {sorted(tables)}")
    out: dict[str, TableRows] = {}
    for name, ids in wanted.items():
        t = tables[name]
        ids = torch.unique(torch.as_tensor(ids).detach().to("cpu", torch.int64).reshape(-1))
        rows = t.config.num_embeddings
        if ids.numel() and (int(ids[0]) < 0 or int(ids[-1]) >= rows):
            raise DeltaFormatError(f"table_ids[{name!r}] holds ids outside [0, {rows}): {int(ids[0])}..{int(ids[-1])}")
        weight = state[t.weight_key]
        values = weight.detach().index_select(0, ids.to(weight.device)).to("cpu", torch.float32)
        raw = None
        if t.identity_key is not None:
            identities = state[t.identity_key].detach().reshape(-1)
            if identities.numel() != rows:
                raise DeltaFormatError(f"managed table {name!r}: its id map covers {identities.numel()} rows, the table "
                                       f"{rows}; publish the unsharded model")  # fmt: skip
            raw = identities.index_select(0, ids.to(identities.device)).cpu()
            raw = torch.where(raw == t.empty_id, torch.full_like(raw, -1), raw)
        out[name] = TableRows(ids, values, raw)
    return out


def dense_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every floating-point state-dict entry of ``model`` outside its embedding collections (float32, CPU)."""
    prefixes = [f"{p}." if p else "" for p, _ in _collections(model)]  # "": the model is a collection
    return {
        k: v.detach().to("cpu", torch.float32)
        for k, v in model.state_dict().items()
        if v.is_floating_point() and not any(k.startswith(p) for p in prefixes)
    }


def _writer(model: nn.Module, target: DeltaWriter | str | os.PathLike[str], row_format: str | Mapping[str, str],
            retention: int | None) -> DeltaWriter:  # fmt: skip
    return target if isinstance(target, DeltaWriter) else DeltaWriter(target, table_specs(model, row_format), retention)


def publish_snapshot(
    model: nn.Module,
    target: DeltaWriter | str | os.PathLike[str],
    row_format: str | Mapping[str, str] = "fp32",
    global_step: int = 0,
    retention: int | None = 2,
) -> int:
    """Write every row of every table of ``model`` and its dense weights as a snapshot.

    Args:
        target: a ``DeltaWriter``, or a folder (a writer is made with ``table_specs(model, row_format)``
            and ``retention``, which are ignored when ``target`` is a writer).

    Returns:
        The new version.
    """
    writer = _writer(model, target, row_format, retention)
    return writer.write_snapshot(table_rows(model), dense_weights(model), global_step)


def publish_rows(
    model: nn.Module,
    target: DeltaWriter | str | os.PathLike[str],
    table_ids: Mapping[str, torch.Tensor],
    dense: bool = False,
    row_format: str | Mapping[str, str] = "fp32",
    global_step: int = 0,
    retention: int | None = 2,
) -> int:
    """Write the rows ``table_ids`` names (their current values) as a delta, and the dense weights when ``dense``.

    Returns:
        The new version.
    """
    writer = _writer(model, target, row_format, retention)
    return writer.write_delta(table_rows(model, table_ids), dense_weights(model) if dense else None, global_step)
