"""Where a loaded serving artifact keeps what a version changes: table rows, id maps, dense weights.

A ``Predictor``'s module (a TorchScript module or an exported program's module) still names its
tensors after the model (``model.`` + the model's state-dict names), and its forward reads those
very tensors, so writing into them in place changes what it scores:

==========================  ======================================================================
what                        tensor the lookups read
==========================  ======================================================================
fp32 table ``t``            ``...embedding_bags.t.weight`` / ``...embeddings.t.weight`` ``[rows, dim]``
quantized sequence table    ``...embeddings.t.weight`` ``[rows, row_bytes]`` uint8
quantized pooled table      a part of its collection's ``..._flat_weights`` (every table back to back,
                            in the metadata's table order; ``lightrec.quant.table_groups``). An
                            exported program keeps stale copies under ``embedding_bags.t.weight``,
                            which only tell which tables a flat buffer holds; TorchScript keeps none,
                            so the tables are assigned by size, in order
MCH id map of ``t``         ``..._remappers.t.sorted_ids`` / ``sorted_rows`` ``[rows]``
hash id map of ``t``        ``..._remappers.t.identities`` ``[rows]``
dense weight ``name``       ``model.name``
==========================  ======================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lightrec.distributed.deltas import DeltaApplyError
from lightrec.distributed.deltas.rows import row_data_type
from lightrec.inference.predictor import Predictor
from lightrec.quant.row_codec import row_size_in_bytes

__all__ = ["ArtifactTargets", "RemapperTarget", "TableTarget", "find_targets"]

_ROW_FORMATS = {"FP32": "fp32", "FP16": "fp16", "INT8": "int8", "INT4": "int4"}
_FLAT = "_flat_weights"
_ALIGNMENTS = (16, 8, 4, 2, 1, 32, 64, 128)  # 16: what quantize() uses; the others a user may choose


@dataclass(frozen=True)
class RemapperTarget:
    """A frozen id map: ``kind`` ``"mch"`` (``ids`` = sorted ids, ``rows`` = their rows) or ``"hash"``
    (``ids`` = the id kept in each row, ``rows`` None)."""

    kind: str
    ids: torch.Tensor
    rows: torch.Tensor | None


@dataclass(frozen=True)
class TableTarget:
    """One table of the artifact: ``storage`` ``[num_embeddings, width]`` is what its lookups read
    (float32 rows, or uint8 rows in ``row_format``); ``remapper`` its id map (managed tables)."""

    name: str
    storage: torch.Tensor
    row_format: str
    dim: int
    remapper: RemapperTarget | None


@dataclass(frozen=True)
class ArtifactTargets:
    """Every table of the artifact, and its floating-point tensors by the trained model's names."""

    tables: dict[str, TableTarget]
    dense: dict[str, torch.Tensor]


def _named_tensors(module: Any) -> dict[str, torch.Tensor]:
    named = dict(module.named_parameters())
    named.update(dict(module.named_buffers()))
    return named


def _row_bytes(meta: dict[str, Any], alignment: int) -> int:
    fmt = _ROW_FORMATS[meta["data_type"]]
    return row_size_in_bytes(int(meta["embedding_dim"]), row_data_type(fmt), alignment)


def _layout(flat: torch.Tensor, tables: list[dict[str, Any]]) -> list[int] | None:
    """Row bytes of each of ``tables`` when they fill ``flat`` exactly under one row alignment."""
    layouts = set()
    for alignment in _ALIGNMENTS:
        widths = [_row_bytes(t, alignment) for t in tables]
        if sum(int(t["num_embeddings"]) * w for t, w in zip(tables, widths)) == flat.numel():
            layouts.add(tuple(widths))
    if len(layouts) > 1:
        raise DeltaApplyError(f"the tables {[t['name'] for t in tables]} fit their flat buffer under several row "
                              "alignments; the artifact's layout is ambiguous")  # fmt: skip
    return list(layouts.pop()) if layouts else None


