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
                            in the metadata's table order; ``lightrec.quant.table_groups``): where
                            the metadata records it (``tables[i]["storage"]``: buffer, offset, rows,
                            row bytes; ``lightrec.inference.export.table_storage``), there; for an
                            artifact exported before lightrec recorded it, inferred -- an exported
                            program keeps stale copies under ``embedding_bags.t.weight``, which tell
                            which tables a flat buffer holds; TorchScript keeps none, so the tables
                            are cut, in order, into runs that fill each buffer
MCH id map of ``t``         ``..._remappers.t.sorted_ids`` / ``sorted_rows`` ``[rows]``
hash id map of ``t``        ``..._remappers.t.identities`` ``[rows]``
dense weight ``name``       ``model.name``
==========================  ======================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lightrec.distributed.deltas import DeltaApplyError
from lightrec.distributed.deltas.rows import row_data_type
from lightrec.inference.export import TableMeta
from lightrec.inference.predictor import Predictor
from lightrec.quant.row_codec import DEFAULT_ROW_ALIGNMENT, row_size_in_bytes

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


def _named_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    named: dict[str, torch.Tensor] = dict(module.named_parameters())
    named.update(dict(module.named_buffers()))
    return named


def _row_bytes(meta: TableMeta, alignment: int) -> int:
    fmt = _ROW_FORMATS[meta["data_type"]]
    return row_size_in_bytes(int(meta["embedding_dim"]), row_data_type(fmt), alignment)


def _layouts(flat: torch.Tensor, tables: list[TableMeta]) -> dict[tuple[int, ...], bool]:
    """``{row bytes of each table: under the default alignment}`` for the alignments under which
    ``tables`` fill ``flat`` exactly."""
    found: dict[tuple[int, ...], bool] = {}
    for alignment in _ALIGNMENTS:
        widths = tuple(_row_bytes(t, alignment) for t in tables)
        if sum(int(t["num_embeddings"]) * w for t, w in zip(tables, widths)) == flat.numel():
            found[widths] = found.get(widths, False) or alignment == DEFAULT_ROW_ALIGNMENT
    return found


_Split = tuple[tuple[int, tuple[int, ...]], ...]  # per flat buffer: (tables it takes, their row bytes)


def _splits(flats: list[torch.Tensor], pending: list[TableMeta]) -> list[tuple[_Split, bool]]:
    """Every way to cut ``pending`` (in order) into one run of tables per flat buffer (in order) that
    fills it, each with whether it uses the default alignment throughout."""
    out: list[tuple[_Split, bool]] = []

    def search(i: int, start: int, acc: _Split, default: bool) -> None:
        if i == len(flats):
            if start == len(pending):
                out.append((acc, default))
            return
        for end in range(start + 1, len(pending) - (len(flats) - i - 1) + 1):
            for widths, is_default in _layouts(flats[i], pending[start:end]).items():
                search(i + 1, end, (*acc, (end - start, widths)), default and is_default)

    search(0, 0, (), True)
    return out


def _flat_tables(flats: dict[str, torch.Tensor], named: dict[str, torch.Tensor],
                 pending: list[TableMeta]) -> dict[str, torch.Tensor]:  # fmt: skip
    """``{table: [rows, row_bytes] view of its flat buffer}`` for the quantized pooled tables ``pending``.

    An exported program's (unused) per-table copies name each buffer's tables; TorchScript keeps
    none, so the tables are cut into runs, in order, one per buffer, that fill each exactly (the
    default row alignment preferred); more than one such cut is refused as ambiguous.
    """
    runs: list[tuple[torch.Tensor, list[TableMeta], tuple[int, ...]]] = []
    unnamed: list[torch.Tensor] = []
    for prefix, flat in flats.items():
        mine = [t for t in pending if f"{prefix}embedding_bags.{t['name']}.weight" in named]
        if not mine:
            unnamed.append(flat)
            continue
        layouts = _layouts(flat, mine)
        if len(layouts) != 1:
            raise DeltaApplyError(f"{prefix}{_FLAT} ({flat.numel()} bytes) does not hold tables "
                                  f"{[t['name'] for t in mine]} under one row alignment")  # fmt: skip
        runs.append((flat, mine, next(iter(layouts))))
    rest = [t for t in pending if not any(t in mine for _, mine, _ in runs)]
    if unnamed or rest:
        splits = _splits(unnamed, rest)
        preferred = [s for s, default in splits if default] or [s for s, _ in splits]
        if len(preferred) != 1:
            why = "no" if not preferred else f"{len(preferred)}"
            raise DeltaApplyError(f"{why} way(s) to lay the tables {[t['name'] for t in rest]} out in the artifact's "
                                  f"{len(unnamed)} flat buffer(s) of {[f.numel() for f in unnamed]} bytes; "
                                  "its layout cannot be told")  # fmt: skip
        start = 0
        for flat, (count, widths) in zip(unnamed, preferred[0]):
            runs.append((flat, rest[start : start + count], widths))
            start += count
    out: dict[str, torch.Tensor] = {}
    for flat, tables, widths in runs:
        offset = 0
        for t, width in zip(tables, widths):
            size = int(t["num_embeddings"]) * width
            out[t["name"]] = flat[offset : offset + size].view(int(t["num_embeddings"]), width)
            offset += size
    return out


def _recorded_tables(named: dict[str, torch.Tensor], pending: list[TableMeta]) -> dict[str, torch.Tensor]:
    """``{table: [rows, row_bytes] view}`` of the tables of ``pending`` whose metadata records their place.

    Raises:
        DeltaApplyError: a record names a buffer the artifact lacks, or a place outside it.
    """
    out: dict[str, torch.Tensor] = {}
    for t in pending:
        record = t.get("storage")
        if record is None:
            continue
        name, flat = record["buffer"], named.get(record["buffer"])
        offset, rows, width = int(record["offset"]), int(record["rows"]), int(record["row_bytes"])
        if flat is None or flat.dtype != torch.uint8 or flat.dim() != 1:
            raise DeltaApplyError(f"table {t['name']!r}: the metadata places it in {name!r}, which the artifact does not "
                                  "hold as a flat uint8 buffer; the metadata is not this artifact's -- re-export it")
        if rows != int(t["num_embeddings"]) or width < _row_bytes(t, 1) or offset < 0 or offset + rows * width > flat.numel():
            raise DeltaApplyError(f"table {t['name']!r}: the metadata places {rows} rows of {width} bytes at byte {offset} "
                                  f"of {name!r} ({flat.numel()} bytes, the table has {t['num_embeddings']} rows); the "
                                  "metadata is not this artifact's -- re-export it")  # fmt: skip
        out[t["name"]] = flat[offset : offset + rows * width].view(rows, width)
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
    pending: list[TableMeta] = []
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
    recorded = _recorded_tables(named, pending)
    storages.update(recorded)
    rest = [t for t in pending if t["name"] not in recorded]
    if rest:  # an artifact exported before lightrec recorded the layout: infer it from the buffers
        taken = {t["storage"]["buffer"] for t in pending if t["name"] in recorded}
        storages.update(_flat_tables({p: f for p, f in flats.items() if f"{p}{_FLAT}" not in taken}, named, rest))
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
