"""Putting a finished checkpoint folder at its path so that a kill at any instant loses nothing.

A save writes everything into ``<path>.tmp-<run>`` (``manifest.json`` last), then rank 0 runs::

    1. rename <path>            -> <path>.old-<run>      (only if a checkpoint is there)
    2. rename <path>.tmp-<run>  -> <path>
    3. remove <path>.old-<run>

A directory cannot be renamed over a non-empty one, hence two renames; each is atomic, and every
state a kill can leave is resolved the same way by :func:`resolve` (what ``load`` reads) and by
:func:`recover` (what the next save runs first):

====================================  ===========================================================
state after a kill                    the checkpoint is
====================================  ===========================================================
before 1 (tmp incomplete or complete)  ``<path>``, the old one (or none: a first save)
between 1 and 2                        ``<path>.tmp-<run>`` -- complete, its manifest was written
                                       before step 1; ``<path>.old-<run>`` says which tmp it is
between 2 and 3                        ``<path>``, the new one; the ``.old-<run>`` is left over
====================================  ===========================================================

``recover`` finishes an interrupted step 2, then deletes every other ``<path>.tmp-*`` and
``<path>.old-*`` (dead saves' folders). Saves to one path must not run concurrently (Lightning's
``ModelCheckpoint`` never does that).
"""

from __future__ import annotations

import glob
import os
import shutil

from lightrec.distributed.checkpoint.integrity import MANIFEST_FILE

__all__ = ["OLD_MARK", "TMP_MARK", "is_complete", "publish", "recover", "resolve", "temp_folder"]

TMP_MARK = ".tmp-"
OLD_MARK = ".old-"


def temp_folder(path: str, run_id: str) -> str:
    return f"{path.rstrip(os.sep)}{TMP_MARK}{run_id}"


def _old_folder(path: str, run_id: str) -> str:
    return f"{path.rstrip(os.sep)}{OLD_MARK}{run_id}"


def is_complete(folder: str) -> bool:
    """A folder whose save finished writing (its manifest, the last file, is there)."""
    return os.path.isfile(os.path.join(folder, MANIFEST_FILE))


def _sync_dir(folder: str) -> None:
    """Make renames inside ``folder`` durable (a power loss keeps the order of the renames)."""
    fd = os.open(folder or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _interrupted(path: str) -> str | None:
    """The folder an interrupted publish left (``path`` itself missing), or None."""
    if os.path.lexists(path):
        return None
    olds = sorted(
        glob.glob(glob.escape(path.rstrip(os.sep)) + OLD_MARK + "*"), key=os.path.getmtime, reverse=True
    )
    for old in olds:
        run_id = old[len(path.rstrip(os.sep)) + len(OLD_MARK) :]
        tmp = temp_folder(path, run_id)
        if is_complete(tmp):
            return tmp  # killed between the two renames: the new checkpoint is complete
        return old  # killed between the two renames of a save whose folder never completed
    return None


def resolve(path: str | os.PathLike) -> str | None:
    """The folder that holds the checkpoint of ``path``: ``path`` itself, or what an interrupted save left.

    Returns None when there is no checkpoint at all (``path`` missing and nothing to recover).
    """
    path = os.fspath(path)
    if os.path.lexists(path):
        return path
    return _interrupted(path)


def recover(path: str, keep: str | None = None) -> None:
    """Finish an interrupted publish at ``path`` and delete dead saves' folders (except ``keep``)."""
    found = _interrupted(path)
    if found is not None:
        os.replace(found, path)
        _sync_dir(os.path.dirname(path))
    stem = glob.escape(path.rstrip(os.sep))
    for leftover in glob.glob(stem + TMP_MARK + "*") + glob.glob(stem + OLD_MARK + "*"):
        if leftover != keep:
            _remove(leftover)


def publish(tmp: str, path: str, run_id: str) -> None:
    """Move the complete folder ``tmp`` to ``path`` (the module docstring gives the protocol)."""
    parent = os.path.dirname(path.rstrip(os.sep))
    _sync_dir(tmp)
    old = None
    if os.path.lexists(path):
        old = _old_folder(path, run_id)
        os.replace(path, old)
        _sync_dir(parent)
    os.replace(tmp, path)
    _sync_dir(parent)
    if old is not None:
        _remove(old)
