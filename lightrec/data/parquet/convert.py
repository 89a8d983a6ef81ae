"""``lightrec data convert``: Criteo TSV (plain or ``.gz``) and CSV -> Parquet, streaming, resumable.

::

    lightrec data convert day_0.gz day_1.gz --out data/criteo_parquet          # Criteo TSV
    lightrec data convert events.csv --format csv --out data/events            # CSV with a header

Output, under ``out``::

    <input>-00000.parquet, <input>-00001.parquet, ...   rows_per_file lines of the input each,
                                                          row groups of row_group_size rows
    _convert.json                                         the settings and every finished file

Memory stays bounded whatever the input's size: the input is read in blocks of whole lines
(``block_bytes``), each parsed by pyarrow's CSV reader, and rows are held only until a row group is
full. Each output file is written under a hidden name (``.<name>.tmp``) and renamed when complete --
so a reader, or a folder followed by ``ParquetDataModule(follow=True)``, never sees half a file --
then recorded in ``_convert.json`` with the input offset after its last line. Running the same
command again after an interruption skips the finished files and starts at that offset (a ``.gz``
input is decompressed up to it again, not parsed). Different settings on an existing ``out`` are
refused. A progress bar (tqdm, when installed) counts input bytes.

Bad lines raise :class:`~lightrec.data.errors.DataFormatError` naming file and line, or with
``on_error="skip"`` are left out and counted (per file in ``_convert.json``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypedDict

import pyarrow as pa
import pyarrow.parquet as pq

from lightrec.data.errors import LineErrors, OnError, check_at_least, check_on_error
from lightrec.data.parquet.text_blocks import TextBlocks
from lightrec.data.parquet.text_tables import TextFormat

__all__ = ["MANIFEST", "ConvertManifest", "convert_to_parquet"]

logger = logging.getLogger(__name__)
MANIFEST = "_convert.json"
FORMAT_VERSION = "lightrec-convert-v1"


class _SettingsRequired(TypedDict):
    format_version: str
    inputs: list[str]
    format: str
    rows_per_file: int
    row_group_size: int
    compression: str
    delimiter: str
    on_error: OnError


class ConvertSettings(_SettingsRequired, total=False):
    """The manifest's ``settings``: what a resumed run must repeat (``csv_schema``: the CSV column types first seen)."""

    csv_schema: list[list[str]]


class _FileRequired(TypedDict):
    input: str
    file: str
    first_line: int
    lines: int


class ConvertedFile(_FileRequired, total=False):
    """One output file of the manifest: its input, 1-based first line, lines read, the input offset after them
    (``end``), rows written, lines skipped, and whether it is the input's last file."""

    end: int
    rows: int
    skipped_lines: int
    last: bool


class _ManifestRequired(TypedDict):
    settings: ConvertSettings
    files: list[ConvertedFile]


class ConvertManifest(_ManifestRequired, total=False):
    """``_convert.json``: the settings, the files written so far, and (once finished) the totals."""

    rows: int
    skipped_lines: int


class _Bar(Protocol):
    """What :class:`_Progress` uses of a tqdm bar."""

    def update(self, n: int) -> object: ...

    def close(self) -> None: ...


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".tsv", ".txt", ".csv"):
        name = name.removesuffix(suffix)
    return name


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)


