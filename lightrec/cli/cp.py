"""``lightrec cp <recipe> <dir | file.yaml>``: a recipe and its configs to edit (never overwrites).

The copy imports public lightrec modules only, so ``python <dir>/<recipe>.py fit`` runs anywhere.
"""

from __future__ import annotations

import argparse
import os
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
        _copy(CONFIGS_DIR / f"{recipe.default_config}.yaml", dest)
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
    for source, target in copies:
        _copy(source, target)
        print(f"wrote {target}")
    script = dest / recipe.path.name
    print(f"\nedit, then run:  python {script} fit --config {dest / 'configs' / recipe.default_config}.yaml")
    return 0


def _copy(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` through a temporary file renamed into place, so an interrupted copy
    leaves no half-written file that the next ``lightrec cp`` would refuse to overwrite."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    except OSError as exc:  # a file where a folder should be, no permission, a full disk
        raise CommandError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from exc
    finally:
        if tmp.exists():
            tmp.unlink()
