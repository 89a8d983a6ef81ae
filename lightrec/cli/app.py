"""The ``lightrec`` command: the parser, ``--version`` and the dispatch to one module per subcommand.

::

    lightrec run dlrm                          # the main job: DLRM, synthetic data, 2 CPU ranks
    lightrec run dlrm --devices 1 --trainer.strategy auto --trainer.max_steps 50
    lightrec run two_tower --config two_tower_movielens --data.init_args.data_dir data/ml-1m
    lightrec ls                                # recipes and configs
    lightrec cp dlrm my_dlrm                   # my_dlrm/dlrm.py + my_dlrm/configs/*.yaml to edit
    lightrec plan dlrm --devices 8 --num-nodes 2 --markdown
    lightrec export lightning_logs/dlrm/version_0/checkpoints/last.ckpt
    lightrec consolidate lightning_logs/dlrm/version_0/checkpoints/last.ckpt full.ckpt
    lightrec serve lightning_logs/dlrm/version_0/export/model_int8.pt   # POST http://127.0.0.1:8000/predict
    lightrec data convert day_0.gz --out data/criteo   # Criteo TSV / CSV -> Parquet; `data inspect PATH`

Each subcommand is a module of this package (``run.py``, ``ls.py``, ``cp.py``, ``plan.py``,
``export.py``, ``consolidate.py``, ``serve.py``, ``data.py``) with ``register(subparsers)`` (returning the
subcommand's parser) and ``run(namespace, extra arguments, that parser)``, so a usage error a command finds
reads ``lightrec <command>: error: ...`` under the command's own usage line. Usage errors exit with code 2
and a line naming the valid choices; failures of a command with 1 (``CommandError``, printed without a
traceback); a user mistake the command finds (``UsageError``: a folder that is not a checkpoint, an output
that exists) with 2, also without one.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from lightrec.cli import consolidate, cp, data, export, ls, plan, serve
from lightrec.cli import run as run_command
from lightrec.cli.common import FAILURE, USAGE_ERROR, CommandError, UsageError
from lightrec.recipes import RECIPES

__all__ = ["build_parser", "main"]

COMMANDS = {
    "run": run_command,
    "ls": ls,
    "cp": cp,
    "plan": plan,
    "export": export,
    "consolidate": consolidate,
    "serve": serve,
    "data": data,
}


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The ``lightrec`` parser and its ``run`` subparser (whose help ``lightrec run --help`` prints)."""
    parser, subparsers = _build_parsers()
    return parser, subparsers["run"]


def _build_parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``lightrec`` parser and each subcommand's parser, by command name."""
    parser = argparse.ArgumentParser(
        prog="lightrec",
        description="Run, list, copy and plan lightrec recipes; export and consolidate checkpoints; serve artifacts; "
        "convert and inspect data.",
        epilog="Start with `lightrec ls`, then `lightrec run dlrm`. `lightrec --version` names the versions in use.",
        allow_abbrev=False,
    )
    parser.add_argument("-V", "--version", action="store_true", help="print lightrec's and its dependencies' versions")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    sub.required = True
    subparsers = {name: command.register(sub) for name, command in COMMANDS.items()}
    return parser, subparsers


def version_line() -> str:
    """``lightrec X (torch Y, lightning Z, fbgemm_gpu W)``: what a bug report needs."""
    from importlib.metadata import PackageNotFoundError, version

    from lightrec._version import __version__

    parts = [f"torch {torch.__version__}"]
    for dist in ("lightning", "fbgemm-gpu-cpu", "fbgemm-gpu", "triton"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            continue
    return f"lightrec {__version__} ({', '.join(parts)}; Python {sys.version.split()[0]})"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lightrec`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, subparsers = _build_parsers()
    run_parser = subparsers["run"]
    if not argv:
        parser.print_help()
        return 0
    if argv[0] in ("-V", "--version"):
        print(version_line())
        return 0
    if argv == ["run"]:
        run_parser.error(f"the recipe is missing; valid recipes: {', '.join(RECIPES)}")
    if argv[:1] == ["run"] and argv[1] in ("-h", "--help"):
        run_parser.print_help()
        return 0
    ns, rest = parser.parse_known_args(argv)
    try:
        # The subcommand's own parser: its usage errors read "usage: lightrec cp ..." / "lightrec cp: error: ...",
        # as argparse's own errors of that subcommand do, not the top-level "lightrec: error:".
        return int(COMMANDS[ns.command].run(ns, rest, subparsers[ns.command]))
    except CommandError as exc:
        print(f"lightrec {ns.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR if isinstance(exc, UsageError) else FAILURE
    except BrokenPipeError:  # `lightrec ls | head`: the reader left; stop without a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's exit flush writes nowhere
        return FAILURE
