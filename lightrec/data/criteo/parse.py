"""Parsing raw Criteo TSV lines: a vectorised parser for well-formed blocks and a line parser.

A line is ``label \\t I1..I13 \\t C1..C26`` -- 40 tab-separated fields, integer counts and 32-bit
hex categoricals, any of which may be empty. Both parsers return ``labels [n] f32``, raw
``dense [n, 13] f32`` (empty -> 0) and raw ``cats [n, 26] i64`` (empty -> -1).

:func:`parse_fast` (~10x the line parser) works on the bytes of a block of lines in place with
numpy (no Python object per field): separator positions give every field's start and length,
fields are gathered into fixed-width character matrices, and integers / hex values are accumulated
digit by digit. A block is accepted only when every line has exactly 40 fields, every label is
0/1, every dense value is a (signed) decimal integer of at most 15 characters (below 1e15, exact in
float64) and every categorical is hex of at most 15 digits; otherwise it returns ``None`` and
:func:`parse_criteo_lines` re-parses the block line by line
(:func:`parse_criteo_lines_one_by_one`), which names the offending line (or skips it) and also
accepts decimal fractions. Both parsers give identical results on well-formed lines.

Dense values are integers (decimal fractions are accepted by the line parser) with
``|value| < 1e15``; a larger one is a malformed line, never silently wrapped or rounded
differently by the two parsers.

Values are read as written, not as Python's ``int`` / ``float`` would: a categorical is hex digits
only (no ``0x`` prefix, no ``_``, no spaces) and a dense value is an optionally signed decimal
number (no spaces or ``_``); anything else is a malformed line in both parsers. A file that starts
with a UTF-8 byte order mark, or whose first line is a header (Criteo files have none), is named as
such, with the fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from lightrec.data.criteo.spec import (
    CAT_FEATURE_COUNT,
    DEFAULT_CAT_NAMES,
    DEFAULT_INT_NAMES,
    INT_FEATURE_COUNT,
)
from lightrec.data.errors import LineErrors

__all__ = ["MAX_DENSE_VALUE", "NUM_FIELDS", "parse_criteo_lines", "parse_criteo_lines_one_by_one", "parse_fast"]

NUM_DENSE, NUM_CAT = INT_FEATURE_COUNT, CAT_FEATURE_COUNT
NUM_FIELDS = 1 + NUM_DENSE + NUM_CAT
#: Dense values at or above this magnitude are malformed (see the module docstring).
MAX_DENSE_VALUE = 1e15
#: Dense values of up to 15 characters are below 1e15 < 2**53: exact in int64 and float64, so the
#: vectorised parser and the line parser round them to the same float32.
MAX_DENSE_DIGITS = 15
#: What the line parser accepts (Python's int()/float() would also take spaces, ``_`` and ``0x``).
_DENSE_RE = re.compile(rb"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NONFINITE_RE = re.compile(rb"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)  # refused as not finite
_HEX_RE = re.compile(rb"[0-9a-fA-F]+")
#: A UTF-8 byte order mark, which some editors and Excel put at the start of a file they save.
_BOM = b"\xef\xbb\xbf"
_WORD_RE = re.compile(rb"[A-Za-z_][A-Za-z0-9_ .-]*")
_BLOCK = 16384  # lines per vectorised step: bounds the temporary index arrays to ~20 MB
_FOLD = (1 << 63) - 1

# ASCII byte -> digit value; 255 marks a byte that is not a digit of the base.
_HEX = np.full(256, 255, dtype=np.uint8)
_DEC = np.full(256, 255, dtype=np.uint8)
for _c in range(10):
    _HEX[ord("0") + _c] = _c
    _DEC[ord("0") + _c] = _c
for _c in range(6):
    _HEX[ord("a") + _c] = 10 + _c
    _HEX[ord("A") + _c] = 10 + _c


def _gather(
    buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """Characters ``[m, width]`` of ``m`` fields (0 past each field's end) and the in-field mask."""
    cols = np.arange(width, dtype=np.int64)
    mask = cols[None, :] < lengths[:, None]
    idx = np.minimum(starts[:, None] + cols[None, :], buf.shape[0] - 1)
    return np.where(mask, buf[idx], 0), mask


def _accumulate(digits: np.ndarray, mask: np.ndarray, base: int) -> np.ndarray:
    value = np.zeros(digits.shape[0], dtype=np.int64)
    for k in range(digits.shape[1]):
        value = np.where(mask[:, k], value * base + digits[:, k], value)
    return value


def _parse_block(lines: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    n = len(lines)
    buf = np.frombuffer(b"".join(lines), dtype=np.uint8)
    sep = np.flatnonzero((buf == 9) | (buf == 10))
    if sep.shape[0] != NUM_FIELDS * n:
        return None
    kinds = buf[sep].reshape(n, NUM_FIELDS)
    if not (bool((kinds[:, :-1] == 9).all()) and bool((kinds[:, -1] == 10).all())):
        return None  # some line has the wrong number of fields (or a stray newline / CR)
    starts = np.empty_like(sep)
    starts[0] = 0
    starts[1:] = sep[:-1] + 1
    lengths = (sep - starts).reshape(n, NUM_FIELDS)
    starts2d = starts.reshape(n, NUM_FIELDS)

    label_len, label_chr = lengths[:, 0], buf[starts2d[:, 0]]
    if not (bool((label_len == 1).all()) and bool(((label_chr == 48) | (label_chr == 49)).all())):
        return None

    d_len = lengths[:, 1 : 1 + NUM_DENSE].reshape(-1)
    if d_len.max(initial=0) > MAX_DENSE_DIGITS:  # longer values: the line parser accepts or refuses them
        return None
    chars, mask = _gather(
        buf, starts2d[:, 1 : 1 + NUM_DENSE].reshape(-1), d_len, max(int(d_len.max(initial=0)), 1)
    )
    negative = chars[:, 0] == 45  # leading '-'
    mask[:, 0] &= ~negative
    digits = _DEC[chars]
    if bool((digits[mask] == 255).any()) or bool((negative & (d_len == 1)).any()):
        return None
    dense = _accumulate(digits.astype(np.int64), mask, 10)
    dense = np.where(negative, -dense, dense).reshape(n, NUM_DENSE)

    c_len = lengths[:, 1 + NUM_DENSE :].reshape(-1)
    width = int(c_len.max(initial=0))
    if width > 15:  # 16 hex digits may overflow int64: leave it to the line parser
        return None
    chars, mask = _gather(buf, starts2d[:, 1 + NUM_DENSE :].reshape(-1), c_len, max(width, 1))
    nib = _HEX[chars]
    if bool((nib[mask] == 255).any()):
        return None
    cats = _accumulate(nib.astype(np.int64), mask, 16)
    cats[c_len == 0] = -1
    return (label_chr == 49).astype(np.float32), dense.astype(np.float32), cats.reshape(n, NUM_CAT)


def parse_fast(lines: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(labels [n] f32, dense [n, 13] f32, cats [n, 26] i64)``, or ``None`` if any line is malformed."""
    if len(lines) == 0:
        return None
    parts = []
    for lo in range(0, len(lines), _BLOCK):
        out = _parse_block(lines[lo : lo + _BLOCK])
        if out is None:
            return None
        parts.append(out)
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))  # type: ignore[return-value]


def parse_criteo_lines(
    lines: Sequence[bytes], path: str, first_line: int, errors: LineErrors
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parse raw Criteo lines.

    Args:
        lines: raw lines (bytes, with their newline; a last line without one may be truncated).
        path: file name for error messages.
        first_line: 1-based line number of ``lines[0]``.
        errors: raise-or-skip policy; skipped lines are left out of the result.

    Returns:
        ``labels`` [n] float32, ``dense`` [n, 13] float32 (raw counts, empty -> 0),
        ``cats`` [n, 26] int64 (raw values, wider than 63 bits folded, empty -> -1).
    """
    fast = parse_fast(lines)
    if fast is not None:
        return fast
    return parse_criteo_lines_one_by_one(lines, path, first_line, errors)


def parse_criteo_lines_one_by_one(
    lines: Sequence[bytes], path: str, first_line: int, errors: LineErrors
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The line parser behind :func:`parse_criteo_lines` (same arguments and result): names each
    bad line, accepts decimal fractions; on well-formed lines it equals the vectorised parser."""
    labels: list[float] = []
    dense: list[list[float]] = []
    cats: list[list[int]] = []
    for i, raw in enumerate(lines):
        lineno = first_line + i
        fields = raw.rstrip(b"\r\n").split(b"\t")
        whole_file = _whole_file_problem(fields, lineno)
        if whole_file is not None:
            errors.bad_line(path, lineno, whole_file)
            continue
        if len(fields) != NUM_FIELDS:
            truncated = not raw.endswith(b"\n")
            what = "truncated line (no newline at end of file)" if truncated else "wrong column count"
            errors.bad_line(
                path, lineno, f"{what}: expected {NUM_FIELDS} tab-separated fields, got {len(fields)}"
            )
            continue
        if fields[0] not in (b"0", b"1"):
            errors.bad_line(path, lineno, f"label must be 0 or 1, got {fields[0][:20]!r}")
            continue
        dense_fields = fields[1 : 1 + INT_FEATURE_COUNT]
        bad_dense = next((j for j, s in enumerate(dense_fields) if s and not _is_dense(s)), None)
        if bad_dense is not None:
            errors.bad_line(
                path, lineno, f"non-numeric dense value {dense_fields[bad_dense][:20]!r} in "
                f"{DEFAULT_INT_NAMES[bad_dense]} (dense values are decimal numbers such as 12 or -1, without "
                "spaces, '_' or a 0x prefix, or empty when missing)",
            )
            continue
        row_dense = [float(s) if s else 0.0 for s in dense_fields]
        if not all(math.isfinite(v) for v in row_dense):
            errors.bad_line(path, lineno, "dense value is not finite (nan/inf)")
            continue
        if any(abs(v) >= MAX_DENSE_VALUE for v in row_dense):
            bad = next(j for j, v in enumerate(row_dense) if abs(v) >= MAX_DENSE_VALUE)
            errors.bad_line(
                path, lineno, f"dense value {fields[1 + bad][:24]!r} in {DEFAULT_INT_NAMES[bad]} is out of range "
                f"(|value| must be below {MAX_DENSE_VALUE:.0e}; Criteo dense features are counts)",
            )
            continue
        if any(len(s) > 16 for s in fields[1 + INT_FEATURE_COUNT :]):
            errors.bad_line(path, lineno, "categorical value longer than 16 hex digits (64 bits)")
            continue
        tail = fields[1 + INT_FEATURE_COUNT :]
        bad_cat = next((j for j, s in enumerate(tail) if s and not _HEX_RE.fullmatch(s)), None)
        if bad_cat is not None:
            errors.bad_line(
                path, lineno, f"categorical value {tail[bad_cat][:20]!r} in {DEFAULT_CAT_NAMES[bad_cat]} is not hex "
                "(categoricals are unsigned hex digits such as 68fd1e64, without spaces, '_' or a 0x prefix, or "
                "empty when missing)",
            )
            continue
        # Criteo values are 32-bit; wider ones are folded to 63 bits (they are hashed anyway).
        row_cats = [int(s, 16) & _FOLD if s else -1 for s in tail]
        labels.append(float(fields[0]))
        dense.append(row_dense)
        cats.append(row_cats)
    n = len(labels)
    return (
        np.asarray(labels, dtype=np.float32).reshape(n),
        np.asarray(dense, dtype=np.float32).reshape(n, INT_FEATURE_COUNT),
        np.asarray(cats, dtype=np.int64).reshape(n, CAT_FEATURE_COUNT),
    )


def _is_dense(s: bytes) -> bool:
    """A dense value as the format writes it (``nan`` / ``inf`` pass here and are refused as not finite)."""
    return _DENSE_RE.fullmatch(s) is not None or _NONFINITE_RE.fullmatch(s) is not None


def _whole_file_problem(fields: list[bytes], lineno: int) -> str | None:
    """What is wrong with the file, when a line shows it: a UTF-8 byte order mark at its start, or a
    header as its first line (the first field a word). ``None`` for any other line."""
    # the first two fields: the label, or the first count of an unlabelled file (Kaggle's test.txt)
    if any(f.startswith(_BOM) for f in fields[:2]):
        return (
            "the line starts with a UTF-8 byte order mark (BOM, bytes EF BB BF), which an editor or Excel "
            "wrote: Criteo files are plain tab-separated text; save the file without a BOM (e.g. "
            "sed -i '1s/^\\xEF\\xBB\\xBF//' FILE; on_error='skip' would drop this line's row)"
        )
    if lineno == 1:
        word = next((f for f in fields[:2] if _WORD_RE.fullmatch(f) and _NONFINITE_RE.fullmatch(f) is None), None)
        if word is not None:
            return (
                f"the first line looks like a header row (first field {word[:20].decode(errors='replace')!r}), "
                "but Criteo files have no header: remove the line (e.g. tail -n +2 FILE > FILE.data)"
            )
    return None
