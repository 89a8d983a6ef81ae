"""Training, validation and test rows of a Parquet source: by file, by partition value or by fraction.

``val`` and ``test`` each take one of:

* ``None`` (the default): no such split. Without ``val`` and ``test`` every row is training data;
* a path, glob or list of them (``"data/day=23/*.parquet"``): those files (read as the source reads
  ``path``; they may lie inside it -- then training leaves them out -- or elsewhere);
* a dict of hive partition values (``{"day": "23"}``, ``{"day": ["22", "23"]}``): the files whose
  partition folders have those values (every key must match; values are compared as strings);
* a fraction (``0.05``): that share of the rows, taken from the end of the data in path order
  (time order when the names are) -- validation before test, both after training -- cut at row
  precision, inside a row group if need be.

Fractions are not mixed with the other two (a fraction of what?); files and partitions mix freely.
A file is in at most one split.

Split paths select among the source's files (those listed when it was made, and agreed on by the ranks),
decided from the names: a file landing later in a ``val`` folder is not in any loader built after it,
and a path that also names files the source does not hold selects the ones it holds
(``ParquetDataModule`` adds its split paths to the source). A following loader (``follow=True``) reads
files that land after the splits were cut: :class:`HeldOut` tells from a file's path whether ``val`` or
``test`` selects it, so that training leaves it out (those files are not added to the validation or test
loaders, which read the files there at the start). A fraction cannot be applied to files that have not
landed yet, so it is refused there.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from lightrec.data.parquet.sharding import Slice, slices_of, take_rows
from lightrec.data.parquet.source import (
    ParquetSource,
    names_file,
    partitions_of,
    resolve_filesystem,
)

__all__ = ["HeldOut", "SplitSetting", "check_follow_splits", "held_out", "split_paths", "split_slices"]

SplitSetting: TypeAlias = float | Mapping[str, str | Sequence[str]] | Sequence[str] | str | None


def split_paths(setting: SplitSetting) -> list[str]:
    """The paths or globs a split setting names (empty for fractions, partitions and None)."""
    if isinstance(setting, str):
        return [setting]
    if isinstance(setting, Sequence) and not isinstance(setting, (str, bytes)):
        return [str(p) for p in setting]
    return []


def _is_fraction(setting: SplitSetting) -> bool:
    return isinstance(setting, (int, float)) and not isinstance(setting, bool)


def _matches(partitions: tuple[tuple[str, str], ...], wanted: Mapping[str, str | Sequence[str]]) -> bool:
    have = dict(partitions)
    for key, values in wanted.items():
        allowed = [values] if isinstance(values, (str, int)) else list(values)
        if key not in have or not any(fnmatch.fnmatchcase(have[key], str(v)) for v in allowed):
            return False
    return True


def _files_of(source: ParquetSource, name: str, setting: SplitSetting) -> set[int]:
    if isinstance(setting, Mapping):
        chosen = {i for i, f in enumerate(source.files) if _matches(f.partitions, setting)}
        if not chosen:
            seen = sorted({p for f in source.files for p in f.partitions})
            marked = (
                f"; only folders holding the marker {source.marker!r} count, so a partition still being written "
                "(not marked yet) is not there: mark it before starting, or hold out a marked one"
                if source.marker is not None else ""
            )
            raise ValueError(
                f"{name}={dict(setting)!r} selects no file: the partition values in the data are {seen[:20]} "
                f"(hive folders key=value){marked}"
            )
        return chosen
    # The source's files that the path names, decided from the names (not listed again: a file that landed
    # since the source was listed -- and agreed on by the ranks -- would otherwise differ between loaders)
    chosen = set()
    for path in split_paths(setting):
        _, inner = resolve_filesystem(path)
        found = {i for i, f in enumerate(source.files) if names_file(inner, f.path)}
        if not found:
            raise ValueError(
                f"{name}={path!r} names no file of the source ({len(source.files)} file(s) under {source.paths}); "
                "give the path to the DataModule (or the source) too, so that it is read"
            )
        chosen |= found
    return chosen


def split_slices(source: ParquetSource, val: SplitSetting = None, test: SplitSetting = None) -> dict[str, list[Slice]]:
    """``{"train": slices, "val": slices, "test": slices}`` of ``source`` (module docstring).

    Raises:
        ValueError: a setting selects nothing, fractions are out of range or mixed with files, or a file is
            in two splits.
    """
    settings = {"val": val, "test": test}
    fractions = {k: v for k, v in settings.items() if _is_fraction(v)}
    if fractions:
        others = [k for k, v in settings.items() if v is not None and k not in fractions]
        if others:
            raise ValueError(f"{others[0]} is a file or partition split but {sorted(fractions)} a fraction; use one kind")
        v, t = float(fractions.get("val", 0.0)), float(fractions.get("test", 0.0))  # type: ignore[arg-type]
        if not (0 <= v and 0 <= t and v + t < 1):
            raise ValueError(f"val and test fractions must be >= 0 and sum to < 1, got val={v!r}, test={t!r}")
        stream, n = slices_of(source.files), source.rows
        a, b = round(n * (1 - v - t)), round(n * (1 - t))
        return {"train": take_rows(stream, 0, a), "val": take_rows(stream, a, b), "test": take_rows(stream, b, n)}
    chosen = {k: _files_of(source, k, v) if v is not None else set() for k, v in settings.items()}
    both = chosen["val"] & chosen["test"]
    if both:
        raise ValueError(f"files are in both val and test: {[source.files[i].path for i in sorted(both)][:3]}")
    train = [i for i in range(len(source.files)) if i not in chosen["val"] | chosen["test"]]
    if not train:
        raise ValueError("val and test take every file: no training data is left")
    return {
        "train": slices_of(source.files, train),
        "val": slices_of(source.files, sorted(chosen["val"])),
        "test": slices_of(source.files, sorted(chosen["test"])),
    }


@dataclass(frozen=True)
class HeldOut:
    """Which files ``val`` and ``test`` select, told from a file's path alone (module docstring).

    Called with a file's path inside the source's filesystem: True for validation or test data.

    Args:
        partitions: the partition-value selections (a file matching any of them is held out).
        paths: the path and glob selections, as paths inside the source's filesystem.
    """

    partitions: tuple[Mapping[str, str | Sequence[str]], ...] = ()
    paths: tuple[str, ...] = ()

    def __call__(self, path: str) -> bool:
        if any(_matches(partitions_of(path), wanted) for wanted in self.partitions):
            return True
        return any(names_file(selection, path) for selection in self.paths)


def check_follow_splits(val: SplitSetting = None, test: SplitSetting = None) -> None:
    """Raise ``ValueError`` when ``val`` or ``test`` is a fraction, which a followed folder cannot take.

    The fraction is cut from the end of the rows, and a followed folder keeps growing: which files
    would be validation data changes with every file that lands (and training has read them by then).
    """
    for name, setting in (("val", val), ("test", test)):
        if _is_fraction(setting):
            raise ValueError(
                f"follow=True cannot take {name}={setting!r}: a fraction of the rows is cut from the end of the data, "
                f"and a followed folder keeps growing. Select the {name} files by path or partition values instead "
                f"({name}='logs/day=2024-01-07/' or {name}={{'day': '2024-01-07'}}), or drop follow"
            )


def held_out(val: SplitSetting = None, test: SplitSetting = None, *, check: bool = True) -> HeldOut:
    """The :class:`HeldOut` of ``val`` and ``test``: what a following loader leaves out of training.

    Args:
        val / test: the split settings.
        check: refuse fractions (:func:`check_follow_splits`); False where the caller refused them
            already (``ParquetDataModule`` does when it is made), so they are not checked twice. A
            fraction selects no file here.

    Raises:
        ValueError: a split is a fraction (:func:`check_follow_splits`), with ``check``.
    """
    if check:
        check_follow_splits(val, test)
    partitions = tuple(s for s in (val, test) if isinstance(s, Mapping))
    paths = tuple(resolve_filesystem(p)[1] for s in (val, test) for p in split_paths(s))
    return HeldOut(partitions, paths)
