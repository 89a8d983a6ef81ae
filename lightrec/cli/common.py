"""What every ``lightrec`` subcommand shares: exit codes, the command error, recipe lookup.

Imports no Lightning, nor does any subcommand module at import time: ``lightrec --help``, ``ls`` and
``serve`` (whose LitServe workers import the command again) build the whole parser, so Lightning, the
recipes' scripts and the data stack (pyarrow) are imported inside the functions that use them
(``tests/cli/test_review_lazy_imports.py``). ``lightrec.recipes`` is names and paths only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lightrec._suggest import nearest
from lightrec.recipes import RECIPES, Recipe, get_recipe

__all__ = [
    "FAILURE",
    "USAGE_ERROR",
    "CommandError",
    "UsageError",
    "checkpoint_argument",
    "command_parser",
    "positive_int",
    "recipe_or_file",
    "reject_extra_arguments",
    "output_argument",
    "shipped_recipe",
]

USAGE_ERROR = 2
FAILURE = 1


class CommandError(Exception):
    """A command could not do its job (exit code 1, message printed without a traceback)."""


class UsageError(CommandError):
    """The user asked for something that cannot work: a path that is not a checkpoint, an output that
    exists (exit code 2, like an argument error, message printed without a traceback)."""


def command_parser(
    sub: argparse._SubParsersAction, name: str, help: str, add_help: bool = True
) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``, as every command makes it: abbreviations off, so a long option
    a later release adds never changes what an abbreviated one meant (``add_help`` as argparse's)."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, allow_abbrev=False, add_help=add_help)
    return parser


def checkpoint_argument(path: Path) -> None:
    """Refuse (``UsageError``) a checkpoint argument that is missing or a folder that is not a checkpoint, and
    (``CommandError``) a checkpoint folder whose ``meta.pt`` is gone. A save killed between its two renames
    (``<path>`` missing, a complete ``<path>.tmp-<run>`` beside it) is accepted, as the loader reads it."""
    from lightrec.distributed.checkpoint import is_sharded_checkpoint  # the distributed stack: only here

    if is_sharded_checkpoint(path):  # also <path> gone beside the complete <path>.tmp-<run> of a killed save
        return
    if not path.exists():
        raise UsageError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir() and (path / "manifest.json").is_file():
        raise CommandError(
            f"{str(path)!r} holds a manifest.json but no meta.pt: the checkpoint is incomplete (a file was deleted "
            "or not copied); copy the whole folder again, or use another checkpoint"
        )
    if path.is_dir():
        raise UsageError(
            f"{str(path)!r} is a folder but not a lightrec sharded checkpoint (it holds no meta.pt and no "
            "manifest.json); pass the checkpoint folder itself, e.g. lightning_logs/<name>/version_0/checkpoints/"
            "last.ckpt"
        )


def output_argument(out: Path, force: bool, example: str = "full.ckpt") -> None:
    """Refuse (``UsageError``) an output path that exists (without ``--force``), is a folder, or has no folder
    (``example``: a file name the message suggests inside a folder given instead of a file)."""
    if out.is_dir():
        raise UsageError(f"{str(out)!r} is a folder; give the file to write, e.g. {str(out / example)!r}")
    if out.exists() and not force:
        raise UsageError(f"{str(out)!r} exists; pass --force to replace it")
    if not out.parent.is_dir():
        raise UsageError(f"the folder of {str(out)!r} does not exist; create it first")


def shipped_recipe(name: str, parser: argparse.ArgumentParser, or_file: bool = False) -> Recipe:
    """The shipped recipe called ``name``; else a usage error naming the valid ones (and, with
    ``or_file``, saying a recipe ``.py`` file is accepted too)."""
    if name not in RECIPES:
        parser.error(
            f"unknown recipe {name!r}{nearest(name, list(RECIPES))}; valid recipes: {', '.join(RECIPES)}"
            + (" or a recipe .py file" if or_file else "")
        )
    return get_recipe(name)


def recipe_or_file(name: str, parser: argparse.ArgumentParser) -> Recipe | Path:
    """The recipe called ``name``, or the recipe ``.py`` file it names; else a usage error."""
    if name.endswith(".py"):
        if not Path(name).is_file():
            parser.error(f"recipe file {name!r} does not exist")
        return Path(name)
    return shipped_recipe(name, parser, or_file=True)


def reject_extra_arguments(rest: list[str], parser: argparse.ArgumentParser) -> None:
    """Usage error for arguments a subcommand does not take."""
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")


def positive_int(value: str) -> int:
    """``argparse`` type of counts (devices, nodes)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return number
