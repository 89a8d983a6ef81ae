"""The sizes a following loader's position keeps of the files it names, and their check on resume.

A following loader (:mod:`lightrec.data.parquet.follow`) knows its files by their paths. Its position
(:class:`~lightrec.data.parquet.state.LoaderPosition`) therefore keeps, in its ``fingerprint``, the sizes
of the files its round and carried rows are in -- ``"sizes:<bytes>,<bytes>,..."`` in :func:`named_files`
order -- and a resume refuses a position whose files have another size now (replaced at their path since
the checkpoint), or whose carried rows the file there no longer has, with a
:class:`~lightrec.data.parquet.state.ResumeMismatchError` naming the file, instead of reading the new
file's rows from the old one's position. A position written before sizes were kept (fingerprint ``""``)
is checked for its carried rows only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lightrec.data.parquet.source import ParquetFileInfo
from lightrec.data.parquet.state import FollowState, LoaderPosition, ResumeMismatchError

__all__ = ["check_named_files", "named_files", "sizes_fingerprint"]

_SIZES = "sizes:"  # the start of a following position's fingerprint: the sizes of the files it names


def named_files(state: FollowState) -> list[str]:
    """The files a following position reads from: its round's, then its carried rows', each once, in that order."""
    return list(dict.fromkeys([*state["round"], *(str(c[0]) for c in state["carry"])]))


def sizes_fingerprint(files: Iterable[ParquetFileInfo]) -> str:
    """The fingerprint of a position naming ``files`` (in :func:`named_files` order): their sizes."""
    return _SIZES + ",".join(str(f.size) for f in files)


def check_named_files(resume: LoaderPosition, named: list[str], files: Sequence[ParquetFileInfo]) -> None:
    """Refuse a position whose files are not the files it counted rows of: a file replaced at its path since
    the checkpoint would be read from the old file's row on (rows skipped or read twice), or its carried rows
    would not exist.

    Args:
        resume: the position being resumed (a following loader's).
        named: :func:`named_files` of its state.
        files: the files at those paths now, aligned with ``named``.

    Raises:
        ResumeMismatchError: a named file has another size than the position kept (positions written before
            sizes were kept have none to compare), or a carried slice lies outside the file's row groups.
    """
    sizes = _sizes_in(resume.fingerprint)
    if sizes is not None and len(sizes) != len(named):
        raise ResumeMismatchError(
            f"the checkpoint's data position names {len(named)} file(s) but keeps {len(sizes)} size(s) "
            f"({resume.fingerprint!r}): it was not written by this loader, or was edited; resume from a checkpoint "
            "as it was written, or start a new run"
        )
    fix = (
        "Put back the file the checkpoint read, or start a new run; publish new data under new file names "
        "(write hidden, then rename), never over a file the run has read"
    )
    by_path = dict(zip(named, files, strict=True))
    for path, size in zip(named, sizes or []):
        now = by_path[path].size
        if now != size:
            raise ResumeMismatchError(
                f"the checkpoint's data position counts rows of {path}, {size} bytes then but {now} bytes now: the "
                "file was replaced or rewritten at its path since, and resuming would read its rows from the old "
                f"file's position (rows skipped or read twice). {fix}"
            )
    for path, group, lo, hi in _carry_of(resume):
        rows = by_path[path].row_groups
        if not (0 <= group < len(rows) and 0 <= lo < hi <= rows[group]):
            have = f"{rows[group]} rows" if 0 <= group < len(rows) else f"{len(rows)} row group(s)"
            raise ResumeMismatchError(
                f"the checkpoint's data position carries rows {lo}-{hi} of row group {group} of {path} to the next "
                f"round, but the file there now has {have}: it was replaced or rewritten since. {fix}"
            )


def _carry_of(position: LoaderPosition) -> list[tuple[str, int, int, int]]:
    """A following position's carried rows as ``(path, row_group, lo, hi)``."""
    carry = position.follow["carry"] if position.follow is not None else []
    return [(str(p), int(g), int(lo), int(hi)) for p, g, lo, hi in carry]


def _sizes_in(fingerprint: str) -> list[int] | None:
    """The file sizes a following position's ``fingerprint`` keeps; None for one that keeps none (a position
    written before sizes were kept: ``""``)."""
    if not fingerprint.startswith(_SIZES):
        return None
    body = fingerprint[len(_SIZES) :]
    try:
        return [int(x) for x in body.split(",")] if body else []
    except ValueError:
        raise ResumeMismatchError(
            f"the checkpoint's data position has the fingerprint {fingerprint!r}, which is not a list of file sizes: "
            "it was not written by a following loader, or was edited; resume from a checkpoint as it was written"
        ) from None
