"""The typed errors of the publish folder: each names the folder or file and says what to do.

=========================  ===================================================================
error                      raised when
=========================  ===================================================================
DeltaFormatError           an argument or a manifest does not follow the format (bad rows,
                           ids out of range, an unknown row format, a newer format version)
DeltaVerificationError     a file of a version fails its checksum or size, or its tensors do
                           not match the manifest; ``path`` is the file
DeltaNotFoundError         a version (or its folder) is not there, e.g. retention removed it
DeltaChainError            a version cannot be rebuilt: its chain misses or refuses a version
DeltaWriteError            the disk refused a write (full disk, ...); the previous version is
                           still the newest; ``errno`` is the OS error's
DeltaApplyError            a version cannot be applied to a serving artifact (nothing changed)
=========================  ===================================================================
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "DeltaApplyError",
    "DeltaChainError",
    "DeltaError",
    "DeltaFormatError",
    "DeltaNotFoundError",
    "DeltaVerificationError",
    "DeltaWriteError",
]


class DeltaError(Exception):
    """Base of every error about a publish folder."""


class DeltaFormatError(DeltaError, ValueError):
    """Rows, dense weights or a manifest that do not follow the format (the message says which and why)."""


class DeltaVerificationError(DeltaError):
    """A file of a version is corrupt, truncated or inconsistent with its manifest.

    Attributes:
        path: the file (or the version folder when the manifest itself is missing).
        version: the version it belongs to.
    """

    def __init__(self, message: str, path: Path, version: int) -> None:
        super().__init__(message)
        self.path = path
        self.version = version


class DeltaNotFoundError(DeltaError, FileNotFoundError):
    """A version folder that is not (or no longer) in the publish folder."""


class DeltaChainError(DeltaError):
    """A version cannot be rebuilt from its snapshot: a version of its chain is missing or bad."""


class DeltaWriteError(DeltaError):
    """Writing a version failed (the previous newest version is unchanged and still the newest).

    Attributes:
        errno: the ``errno`` of the ``OSError`` behind it (``errno.ENOSPC`` for a full disk), or None.
    """

    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno


class DeltaApplyError(DeltaError):
    """A version could not be applied to a serving artifact; the artifact and its version are unchanged."""
