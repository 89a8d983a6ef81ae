"""``lightrec data convert|inspect``: event data into Parquet, and a look at what a Parquet source holds.

::

    lightrec data convert day_0.gz day_1.gz --out data/criteo       # Criteo TSV -> Parquet (resumable)
    lightrec data convert events.csv --format csv --out data/events
    lightrec data inspect data/criteo --label label                 # schema, rows, features, id ranges
    lightrec data inspect s3://logs/clicks/ --json

``convert`` streams with bounded memory and resumes an interrupted run when given the same
arguments again (``lightrec.data.parquet.convert``); ``inspect`` reads footers only
(``lightrec.data.parquet.inspection``).
"""

from __future__ import annotations

import argparse
import json

from lightrec.cli.common import CommandError, UsageError, command_parser, positive_int, reject_extra_arguments

__all__ = ["register", "run"]

_PARSERS: dict[str, argparse.ArgumentParser] = {}


def _columns(value: str) -> list[str]:
    return [c.strip() for c in value.split(",") if c.strip()]


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(sub, "data", "convert TSV/CSV to Parquet; inspect a Parquet source")
    commands = parser.add_subparsers(dest="data_command", metavar="{convert,inspect}")
    commands.required = True
    convert = command_parser(commands, "convert", "Criteo TSV (plain or .gz) or CSV -> Parquet, streaming and resumable")
    convert.add_argument("inputs", nargs="+", help="input files, in order (.gz is read as gzip)")
    convert.add_argument("--out", required=True, help="output folder (run again with the same arguments to resume)")
    convert.add_argument("--format", choices=["criteo", "csv"], default="criteo", help="input format (default criteo)")
    convert.add_argument("--delimiter", default=",", help="CSV field separator (default ,)")
    convert.add_argument("--rows-per-file", type=positive_int, default=4_000_000, help="input lines per output file")
    convert.add_argument("--row-group-size", type=positive_int, default=262_144, help="rows per row group")
    convert.add_argument("--compression", default="zstd", help="zstd (default), snappy, lz4, gzip or none")
    convert.add_argument("--block-mb", type=positive_int, default=32, help="input MiB parsed at once (bounds memory)")
    convert.add_argument("--on-error", choices=["raise", "skip"], default="raise", help="bad lines: stop or skip them")
    convert.add_argument("--no-progress", action="store_true", help="no progress bar")
    inspect = command_parser(commands, "inspect", "schema, rows, the detected features and their id ranges")
    inspect.add_argument("path", help="a Parquet file, folder, glob or URI")
    inspect.add_argument("--label", help="the label column (default: label, click, target, ... if present)")
    inspect.add_argument("--dense", type=_columns, help="dense columns, comma-separated (default: float columns)")
    inspect.add_argument("--sparse", type=_columns, help="sparse columns, comma-separated (default: integer columns)")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    _PARSERS.update(convert=convert, inspect=inspect)
    return parser


def run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    reject_extra_arguments(rest, _PARSERS.get(ns.data_command, parser))
    if ns.data_command == "convert":
        return _convert(ns)
    return _inspect(ns)


def _convert(ns: argparse.Namespace) -> int:
    from lightrec.data.errors import DataFormatError  # the data stack and pyarrow: only for this command
    from lightrec.data.parquet.convert import MANIFEST, convert_to_parquet

    try:
        manifest = convert_to_parquet(
            ns.inputs, ns.out, format=ns.format, rows_per_file=ns.rows_per_file, row_group_size=ns.row_group_size,
            compression=ns.compression, delimiter=ns.delimiter, block_bytes=ns.block_mb << 20,
            on_error=ns.on_error, progress=not ns.no_progress,
        )  # fmt: skip
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    except DataFormatError as exc:
        raise CommandError(str(exc)) from exc
    except ValueError as exc:  # other settings on an existing output, an empty input
        raise UsageError(str(exc)) from exc
    skipped = f", {manifest['skipped_lines']:,} bad line(s) skipped" if manifest["skipped_lines"] else ""
    print(
        f"converted {len(ns.inputs)} input(s) -> {len(manifest['files'])} Parquet file(s) in {ns.out} "
        f"({manifest['rows']:,} rows{skipped}; {MANIFEST} records the run)"
    )
    if ns.format == "criteo":
        print(
            "train on it: lightrec run dlrm --config dlrm_parquet --data.path " + str(ns.out)
            + "  (raw hex ids: id_mapping='hash', nulls='empty'; counts: dense_transform='log1p')"
        )
    return 0


def _inspect(ns: argparse.Namespace) -> int:
    from lightrec.data.parquet.errors import ParquetDataError  # pyarrow: only for this command
    from lightrec.data.parquet.inspection import format_report, inspect_parquet

    try:
        report = inspect_parquet(ns.path, label=ns.label, dense=ns.dense, sparse=ns.sparse or "auto")
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    except (ParquetDataError, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    print(json.dumps(report, indent=1, default=str) if ns.json else format_report(report))
    return 0
