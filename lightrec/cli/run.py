"""``lightrec run <recipe> [fit|validate|test|predict] [LightningCLI options]``: run a recipe.

Every argument ``run`` does not know goes to the recipe's LightningCLI (``fit`` by default), after
the recipe's default config and the ``--devices`` / ``--accelerator`` / ``--num-nodes`` shortcuts, so
options typed on the command line win. ``--malloc-policy tuned|default`` picks the glibc malloc
thresholds of every rank (``lightrec._malloc_policy``; tuned by default). With ``devices > 1`` Lightning launches the other ranks by
re-running this same command line. A ``.py`` path runs a recipe file (a ``lightrec cp`` copy).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from lightrec._malloc_policy import MALLOC_POLICIES, apply_malloc_policy, choose_malloc_policy
from lightrec.cli.common import FAILURE, CommandError, command_parser, positive_int, recipe_or_file
from lightrec.recipes import RECIPES

__all__ = ["register", "run"]

SUBCOMMANDS = ("fit", "validate", "test", "predict")


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(
        sub,
        "run",
        "run a recipe (other arguments go to its LightningCLI; `fit` by default)",
        add_help=False,  # `lightrec run dlrm --help` shows the recipe's LightningCLI help
    )
    # One line (a usage error is then two: usage and error), naming what the recipe's LightningCLI takes.
    parser.usage = "%(prog)s RECIPE [fit|validate|test|predict] [--devices N] [--num-nodes N] [--accelerator A] [...]"
    parser.add_argument("recipe", help=f"one of: {', '.join(RECIPES)}")
    parser.add_argument("--devices", type=positive_int, help="processes per node (trainer.devices)")
    parser.add_argument("--accelerator", choices=["cpu", "gpu", "cuda", "auto"], help="trainer.accelerator")
    parser.add_argument("--num-nodes", dest="num_nodes", type=positive_int, help="trainer.num_nodes")
    parser.add_argument(
        "--malloc-policy",
        dest="malloc_policy",
        choices=sorted(MALLOC_POLICIES),
        help="glibc malloc thresholds of the ranks (default: $LIGHTREC_MALLOC_POLICY or tuned; docs/switches.md)",
    )
    return parser


def run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    recipe = recipe_or_file(ns.recipe, parser)
    if ns.malloc_policy is not None:  # for the recipe's RecStrategy; the ranks it launches re-run this command line
        choose_malloc_policy(ns.malloc_policy)
    apply_malloc_policy(None)
    args = list(rest)
    subcommand = args.pop(0) if args and args[0] in SUBCOMMANDS else "fit"
    overrides = []
    for flag, value in (("devices", ns.devices), ("accelerator", ns.accelerator), ("num_nodes", ns.num_nodes)):
        if value is not None:
            overrides += [f"--trainer.{flag}", str(value)]
    config, args = config_arguments(args)
    if isinstance(recipe, Path):  # a recipe file: its main() picks its own default config
        module = import_recipe_file(recipe)
    else:
        module = importlib.import_module(recipe.module)
        config = config or ["--config", recipe.default_config]
    # Options given after the recipe name win over the shortcuts, which win over the config(s).
    from lightrec.lightning.recipe.cli import command_prog  # the recipe imported Lightning already

    try:
        with command_prog(f"lightrec run {ns.recipe}"):
            module.main([subcommand, *config, *overrides, *args])
    except SystemExit as exc:  # the recipe's own usage errors (printed already) and exits
        return exc.code if isinstance(exc.code, int) else FAILURE
    return 0


def config_arguments(args: list[str]) -> tuple[list[str], list[str]]:
    """``(the --config / -c arguments, the others)``: configs go first, so options override them."""
    config: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in ("--config", "-c") and i + 1 < len(args):
            config += args[i : i + 2]
            i += 2
            continue
        (config if args[i].startswith(("--config=", "-c=")) else rest).append(args[i])
        i += 1
    return config, rest


def import_recipe_file(path: Path) -> ModuleType:
    """Import a recipe file (``lightrec cp`` copies import lightrec's public modules only)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise CommandError(f"cannot import the recipe file {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(path.stem, module)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "main", None)):
        raise CommandError(f"{str(path)!r} has no main(args) function; a recipe calls run_recipe(...) in main")
    return module