class _Progress:
    """A tqdm bar over the inputs' bytes (one log line per file without tqdm)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar: _Bar | None = None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, unit="B", unit_scale=True, desc="convert")
            except ImportError:
                self.bar = None
        self.enabled, self.total = enabled, total
        self._at = 0
        self.base = 0

    def to(self, position: int) -> None:
        """The current input was read up to ``position`` bytes (of all inputs: ``base`` + it)."""
        at = self.base + position
        if self.bar is not None:
            self.bar.update(max(at - self._at, 0))
        self._at = max(at, self._at)

    def next_input(self, size: int) -> None:
        self.to(size)
        self.base += size
        if self.enabled and self.bar is None:
            logger.info("convert: %d of %d input bytes", self.base, self.total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _FileWriter:
    """One output file: row groups of exactly ``row_group_size`` rows, renamed into place when closed."""

    def __init__(self, path: Path, schema: pa.Schema, row_group_size: int, compression: str) -> None:
        self.path, self.row_group_size = path, row_group_size
        self.tmp = path.with_name(f".{path.name}.tmp")
        self._writer = pq.ParquetWriter(self.tmp, schema, compression=compression)
        self._pending: list[pa.Table] = []
        self._rows = 0
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._rows += table.num_rows
        self.rows += table.num_rows
        while self._rows >= self.row_group_size:
            whole = pa.concat_tables(self._pending)
            self._writer.write_table(whole.slice(0, self.row_group_size), row_group_size=self.row_group_size)
            rest = whole.slice(self.row_group_size)
            self._pending, self._rows = [rest], rest.num_rows

    def close(self) -> None:
        if self._rows:
            self._writer.write_table(pa.concat_tables(self._pending), row_group_size=self.row_group_size)
        self._writer.close()
        os.replace(self.tmp, self.path)


def _settings(
    inputs: Sequence[Path],
    *,
    format: str,
    rows_per_file: int,
    row_group_size: int,
    compression: str,
    delimiter: str,
    on_error: OnError,
) -> ConvertSettings:
    return {
        "format_version": FORMAT_VERSION, "inputs": [str(p) for p in inputs], "format": format,
        "rows_per_file": rows_per_file, "row_group_size": row_group_size, "compression": compression,
        "delimiter": delimiter, "on_error": on_error,
    }  # fmt: skip


def _load_manifest(out: Path, settings: ConvertSettings) -> ConvertManifest:
    path = out / MANIFEST
    if not path.exists():
        return {"settings": settings, "files": []}
    manifest: ConvertManifest = json.loads(path.read_text())
    old = manifest.get("settings", {})
    changed = sorted(k for k in set(old) | set(settings) if k != "csv_schema" and old.get(k) != settings.get(k))
    if changed:
        raise ValueError(
            f"{str(out)!r} holds a conversion with other settings ({changed}); use another --out, or delete it to "
            "start over"
        )
    if "csv_schema" in old:
        settings["csv_schema"] = old["csv_schema"]
    manifest["settings"] = settings
    return manifest


def convert_to_parquet(
    inputs: str | Path | Sequence[str | Path],
    out: str | Path,
    format: str = "criteo",
    rows_per_file: int = 4_000_000,
    row_group_size: int = 262_144,
    compression: str = "zstd",
    delimiter: str = ",",
    block_bytes: int = 32 << 20,
    on_error: OnError = "raise",
    progress: bool = True,
) -> ConvertManifest:
    """Convert text inputs to Parquet files under ``out`` (module docstring).

    Args:
        inputs: Criteo TSV (``train.txt``, ``day_0``, optionally ``.gz``) or CSV files, in order.
        out: the output folder; running the same call again resumes an interrupted conversion.
        format: ``"criteo"`` or ``"csv"`` (a header line; ``delimiter`` between fields).
        rows_per_file: input lines per output file (the resume granularity).
        row_group_size: rows per row group (the reader's unit of work: 64k-1M rows).
        compression: Parquet compression (``"zstd"``, ``"snappy"``, ``"lz4"``, ``"none"``).
        delimiter: CSV field separator.
        block_bytes: input bytes parsed at once (with one row group, what bounds the memory).
        on_error: ``"raise"`` at the first bad line, or ``"skip"`` bad lines (counted).
        progress: show a progress bar.

    Returns:
        The manifest: settings, and per output file its input, first line, lines, rows and skipped lines.
    """
    paths = [Path(inputs)] if isinstance(inputs, (str, Path)) else [Path(p) for p in inputs]
    if not paths:
        raise ValueError("convert needs at least one input file, got none")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"inputs {missing} do not exist or are not files")
    stems = [_stem(p) for p in paths]
    if len(set(stems)) != len(stems):
        raise ValueError(f"inputs must have distinct names (they name the output files), got {stems}")
    check_at_least(1, rows_per_file=rows_per_file, row_group_size=row_group_size, block_bytes=block_bytes)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = _settings(
        paths, format=format, rows_per_file=rows_per_file, row_group_size=row_group_size, compression=compression,
        delimiter=delimiter, on_error=check_on_error(on_error),
    )  # fmt: skip
    manifest = _load_manifest(out_dir, settings)
    bar = _Progress(sum(p.stat().st_size for p in paths), progress)
    try:
        for path, stem in zip(paths, stems):
            _convert_one(path, stem, out_dir, manifest, bar, block_bytes)
            bar.next_input(path.stat().st_size)
    finally:
        bar.close()
    manifest["rows"] = sum(f["rows"] for f in manifest["files"])
    manifest["skipped_lines"] = sum(f["skipped_lines"] for f in manifest["files"])
    _write_json(out_dir / MANIFEST, manifest)
    return manifest


def _convert_one(path: Path, stem: str, out: Path, manifest: ConvertManifest, bar: _Progress, block_bytes: int) -> None:
    settings = manifest["settings"]
    rows_per_file = settings["rows_per_file"]
    done = [f for f in manifest["files"] if f["input"] == str(path)]
    if done and done[-1].get("last"):
        return  # converted by an earlier run
    text_format, header_end = _format_for(path, settings)
    start = done[-1]["end"] if done else header_end
    first_line = done[-1]["first_line"] + done[-1]["lines"] if done else (2 if header_end else 1)
    blocks = TextBlocks(path, block_bytes, start, first_line)
    errors = LineErrors(settings["on_error"])
    k = len(done)
    try:
        block = blocks.next_block(rows_per_file)
        if block is None:
            if not done:
                raise ValueError(f"{path}: the file is empty: no lines to convert")
            _mark_last(manifest, out, path)
            return
        while block is not None:
            name = out / f"{stem}-{k:05d}.parquet"
            skipped_before = errors.skipped
            entry: ConvertedFile = {"input": str(path), "file": name.name, "first_line": block.first_line, "lines": 0}
            writer: _FileWriter | None = None
            while block is not None:
                table = text_format.parse(block.data, str(path), block.first_line, errors)
                if writer is None:
                    writer = _FileWriter(name, table.schema, settings["row_group_size"], settings["compression"])
                    _remember_schema(settings, table.schema)
                writer.write(table)
                entry["lines"] += block.lines
                entry["end"] = block.end
                bar.to(block.read)
                left = rows_per_file - entry["lines"]
                block = blocks.next_block(left if left > 0 else rows_per_file)
                if left <= 0:
                    break
            assert writer is not None
            writer.close()
            entry["rows"], entry["skipped_lines"] = writer.rows, errors.skipped - skipped_before
            entry["last"] = block is None
            manifest["files"].append(entry)
            _write_json(out / MANIFEST, manifest)
            k += 1
        errors.log_summary(str(path))
    finally:
        blocks.close()


def _mark_last(manifest: ConvertManifest, out: Path, path: Path) -> None:
    for entry in reversed(manifest["files"]):
        if entry["input"] == str(path):
            entry["last"] = True
            break
    _write_json(out / MANIFEST, manifest)


def _remember_schema(settings: ConvertSettings, schema: pa.Schema) -> None:
    """CSV: keep the column types the first block gave, so a resumed run parses with the same."""
    if settings["format"] == "csv" and "csv_schema" not in settings:
        settings["csv_schema"] = [[f.name, str(f.type)] for f in schema]


def _format_for(path: Path, settings: ConvertSettings) -> tuple[TextFormat, int]:
    """The input's :class:`TextFormat` and the offset after its header line (0: no header)."""
    if settings["format"] == "criteo":
        return TextFormat("criteo"), 0
    with TextBlocks(path, block_bytes=1 << 16) as blocks:
        header = blocks.next_block(1)
    if header is None:
        raise ValueError(f"{path}: the file is empty: no header line")
    names = header.data.decode().rstrip("\r\n").split(settings["delimiter"])
    known = settings.get("csv_schema")
    types = {n: pa.type_for_alias(t) for n, t in known} if known else None
    return TextFormat("csv", settings["delimiter"], names, types), header.end
