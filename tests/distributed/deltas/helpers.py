"""Tables and rows shared by the publish-folder tests: one table per row format, one managed."""

from __future__ import annotations

from pathlib import Path

import torch

from lightrec.distributed.deltas import DeltaWriter, TableRows, TableSpec

SPECS = [
    TableSpec("a", 50, 8, "fp32"),
    TableSpec("b", 30, 6, "fp16"),
    TableSpec("c", 20, 8, "int8", managed=True),
    TableSpec("d", 12, 4, "int4"),
]


def rows_of(spec: TableSpec, ids: torch.Tensor, seed: int) -> TableRows:
    """float32 rows for ``ids`` (distinct per seed); managed tables get raw ids (some -1: empty rows)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(ids.numel(), spec.dim, generator=g)
    raw = None
    if spec.managed:
        raw = torch.randint(0, 2**40, (ids.numel(),), generator=g)
        raw[::5] = -1
    return TableRows(ids, values, raw)


def full_rows(seed: int, specs: list[TableSpec] = SPECS) -> dict[str, TableRows]:
    return {s.name: rows_of(s, torch.arange(s.num_embeddings), seed + i) for i, s in enumerate(specs)}


def some_rows(seed: int, specs: list[TableSpec] = SPECS, skip: str | None = None) -> dict[str, TableRows]:
    """A random third of each table's rows (table ``skip`` untouched)."""
    g = torch.Generator().manual_seed(1000 + seed)
    out = {}
    for i, s in enumerate(specs):
        if s.name == skip:
            continue
        ids = torch.randperm(s.num_embeddings, generator=g)[: max(1, s.num_embeddings // 3)].sort().values
        out[s.name] = rows_of(s, ids, 100 * seed + i)
    return out


def dense(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"mlp.0.weight": torch.randn(4, 3, generator=g), "mlp.0.bias": torch.randn(4, generator=g)}


def snapshot_and_delta(folder: Path) -> Path:
    """``folder`` published with a snapshot (version 1, step 10) and a delta (version 2, step 20)."""
    writer = DeltaWriter(folder, SPECS)
    writer.write_snapshot(full_rows(0), dense(0), global_step=10)
    writer.write_delta(some_rows(1), global_step=20)
    return folder
