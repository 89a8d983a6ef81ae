"""Vectorised parsing of well-formed Criteo lines (the common case), ~10x the line-by-line parser.

The bytes of a block of lines are parsed in place with numpy (no Python object per field):
separator positions give every field's start and length, fields are gathered into fixed-width
character matrices, and integers / hex values are accumulated digit by digit. A block is accepted
only when every line has exactly 40 fields, every label is 0/1, every dense value is a (signed)
decimal integer of at most 15 characters (below 1e15, exact in float64) and every categorical is hex of at most 16 digits; otherwise
:func:`parse_fast` returns ``None`` and the caller re-parses the block line by line, which names the
offending line (or skips it) and also accepts decimal fractions. Both parsers give identical results.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["parse_fast"]

NUM_DENSE, NUM_CAT = 13, 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_CAT
#: Dense values of up to 15 characters are below 1e15 < 2**53: exact in int64 and float64, so this
#: parser and the line parser round them to the same float32.
MAX_DENSE_DIGITS = 15
_BLOCK = 16384  # lines per vectorised step: bounds the temporary index arrays to ~20 MB

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
