"""Where ``lightrec export`` finds the ``RecModule`` class that wrote a checkpoint (entry ``lightrec_module``)."""

from __future__ import annotations

import importlib.machinery
import os
import sys

__all__ = ["class_reference"]


def class_reference(cls: type) -> str:
    """``"package.module.Class"``, or ``"/abs/path/recipe.py:Class"`` for a class of a script run as a file
    (``python recipe.py``) or imported from a file that its module name does not import (``lightrec run
    my_dlrm/dlrm.py`` names the module ``dlrm``, which ``lightrec export`` could not import)."""
    module = cls.__module__
    loaded = sys.modules.get(module)
    if module == "__main__":
        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        if spec is None or not spec.name:
            return f"{os.path.abspath(str(main.__file__))}:{cls.__qualname__}"
        module = spec.name
    elif loaded is not None and loaded.__file__ is not None and not _imported_by_name(module, loaded.__file__):
        return f"{os.path.abspath(loaded.__file__)}:{cls.__qualname__}"
    return f"{module}.{cls.__qualname__}"


def _imported_by_name(module: str, file: str) -> bool:
    """Whether ``import module`` in a fresh process finds ``file``: a top-level module loaded from a file
    (``importlib.util.spec_from_file_location``) is found on ``sys.path`` only if the file lies there. A
    module of a package is taken as importable (its package was imported by name)."""
    if "." in module:
        return True
    spec = importlib.machinery.PathFinder.find_spec(module)  # sys.path only, not sys.modules
    if spec is None or spec.origin is None or not os.path.exists(spec.origin):
        return False
    return os.path.samefile(spec.origin, file)
