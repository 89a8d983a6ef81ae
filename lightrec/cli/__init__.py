"""The ``lightrec`` console script: ``lightrec run|ls|cp|plan|export|consolidate|serve``, one module each.

``main`` (the entry point ``pyproject.toml`` names, also ``python -m lightrec.cli``) is in
:mod:`lightrec.cli.app`, with the parser; see its docstring for the commands.
"""

from lightrec.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
