"""``lightrec data inspect PATH``: what a Parquet source holds and how ``ParquetDataModule`` would read it.

Prints the files, row groups and rows, the schema, the feature spec the DataModule would detect
(``label`` given or guessed from the common names, ``dense`` given or every floating-point column,
``sparse="auto"``), and every sparse feature's id range and null count with the table size it would
get. Everything comes from the files' footers (column statistics); a row group without statistics is
scanned, one column at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from lightrec.data.parquet.sizing import id_ranges
from lightrec.data.parquet.source import ParquetSource, SourceSummary
from lightrec.data.parquet.spec import build_spec

__all__ = ["LABEL_NAMES", "ParquetReport", "format_report", "inspect_parquet"]

#: Column names taken as the label when none is given, in this order.
LABEL_NAMES = ("label", "click", "clicked", "is_click", "target", "y")


class ColumnReport(TypedDict):
    """One schema field of :class:`ParquetReport`."""

    name: str
    type: str
    nullable: bool


class SparseReport(TypedDict):
    """One sparse feature of :class:`ParquetReport`: its id range, nulls and the table size it would get."""

    feature: str
    column: str
    type: str
    min: int | None
    max: int | None
    nulls: int | None
    num_embeddings: int | None


class _ReportRequired(SourceSummary):
    path: str | Sequence[str]
    schema: list[ColumnReport]
    label: str | None


class ParquetReport(_ReportRequired, total=False):
    """:func:`inspect_parquet`'s JSON-able report: ``note`` when no label was found, else ``dense`` and ``sparse``."""

    note: str
    dense: list[str]
    sparse: list[SparseReport]


def inspect_parquet(
    path: str | Sequence[str],
    label: str | None = None,
    dense: Sequence[str] | None = None,
    sparse: Sequence[str] | str = "auto",
    scan: bool = True,
) -> ParquetReport:
    """A description of the source at ``path`` (module docstring), as a JSON-able dict.

    Args:
        path: a file, folder, glob or URI (or a list).
        label: the label column (None: the first of :data:`LABEL_NAMES` the files have).
        dense: dense columns (None: every floating-point column but the label).
        sparse: sparse columns, or ``"auto"``.
        scan: read row groups without statistics to find id ranges (else they show as unknown).
    """
    source = ParquetSource(path if isinstance(path, str) else list(path))
    schema = source.schema
    names = schema.names
    if label is None:
        label = next((n for n in LABEL_NAMES if n in names), None)
    report: ParquetReport = {
        "path": path,
        **source.describe(),
        "schema": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema],
        "label": label,
    }
    if label is None:
        report["note"] = f"no label column found (looked for {list(LABEL_NAMES)}); pass --label to detect the features"
        return report
    spec = build_spec(
        schema, source.files[0].path, label, "auto" if dense is None else list(dense),
        "auto" if sparse == "auto" else list(sparse),
    )  # fmt: skip
    ranges = id_ranges(source, spec, scan=scan)
    report["dense"] = list(spec.dense)
    report["sparse"] = []
    for f in spec.sparse:
        low, high = ranges[f.name].min, ranges[f.name].max
        rows = high + 1 if high is not None and (low or 0) >= 0 else None  # what sizing from the data gives
        report["sparse"].append(
            {"feature": f.name, "column": f.column, "type": str(schema.field(f.column).type), "min": low, "max": high,
             "nulls": ranges[f.name].nulls, "num_embeddings": rows}
        )  # fmt: skip
    return report


def format_report(report: ParquetReport) -> str:
    """The report as text for a terminal."""
    size = report["bytes"] / 2**20
    lines = [
        f"{report['path']}: {report['files']} file(s), {report['row_groups']} row group(s), {report['rows']:,} rows, "
        f"{size:,.1f} MiB",
        "",
        "schema:",
    ]
    lines += [f"  {c['name']:<24} {c['type']}" for c in report["schema"]]
    lines += ["", f"label: {report['label']}"]
    if "note" in report:
        return "\n".join([*lines, report["note"]])
    lines.append(f"dense ({len(report['dense'])}): {', '.join(report['dense']) or '(none)'}")
    lines.append(f"sparse ({len(report['sparse'])}), id ranges from the column statistics:")
    lines.append(f"  {'feature':<20} {'type':<18} {'min':>14} {'max':>20} {'nulls':>10}  table rows (max + 1)")
    for f in report["sparse"]:
        rows = f["num_embeddings"] if f["num_embeddings"] is not None else "declare (negative ids)"
        nulls = "?" if f["nulls"] is None else f"{f['nulls']:,}"
        lines.append(f"  {f['feature']:<20} {f['type']:<18} {f['min']!s:>14} {f['max']!s:>20} {nulls:>10}  {rows}")
    lines.append("")
    lines.append("read it with: ParquetDataModule(path, label=..., dense=[...], sparse=[...]); raw ids: "
                 "id_mapping='hash', num_embeddings=N; nulls in ids: nulls='empty'")
    return "\n".join(lines)