def _flat_tables(flats: dict[str, torch.Tensor], named: dict[str, torch.Tensor],
                 pending: list[dict[str, Any]]) -> dict[str, torch.Tensor]:  # fmt: skip
    """``{table: [rows, row_bytes] view of its flat buffer}`` for the quantized pooled tables ``pending``."""
    out: dict[str, torch.Tensor] = {}
    for prefix, flat in flats.items():
        # exported programs keep (unused) per-table copies that name the buffer's tables; else take by size
        mine = [t for t in pending if f"{prefix}embedding_bags.{t['name']}.weight" in named]
        candidates = [mine] if mine else [pending[:k] for k in range(1, len(pending) + 1)]
        for tables in candidates:
            widths = _layout(flat, tables)
            if widths is None:
                continue
            offset = 0
            for t, width in zip(tables, widths):
                size = int(t["num_embeddings"]) * width
                out[t["name"]] = flat[offset : offset + size].view(int(t["num_embeddings"]), width)
                offset += size
            pending = [t for t in pending if t["name"] not in out]
            break
        else:
            raise DeltaApplyError(f"cannot tell which tables {prefix}{_FLAT} ({flat.numel()} bytes) holds among "
                                  f"{[t['name'] for t in pending]}")  # fmt: skip
    return out


def _remapper(named: dict[str, torch.Tensor], table: str, rows: int) -> RemapperTarget | None:
    found = {k.rsplit(".", 1)[1]: v for k, v in named.items() if k.rsplit(".", 1)[0].endswith(f"_remappers.{table}")}
    if "sorted_ids" in found and "sorted_rows" in found:
        target = RemapperTarget("mch", found["sorted_ids"], found["sorted_rows"])
    elif "identities" in found:
        target = RemapperTarget("hash", found["identities"], None)
    else:
        return None
    if target.ids.numel() != rows:
        raise DeltaApplyError(f"the id map of table {table!r} covers {target.ids.numel()} rows, the table {rows}; "
                              "a sharded inference artifact cannot take deltas")  # fmt: skip
    return target


def find_targets(predictor: Predictor) -> ArtifactTargets:
    """Locate every table of ``predictor.meta["tables"]`` (and the id maps, the dense weights) in its module.

    Raises:
        DeltaApplyError: a table is not found, or found twice (e.g. an artifact sharded over devices).
    """
    named = _named_tensors(predictor.module)
    flats = {k[: -len(_FLAT)]: v for k, v in named.items() if k.endswith(f".{_FLAT}")}
    storages: dict[str, torch.Tensor] = {}
    pending: list[dict[str, Any]] = []
    for meta in predictor.meta["tables"]:
        name = meta["name"]
        direct = [
            k for k, v in named.items()
            if k.endswith((f".embedding_bags.{name}.weight", f".embeddings.{name}.weight"))
            and not any(k.startswith(p) for p in flats) and v.dim() == 2
        ]  # fmt: skip
        if len(direct) > 1:
            raise DeltaApplyError(f"table {name!r} is found at {direct}; an artifact sharded over devices cannot take deltas")
        if direct:
            storages[name] = named[direct[0]]
        elif meta["data_type"] == "FP32":
            raise DeltaApplyError(f"table {name!r} (fp32) is not in the artifact's tensors")
        else:
            pending.append(meta)
    storages.update(_flat_tables(flats, named, pending))
    tables: dict[str, TableTarget] = {}
    for meta in predictor.meta["tables"]:
        name, rows, fmt = meta["name"], int(meta["num_embeddings"]), _ROW_FORMATS[meta["data_type"]]
        if name not in storages:
            raise DeltaApplyError(f"table {name!r} ({fmt}) is not in the artifact's tensors")
        storage = storages[name]
        if storage.shape[0] != rows or (fmt == "fp32") != (storage.dtype == torch.float32):
            raise DeltaApplyError(f"table {name!r}: the artifact holds {storage.dtype} {list(storage.shape)}, "
                                  f"its metadata says {rows} rows of {fmt}")  # fmt: skip
        tables[name] = TableTarget(name, storage, fmt, int(meta["embedding_dim"]), _remapper(named, name, rows))
    dense = {k.removeprefix("model."): v for k, v in named.items() if v.is_floating_point()}
    return ArtifactTargets(tables, dense)
