"""``lightrec cp <recipe> <dir | file.yaml>``: a recipe and its configs to edit (never overwrites).

The copy imports public lightrec modules only, so ``python <dir>/<recipe>.py fit`` runs anywhere. The
files are written all or nothing: a copy that fails half-way (a full disk, no permission) removes what it
had written and the folders it had made, and never touches a file that was there before.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import secrets
import shutil
from pathlib import Path

from lightrec.cli.common import (
    CommandError,
    UsageError,
    command_parser,
    reject_extra_arguments,
    shipped_recipe,
)
from lightrec.recipes import CONFIGS_DIR, RECIPES, configs_of

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(sub, "cp", "copy a recipe and its configs into a directory to edit")
    parser.add_argument("recipe", help=f"one of: {', '.join(RECIPES)}")
    parser.add_argument(
        "dir",
        help="destination directory, or a .yaml file for the recipe's default config alone "
        "(existing files are never overwritten)",
    )
    return parser


def run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    reject_extra_arguments(rest, parser)
    recipe = shipped_recipe(ns.recipe, parser)
    dest = Path(ns.dir)
    if dest.suffix in (".yaml", ".yml"):  # one config to edit, not a folder named x.yaml
        if dest.exists():
            raise UsageError(f"refusing to overwrite {str(dest)!r}; choose another name or remove it first")
        if dest.parent.exists() and not dest.parent.is_dir():
            raise UsageError(
                f"{str(dest.parent)!r} is a file, not a folder; choose another place for {dest.name}"
            )
        # All or nothing like a recipe copy: a missing folder is made, and removed again on failure.
        _copy_all([(CONFIGS_DIR / f"{recipe.default_config}.yaml", dest)], dest.parent)
        print(f"wrote {dest} (the {recipe.name} recipe's default config)")
        print(f"\nedit, then run:  lightrec run {recipe.name} --config {dest}")
        return 0
    if dest.exists() and not dest.is_dir():
        raise UsageError(
            f"{str(dest)!r} is a file; give a directory to copy the {recipe.name} recipe into (e.g. my_{recipe.name}), "
            "or a .yaml file for its default config alone"
        )
    copies = [(recipe.path, dest / recipe.path.name)]
    copies += [(CONFIGS_DIR / f"{c}.yaml", dest / "configs" / f"{c}.yaml") for c in configs_of(recipe.script)]
    existing = [str(target) for _, target in copies if target.exists()]
    if existing:
        raise UsageError(
            f"refusing to overwrite {', '.join(existing)}; choose another directory or remove them first"
        )
    _copy_all(copies, dest)
    for _, target in copies:
        print(f"wrote {target}")
    script = dest / recipe.path.name
    print(f"\nedit, then run:  python {script} fit --config {dest / 'configs' / recipe.default_config}.yaml")
    return 0


def _copy_all(copies: list[tuple[Path, Path]], dest: Path) -> None:
    """Copy every ``(source, target)`` (``target`` inside ``dest``), all or nothing.

    The files are first copied into a staging folder, then:

    * ``dest`` does not exist: the staging folder, made beside it (in ``dest``'s parent), is renamed
      to ``dest`` -- one atomic step;
    * ``dest`` exists: the staging folder is made inside it (``dest``'s parent may be a folder the user
      cannot write, e.g. for ``lightrec cp dlrm .``) and each file is moved into place without replacing
      anything (a hard link where the file system has them, else a rename after a check).

    On any failure every file and folder this call created is removed again (the folders only when
    empty) and a ``CommandError`` names the file that could not be written; a file the user already had
    is never touched. A killed process can leave at most the hidden staging folder (``.<dest>.cp-...``).
    """
    created: list[Path] = []  # folders made for dest (outermost first), removed on failure if empty
    placed: list[Path] = []  # files moved into an existing dest, removed on failure
    staging: Path | None = None
    current, placing = dest, False  # what is being written, for the message
    try:
        exists = dest.is_dir()
        if not exists:
            created += _make_folders(dest.parent)
        staging = root = _staging_folder(dest if exists else dest.parent, dest.name)
        for source, target in copies:
            current = target
            staged = root / target.relative_to(dest)
            staged.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, staged)
        current = dest
        if not exists:
            try:
                os.rename(staging, dest)  # atomic: the whole copy appears at once
                staging = None
                return
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                # dest appeared meanwhile (another process): move the files into it one by one
        placing = True
        for _, target in copies:
            current = target
            created += _make_folders(target.parent)
            _place_new(root / target.relative_to(dest), target)
            placed.append(target)
    except BaseException as exc:  # also Ctrl+C: undo, then report
        for path in reversed(placed):
            with contextlib.suppress(OSError):
                path.unlink()
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
            staging = None
        _remove_empty_folders(created)
        if placing and isinstance(exc, FileExistsError):
            raise UsageError(
                f"refusing to overwrite {str(current)!r} (it appeared while copying); nothing was written"
            ) from exc
        if isinstance(exc, OSError):  # a file where a folder should be, no permission, a full disk
            raise CommandError(
                f"cannot write {str(current)!r}: {exc.strerror or exc}; nothing was written"
            ) from exc
        raise
    finally:
        if staging is not None:  # after a copy into an existing dest: the staged names (the files are linked in place)
            shutil.rmtree(staging, ignore_errors=True)


def _make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; the folders created, outermost first."""
    missing = []
    for path in (folder, *folder.parents):
        if path.exists() or path.is_symlink():  # an existing path; a file there fails in mkdir below
            break
        missing.append(path)
    created = []
    try:
        for path in reversed(missing):
            path.mkdir()
            created.append(path)
    except OSError:
        _remove_empty_folders(created)
        raise
    if not folder.is_dir():  # e.g. an existing file where the folder should be
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
    return created


def _remove_empty_folders(created: list[Path]) -> None:
    """Remove the folders of ``created`` (outermost first) that are still empty, innermost first."""
    for path in reversed(created):
        with contextlib.suppress(OSError):
            path.rmdir()


def _staging_folder(parent: Path, name: str) -> Path:
    """A new hidden folder in ``parent``, made with the permissions a plain ``mkdir`` gives (``mkdtemp``'s
    0700 would become the copy's own once renamed into place)."""
    while True:
        staging = parent / f".{name or 'lightrec'}.cp-{os.getpid()}-{secrets.token_hex(4)}"  # name "": dest "."
        try:
            staging.mkdir()
            return staging
        except FileExistsError:
            continue


def _place_new(staged: Path, target: Path) -> None:
    """Move ``staged`` to ``target``, never replacing a file there (``FileExistsError`` instead)."""
    try:
        os.link(staged, target)  # fails if target exists: no window in which a file could be replaced
    except FileExistsError:
        raise
    except OSError:  # no hard links on this file system (some FUSE / network / FAT mounts)
        if target.exists() or target.is_symlink():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target)) from None
        os.rename(staged, target)
