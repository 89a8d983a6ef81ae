"""Refuse ``torch.export`` archives (``.pt2``) that would run pickled code when loaded.

``torch.export.load`` unpickles with ``weights_only=False`` wherever an archive asks it to (torch 2.13,
``torch/export/pt2_archive/_package.py``): a weight or tensor constant whose config entry says
``"use_pickle": true``, a custom (``custom_obj_*``, TorchScript pickle) or opaque (``opaque_obj_*``,
``pickle.loads``) constant, the legacy whole-file weights/constants (``data/weights/<model>.pt``), and
sample inputs that ``weights_only=True`` refuses (it retries them with ``weights_only=False``). An
AOTInductor folder (``data/aotinductor/``) is a shared library it ``dlopen``s, and entries outside
the archive's one root folder can reach the pre-2.7 zip format, read the same way.

lightrec's exports contain none of these: every weight and constant is a raw tensor
(``use_pickle: false``, ``tensor_*`` constants) and the sample inputs are plain tensors.
:func:`check_export_archive` reads only the archive's JSON configs and loads the sample inputs with
``weights_only=True`` before torch touches the file; anything else raises
:class:`UnsafeArtifactError` naming the file and the entry.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import zipfile
from typing import IO

import torch

__all__ = ["UnsafeArtifactError", "check_export_archive"]

_FIX = "re-export the model with lightrec.inference.export(..., format=\"export\") (or `lightrec export --format export`)"
_MODEL = re.compile(r"models/([^/]+)\.json")


class UnsafeArtifactError(RuntimeError):
    """A serving artifact asks its loader to run code (unpickle objects, load a shared library).

    Args:
        message: the file, the entry and the fix.
        path: the artifact.
        entry: the archive entry (or config key) that was refused.
    """

    def __init__(self, message: str, path: str = "", entry: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.entry = entry

    def __reduce__(self) -> tuple[object, ...]:  # keep the fields across processes
        return (type(self), (str(self), self.path, self.entry))


def _refuse(path: str, entry: str, why: str) -> UnsafeArtifactError:
    return UnsafeArtifactError(
        f"{path!r} was not loaded: archive entry {entry!r} {why}; lightrec loads torch.export artifacts only "
        f"when nothing in them is unpickled with weights_only=False. If the file is yours, {_FIX}",
        path, entry)


def _read(archive: zipfile.ZipFile, root: str, name: str, path: str) -> bytes:
    try:
        return archive.read(root + name)
    except KeyError:
        raise _refuse(path, name, "is missing (not an archive torch.export.save writes)") from None


def _payload_config(archive: zipfile.ZipFile, root: str, name: str, path: str) -> dict[str, object]:
    try:
        config = json.loads(_read(archive, root, name, path))["config"]
    except (ValueError, KeyError, TypeError) as exc:
        raise _refuse(path, name, f"is not a readable payload config ({type(exc).__name__})") from exc
    if not isinstance(config, dict):
        raise _refuse(path, name, "is not a readable payload config (\"config\" is not an object)")
    return config


def _check_payloads(archive: zipfile.ZipFile, root: str, name: str, path: str, constants: bool) -> None:
    for fqn, meta in _payload_config(archive, root, name, path).items():
        entry = f"{name}: {fqn}"
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            # torch.load(..., weights_only=False) on the payload: code the file names would run.
            raise _refuse(path, entry, "is stored as a pickle (\"use_pickle\" is not false)")
        if constants and not str(meta.get("path_name", "")).startswith("tensor_"):
            # custom_obj_* (TorchScript pickle) and opaque_obj_* (pickle.loads) are objects, not tensors.
            raise _refuse(path, entry, f"is a custom or opaque object ({meta.get('path_name')!r}), not a tensor")


def _check_sample_inputs(archive: zipfile.ZipFile, root: str, name: str, path: str) -> None:
    if root + name not in archive.namelist():
        return  # torch reads a missing sample-inputs entry as an error of its own, before any unpickling
    data = archive.read(root + name)
    if not data:
        return  # torch reads empty sample inputs as {} without unpickling
    try:
        # torch retries sample inputs that weights_only=True refuses with weights_only=False; refuse
        # them here instead. Same bytes, same unpickler: what passes here passes torch's first try.
        torch.load(io.BytesIO(data), weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        raise _refuse(path, name, f"holds objects weights_only=True refuses ({type(exc).__name__})") from exc


def check_export_archive(file: IO[bytes], path: str) -> None:
    """Raise :class:`UnsafeArtifactError` unless ``file`` (a ``torch.export.save`` archive) loads without
    unpickling anything with ``weights_only=False`` or loading native code.

    Args:
        file: the open archive (seekable; left at its start). Load from this same handle so the file
            checked is the file loaded.
        path: the artifact's name, for messages.
    """
    try:
        archive = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UnsafeArtifactError(
            f"{path!r} is not a torch.export archive (not a zip file: {exc}); {_FIX}", path, "") from exc
    with archive:
        names = archive.namelist()
        if not names:
            raise _refuse(path, "", "list is empty (not an archive torch.export.save writes)")
        # torch reads every record under the first entry's folder; anything else is only reachable
        # by its fallback to the pre-2.7 format (torch.load with a weights_only=False retry).
        root = names[0].split("/", 1)[0] + "/"
        for name in names:
            if not name.startswith(root):
                raise _refuse(path, name, f"lies outside the archive's root folder {root!r}")
        inner = [name[len(root):] for name in names]
        for name in inner:
            if name.startswith("data/aotinductor/"):
                raise _refuse(path, name, "is an AOTInductor package (native code torch would load)")
        models = [m.group(1) for m in map(_MODEL.fullmatch, inner) if m]
        if not models:
            raise _refuse(path, "models/", "holds no program (not an archive torch.export.save writes)")
        for model in models:
            for legacy in (f"data/weights/{model}.pt", f"data/constants/{model}.pt"):
                if legacy in inner:  # the legacy whole-file format torch unpickles with a weights_only=False retry
                    raise _refuse(path, legacy, "is a legacy pickled state file")
            _check_payloads(archive, root, f"data/weights/{model}_weights_config.json", path, constants=False)
            _check_payloads(archive, root, f"data/constants/{model}_constants_config.json", path, constants=True)
            _check_sample_inputs(archive, root, f"data/sample_inputs/{model}.pt", path)
    file.seek(0)


def open_checked(path: str | os.PathLike) -> IO[bytes]:
    """Open ``path``, check it with :func:`check_export_archive` and return the handle at its start."""
    file = open(path, "rb")  # noqa: SIM115 -- the caller loads from (and closes) this handle
    try:
        check_export_archive(file, os.fspath(path))
    except BaseException:
        file.close()
        raise
    return file
