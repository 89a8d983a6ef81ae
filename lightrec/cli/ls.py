"""``lightrec ls``: the recipes ``lightrec run`` knows and every shipped config."""

from __future__ import annotations

import argparse

from lightrec.cli.common import command_parser, reject_extra_arguments
from lightrec.recipes import CONFIGS, CONFIGS_DIR, RECIPES, config_summary

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return command_parser(sub, "ls", "list recipes and configs")


def run(ns: argparse.Namespace, rest: list[str], parser: argparse.ArgumentParser) -> int:
    reject_extra_arguments(rest, parser)
    print("recipes (lightrec run <recipe>):")
    width = max(map(len, RECIPES))
    for r in RECIPES.values():
        print(f"  {r.name:<{width}}  {r.description}  [{r.script}.py, default config {r.default_config}]")
    print(f"\nconfigs (lightrec run <recipe> --config <config>; files in {CONFIGS_DIR}):")
    width = max(map(len, CONFIGS))
    for name, script in CONFIGS.items():
        print(f"  {name:<{width}}  ({script}.py)  {config_summary(name)}")
    return 0
