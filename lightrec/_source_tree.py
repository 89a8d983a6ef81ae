"""``lightrec.recipes`` when lightrec is imported straight from a source checkout.

The recipes live in the checkout's top-level ``recipes/`` folder. A wheel, and ``pip install -e .``,
install that folder as the package ``lightrec.recipes`` (``package-dir`` in ``pyproject.toml``), so
``lightrec run``, ``python -m lightrec.recipes.dlrm`` and checkpoints naming
``lightrec.recipes.dlrm.DLRMModule`` work. A process that imports lightrec from a checkout without
installing it (``PYTHONPATH=.``, or ``python recipes/dlrm.py`` run inside the checkout) has no such
mapping; :func:`install` (run by ``import lightrec``) adds a finder that answers for that one name
with the checkout's folder. It answers only when lightrec itself comes from a checkout -- the
package has no ``recipes`` subpackage and ``recipes/__init__.py`` stands next to it, beside a
``pyproject.toml`` -- so it never shadows an installed ``lightrec.recipes``. It goes first in
``sys.meta_path``: an editable install of *another* checkout (whose finder maps the name to that
checkout's folder) must not hand this process someone else's recipes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

__all__ = ["checkout_recipes_dir", "install"]

_PACKAGE = Path(__file__).resolve().parent
_NAME = "lightrec.recipes"


def checkout_recipes_dir() -> Path | None:
    """The checkout's ``recipes/`` folder when lightrec is imported from a checkout, else None."""
    root = _PACKAGE.parent
    if (_PACKAGE / "recipes" / "__init__.py").is_file():
        return None  # installed: the wheel (or an old layout) holds lightrec/recipes itself
    if (root / "recipes" / "__init__.py").is_file() and (root / "pyproject.toml").is_file():
        return root / "recipes"
    return None


class _CheckoutRecipesFinder(importlib.abc.MetaPathFinder):
    """Finds ``lightrec.recipes`` in the checkout's ``recipes/`` folder (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _NAME:
            return None
        return importlib.util.spec_from_file_location(
            _NAME, self.folder / "__init__.py", submodule_search_locations=[str(self.folder)]
        )


def install() -> None:
    """Make ``lightrec.recipes`` importable from a checkout (idempotent; nothing when installed)."""
    folder = checkout_recipes_dir()
    if folder is None or any(isinstance(f, _CheckoutRecipesFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _CheckoutRecipesFinder(folder))
