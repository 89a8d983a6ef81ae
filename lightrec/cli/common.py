"""What every ``lightrec`` subcommand shares: exit codes, the command error, recipe lookup."""

from __future__ import annotations

import argparse
from pathlib import Path

from lightrec.lightning.recipe_checks import nearest
from lightrec.recipes import RECIPES, Recipe, get_recipe

__all__ = [
    "FAILURE",
    "USAGE_ERROR",
    "CommandError",
    "positive_int",
    "recipe_or_file",
    "reject_extra_arguments",
    "shipped_recipe",
]

USAGE_ERROR = 2
FAILURE = 1


class CommandError(Exception):
    """A command could not do its job (exit code 1, message printed without a traceback)."""


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
