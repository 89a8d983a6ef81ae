"""The publish folder's names and ``manifest.json`` (format version 1): parse, check, write.

::

    DIR/
      LATEST                 "v000000042\\n": the newest complete version (a hint; listing the folder is the truth)
      v000000001/            one version per folder; visible only once renamed to its final name
        manifest.json        written last (every data file is synced first)
        rows.safetensors     table rows (absent when no row changed)
        dense.safetensors    dense weights (snapshots, and deltas on the dense cadence)
      .tmp-...               a version being written, or left by a crash (the next writer removes it)

``manifest.json``::

    {"format": "lightrec.deltas", "format_version": 1,
     "version": 2, "kind": "delta",             # or "snapshot": every row of every table + dense
     "base": 1,                                  # the snapshot this chain starts from (a snapshot: itself)
     "parent": 1,                                # the version it applies on top of (a snapshot: null)
     "global_step": 1200, "wall_time": 1764380000.12, "lightrec_version": "0.1.0",
     "tables": {"t_cat_0": {"rows": 17, "num_embeddings": 100000, "dim": 64,
                            "row_format": "fp32", "managed": false}},
     "dense": false,
     "files": {"rows.safetensors": {"bytes": 12345, "sha256": "..."}},
     "manifest_sha256": "..."}                  # the checksum of every field above but "files"

Only JSON and plain types: a reader needs neither lightrec nor unpickling.

``manifest_sha256`` is the SHA-256 of the other fields but ``files`` as canonical JSON (keys sorted,
``separators=(",", ":")``): without it a flipped bit or an edit in a field no tensor check can see
(``global_step``; ``row_format`` int8 -> int4 or a smaller ``dim`` of a quantized table, whose rows
still fit) would be read as a valid version that decodes to other values. ``files`` needs no cover:
each record is checked against its file's bytes. Manifests written before the field existed (same
format version) have none and are read as before.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from lightrec.distributed.checkpoint.integrity import FileRecord  # a file's size and SHA-256
from lightrec.distributed.deltas.errors import DeltaFormatError

__all__ = [
    "DENSE_FILE",
    "FORMAT",
    "FORMAT_VERSION",
    "KINDS",
    "LATEST_FILE",
    "MANIFEST_CHECKSUM",
    "MANIFEST_FILE",
    "ROWS_FILE",
    "ROW_FORMATS",
    "TMP_PREFIX",
    "FileRecord",
    "Manifest",
    "TableSpec",
    "parse_version_name",
    "version_name",
]

FORMAT = "lightrec.deltas"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
ROWS_FILE = "rows.safetensors"
DENSE_FILE = "dense.safetensors"
LATEST_FILE = "LATEST"
MANIFEST_CHECKSUM = "manifest_sha256"  # the manifest's own checksum (module docstring)
TMP_PREFIX = ".tmp-"
KINDS = ("snapshot", "delta")
# The serving artifact's row formats: fp32 / fp16 values, or int8 / int4 rows in lightrec's
# quantized layout (scale and bias fp16, then the codes; lightrec.quant.row_codec).
ROW_FORMATS = ("fp32", "fp16", "int8", "int4")

# fullmatch, ASCII digits: "$" also matches before a final newline and "\d" any Unicode digit, which
# ``int`` reads -- "v000000007\n" or "v" and eight Arabic-Indic zeros and a seven would be version 7
# a second time, a version whose folder (``v000000007``) is not there.
_VERSION_NAME = re.compile(r"v([0-9]{9})")
_MAX_VERSION = 999_999_999


def version_name(version: int) -> str:
    """The folder name of ``version``: ``v`` and nine digits (``v000000042``)."""
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= _MAX_VERSION:
        raise DeltaFormatError(f"version must be an int in [1, {_MAX_VERSION}], got {version!r}")
    return f"v{version:09d}"


def parse_version_name(name: str) -> int | None:
    """The version a folder name stands for, or None for any other name (``.tmp-*``, ``LATEST``...)."""
    match = _VERSION_NAME.fullmatch(name)
    return int(match.group(1)) if match and int(match.group(1)) >= 1 else None


@dataclass(frozen=True)
class TableSpec:
    """One table as the publish folder stores it.

    Args:
        name: the table's name (no ``/``: it separates the table from the tensor in file keys).
        num_embeddings: rows of the full table.
        dim: the embedding dimension.
        row_format: the serving artifact's rows: ``"fp32"``, ``"fp16"``, ``"int8"`` or ``"int4"``.
        managed: a managed-collision table; its rows carry the raw ids they hold.
    """

    name: str
    num_embeddings: int
    dim: int
    row_format: str = "fp32"
    managed: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise DeltaFormatError(f"table name must be a non-empty str without '/', got {self.name!r}")
        for field in ("num_embeddings", "dim"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DeltaFormatError(f"table {self.name!r}: {field} must be a positive int, got {value!r}")
        if self.row_format not in ROW_FORMATS:
            raise DeltaFormatError(
                f"table {self.name!r}: row_format must be one of {ROW_FORMATS}, got {self.row_format!r}"
            )
        if self.row_format == "int4" and self.dim % 2:
            raise DeltaFormatError(
                f"table {self.name!r}: int4 packs two values per byte and needs an even dim, got {self.dim}; "
                "use row_format='int8'"
            )
        if not isinstance(self.managed, bool):
            raise DeltaFormatError(f"table {self.name!r}: managed must be a bool, got {self.managed!r}")


@dataclass(frozen=True)
class Manifest:
    """The parsed ``manifest.json`` of one version (fields as in the module docstring).

    ``tables`` holds every table the writer knows; ``rows[t]`` how many of its rows this version
    stores (0: none changed). ``checksum`` is the ``manifest_sha256`` a parsed manifest carried
    (None: written before the field existed, or not parsed); :meth:`to_json` always writes a fresh one.
    """

    version: int
    kind: str
    base: int
    parent: int | None
    global_step: int
    wall_time: float
    lightrec_version: str
    tables: dict[str, TableSpec]
    rows: dict[str, int]
    dense: bool
    files: dict[str, FileRecord]
    checksum: str | None = None

    def _fields(self) -> dict[str, object]:
        """Every field the checksum covers (all but ``files``), as ``manifest.json`` spells them."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "version": self.version,
            "kind": self.kind,
            "base": self.base,
            "parent": self.parent,
            "global_step": self.global_step,
            "wall_time": self.wall_time,
            "lightrec_version": self.lightrec_version,
            "tables": {
                name: {"rows": self.rows[name], "num_embeddings": t.num_embeddings, "dim": t.dim,
                       "row_format": t.row_format, "managed": t.managed}
                for name, t in self.tables.items()
            },  # fmt: skip
            "dense": self.dense,
        }

    def fields_sha256(self) -> str:
        """The SHA-256 of the fields the checksum covers, as canonical JSON (module docstring)."""
        canonical = json.dumps(self._fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def to_json(self) -> str:
        body = self._fields()
        body["files"] = {name: {"bytes": r.bytes, "sha256": r.sha256} for name, r in sorted(self.files.items())}
        body[MANIFEST_CHECKSUM] = self.fields_sha256()
        return json.dumps(body, indent=1) + "\n"

    def check_checksum(self) -> None:
        """Raise ``DeltaFormatError`` when the parsed ``manifest_sha256`` is not the fields' (an edited or
        damaged manifest); a manifest without one (written before it existed) passes."""
        if self.checksum is not None and self.checksum != self.fields_sha256():
            raise DeltaFormatError(
                f"its fields do not match their checksum {MANIFEST_CHECKSUM} (the manifest was edited or damaged "
                "after it was written); publish the version again, or read another one"
            )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse and check a manifest.

        Raises:
            DeltaFormatError: not JSON, not this format, a newer format version, or a field of the
                wrong type or value (the message names it).
        """
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser goes
            raise DeltaFormatError(f"not valid JSON ({type(exc).__name__}: {exc})") from exc
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise DeltaFormatError(f"not a {FORMAT!r} manifest (format={_get(raw, 'format')!r})")
        if raw.get("format_version") != FORMAT_VERSION:
            raise DeltaFormatError(
                f"format_version {raw.get('format_version')!r} is not {FORMAT_VERSION}, the one this lightrec "
                "reads; upgrade lightrec to read newer publish folders"
            )
        try:
            tables: dict[str, TableSpec] = {}
            rows: dict[str, int] = {}
            for name, t in dict(raw["tables"]).items():
                tables[name] = TableSpec(name, t["num_embeddings"], t["dim"], t["row_format"], t["managed"])
                rows[name] = _int(t["rows"], f"tables.{name}.rows")
            manifest = cls(
                version=_int(raw["version"], "version"),
                kind=str(raw["kind"]),
                base=_int(raw["base"], "base"),
                parent=None if raw["parent"] is None else _int(raw["parent"], "parent"),
                global_step=_int(raw["global_step"], "global_step"),
                wall_time=float(raw["wall_time"]),
                lightrec_version=str(raw["lightrec_version"]),
                tables=tables,
                rows=rows,
                dense=bool(raw["dense"]),
                files={
                    str(n): FileRecord(_int(r["bytes"], f"files.{n}.bytes"), str(r["sha256"]))
                    for n, r in dict(raw["files"]).items()
                },
                checksum=_checksum(raw),
            )
        except DeltaFormatError:
            raise
        except Exception as exc:  # any value of valid JSON: a missing key, a wrong type, float(10**400), ...
            raise DeltaFormatError(f"a field is missing or malformed ({type(exc).__name__}: {exc})") from exc
        manifest.check()  # raises DeltaFormatError only: every field it compares was checked above
        # The checksum is not compared here: a reader names a manifest of another version first
        # (DeltaReader.manifest), then calls check_checksum().
        return manifest

    def check(self) -> None:
        """Raise ``DeltaFormatError`` when the fields contradict each other (kind, base, parent, files)."""
        if self.kind not in KINDS:
            raise DeltaFormatError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "snapshot" and (self.parent is not None or self.base != self.version):
            raise DeltaFormatError(
                f"snapshot {self.version} must have base == version and parent null, got base={self.base}, "
                f"parent={self.parent}"
            )
        if self.kind == "delta" and (self.parent != self.version - 1 or not 1 <= self.base < self.version):
            raise DeltaFormatError(
                f"delta {self.version} must have parent {self.version - 1} and a base before it, got "
                f"parent={self.parent}, base={self.base}"
            )
        for name, n in self.rows.items():
            if not 0 <= n <= self.tables[name].num_embeddings:
                raise DeltaFormatError(f"tables.{name}.rows={n} is outside [0, num_embeddings]")
            if self.kind == "snapshot" and n != self.tables[name].num_embeddings:
                raise DeltaFormatError(f"snapshot {self.version}: table {name!r} has {n} rows, not all of them")
        expected = ({ROWS_FILE} if any(self.rows.values()) else set()) | ({DENSE_FILE} if self.dense else set())
        if set(self.files) != expected:
            raise DeltaFormatError(f"files lists {sorted(self.files)}, expected {sorted(expected)}")


def _checksum(raw: dict[str, object]) -> str | None:
    """The ``manifest_sha256`` a manifest carries; None only when the key is absent (written before it
    existed). A key that is there must hold the checksum: ``null`` or a number is a damaged (or edited)
    manifest, not an old one, and would otherwise skip the check."""
    if MANIFEST_CHECKSUM not in raw:
        return None
    value = raw[MANIFEST_CHECKSUM]
    if not isinstance(value, str):
        raise DeltaFormatError(
            f"{MANIFEST_CHECKSUM} must be the SHA-256 of the manifest's fields (a hex str), got {value!r}; the "
            "manifest was damaged or edited after it was written: publish the version again, or read another one"
        )
    return value


def _int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DeltaFormatError(f"{field} must be an int, got {value!r}")
    return value


def _get(raw: object, key: str) -> object:
    return raw.get(key) if isinstance(raw, dict) else None
