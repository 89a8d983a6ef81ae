"""Text inputs read in blocks of whole lines, with line numbers and resumable offsets (for ``convert``).

A block is at most ``block_bytes`` of the (decompressed) input, cut after a newline, and at most a
given number of lines -- the converter asks for exactly the lines its current output file still
needs. Each block knows the 1-based number of its first line and the offset, in the decompressed
stream, just after its last line: where a resumed conversion starts again (a ``.gz`` input is
decompressed from the start and the bytes before the offset dropped, in blocks: memory stays
bounded).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from lightrec.data.errors import DataFormatError

__all__ = ["TextBlock", "TextBlocks"]

_NEWLINE = 10


@dataclass
class TextBlock:
    """Whole lines of an input: ``data`` holds ``lines`` lines from line ``first_line`` on (1-based).

    ``end`` is the decompressed offset just after the block; ``read`` the input's (compressed) bytes
    consumed so far, for progress bars.
    """

    data: bytes
    first_line: int
    lines: int
    end: int
    read: int


class TextBlocks:
    """Blocks of whole lines of one input file (plain or ``.gz``), from a given offset on.

    Args:
        path: the input.
        block_bytes: the most bytes a block holds (a longer line is one block of its own).
        start: decompressed offset to start at (a resumed conversion); first_line: its line number.
    """

    def __init__(self, path: str | Path, block_bytes: int = 32 << 20, start: int = 0, first_line: int = 1) -> None:
        self.path = Path(path)
        self.block_bytes = block_bytes
        self._raw: IO[bytes] = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        self._stream: IO[bytes] = (
            gzip.GzipFile(fileobj=self._raw) if self.path.suffix == ".gz" else self._raw  # type: ignore[assignment]
        )
        self._pending = b""
        self._offset = start
        self._line = first_line
        self._eof = False
        self._skip(start)

    def _read(self, n: int) -> bytes:
        try:
            return self._stream.read(n)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise DataFormatError(
                str(self.path), 0, f"the gzip stream is truncated or corrupt after line {self._line - 1} ({exc}); "
                "the file is incomplete: download or copy it again"
            ) from exc  # fmt: skip

    def _skip(self, nbytes: int) -> None:
        if nbytes and self._stream is self._raw:
            self._raw.seek(nbytes)
            return
        left = nbytes
        while left:
            chunk = self._read(min(left, self.block_bytes))
            if not chunk:
                raise DataFormatError(str(self.path), 0, f"the input is shorter ({nbytes - left} bytes) than the offset {nbytes} a "
                                      "resumed conversion starts at: it changed since; delete the output and convert again")
            left -= len(chunk)

    @property
    def compressed_read(self) -> int:
        return self._raw.tell()

    def next_block(self, max_lines: int) -> TextBlock | None:
        """The next block of at most ``max_lines`` lines, or None at the end of the input."""
        while not self._eof:
            newlines = self._pending.count(b"\n")
            if newlines >= max_lines or (newlines and len(self._pending) >= self.block_bytes):
                break  # enough lines, or enough bytes of whole lines (a long line is read to its end)
            chunk = self._read(self.block_bytes)
            if not chunk:
                self._eof = True
                break
            self._pending += chunk
        if not self._pending:
            return None
        at = np.flatnonzero(np.frombuffer(self._pending, dtype=np.uint8) == _NEWLINE)
        if len(at) >= max_lines:
            cut = int(at[max_lines - 1]) + 1
        elif len(at) and not self._eof:
            cut = int(at[-1]) + 1
        else:
            cut = len(self._pending)  # the end: the last line may lack its newline
        data, self._pending = self._pending[:cut], self._pending[cut:]
        lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
        block = TextBlock(data, self._line, lines, self._offset + cut, self._raw.tell())
        self._offset += cut
        self._line += lines
        return block

    def blocks(self, max_lines: int) -> Iterator[TextBlock]:
        """Blocks of at most ``max_lines`` lines to the end."""
        while (block := self.next_block(max_lines)) is not None:
            yield block

    def close(self) -> None:
        self._stream.close()
        self._raw.close()

    def __enter__(self) -> TextBlocks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
