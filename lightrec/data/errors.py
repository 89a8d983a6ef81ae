"""Errors for malformed data files and the raise-or-skip policy every reader shares.

Readers parse text files line by line. A bad line (wrong column count, non-numeric value, truncated
last line) either stops the reader with a :class:`DataFormatError` that names the file, the 1-based
line number and what was wrong (``on_error="raise"``, the default), or is skipped and counted
(``on_error="skip"``), the count being reported by the reader and logged once at the end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DataFormatError",
    "DatasetNotFoundError",
    "LineErrors",
    "OnError",
    "ResumeMismatchError",
    "check_at_least",
    "check_on_error",
]

logger = logging.getLogger(__name__)

OnError = Literal["raise", "skip"]


class DataFormatError(ValueError):
    """A line of a data file does not have the expected format.

    Attributes:
        path: the file.
        line: 1-based line number; 0 when the problem is the whole file (empty, truncated, corrupt).
        reason: what was wrong, in words.
    """

    def __init__(self, path: str, line: int = 0, reason: str | None = None) -> None:
        if reason is None:  # one message (how torch's DataLoader re-raises a worker's error: type(e)(text))
            self.path, self.line, self.reason = "", 0, str(path)
            super().__init__(str(path))
            return
        self.path = str(path)
        self.line = line
        self.reason = reason
        if line <= 0:  # about the whole file, not one line
            super().__init__(f"{self.path}: {reason}")
            return
        super().__init__(
            f"{self.path}:{line}: {reason}. Fix or remove the line, or pass on_error='skip' to skip "
            "malformed lines (they are counted and reported)"
        )

    def __reduce__(self) -> tuple:
        # Pickled with the constructor's arguments: the default (the message alone) made unpickling
        # fail with "__init__() missing 2 required positional arguments" (worker processes, queues).
        if not self.path:
            return (type(self), (self.reason,))
        return (type(self), (self.path, self.line, self.reason))


class ResumeMismatchError(ValueError):
    """A checkpointed loader position does not fit the loader it is loaded into (other ranks, batch size or data)."""


def check_at_least(minimum: float, **values: float) -> None:
    """Refuse (``ValueError`` naming the argument and its value) any keyword value below ``minimum``,
    the bound every reader, loader and generator checks its sizes and counts against."""
    for name, value in values.items():
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


def check_on_error(on_error: str) -> OnError:
    """Validate the ``on_error`` argument of a reader."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    return on_error  # type: ignore[return-value]


@dataclass
class LineErrors:
    """Applies the ``on_error`` policy and counts skipped lines of one or more files.

    Args:
        on_error: ``"raise"`` raises at the first bad line, ``"skip"`` counts it and goes on.
        examples: how many skipped-line messages to keep for the final report.
    """

    on_error: OnError = "raise"
    examples: int = 5
    skipped: int = 0
    messages: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_on_error(self.on_error)

    def bad_line(self, path: str, line: int, reason: str) -> None:
        """Report a malformed line: raises under ``"raise"``, counts it under ``"skip"``."""
        error = DataFormatError(path, line, reason)
        if self.on_error == "raise":
            raise error
        self.skipped += 1
        if len(self.messages) < self.examples:
            self.messages.append(f"{path}:{line}: {reason}")

    def log_summary(self, what: str) -> None:
        """Log how many lines were skipped (nothing when none were)."""
        if self.skipped:
            logger.warning(
                "%s: skipped %d malformed line(s); first ones: %s",
                what,
                self.skipped,
                "; ".join(self.messages),
            )


class DatasetNotFoundError(FileNotFoundError):
    """A real data set a DataModule was pointed at is not there; the message says where to get it.

    Attributes:
        path: the folder or file that is missing or incomplete.
        url: where to download the data set.
    """

    def __init__(self, path: str, what: str | None = None, url: str = "", alternative: str = "") -> None:
        self.path = str(path)
        self.url = url
        self._args = (self.path, what, url, alternative)
        if what is None:  # one message (torch's DataLoader re-raise, unpickling)
            super().__init__(self.path)
            return
        super().__init__(f"{what} Download it from {url} ({alternative})")

    def __reduce__(self) -> tuple:
        return (type(self), self._args)
